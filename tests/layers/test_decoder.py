import numpy as np
import pytest

from keras_transformer.layers import Decoder
from tests.layer_checks import to_numpy, random_array, run_layer_checks

D, FF, H = 8, 16, 2
NORMS = pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])


@NORMS
def test_standard_layer_checks(norm_first):
    run_layer_checks(
        Decoder,
        {"num_layers": 2, "num_heads": H, "ff_dim": FF, "dropout": 0.1, "norm_first": norm_first},
        (random_array(2, 3, D), random_array(2, 5, D, seed=1)),
        expected_output_shape=(2, 3, D),
        expected_num_trainable_weights=2 * 26 + (2 if norm_first else 0),
    )


@NORMS
def test_cached_step_by_step_equals_full_pass(norm_first):
    decoder = Decoder(num_layers=3, num_heads=H, ff_dim=FF, dropout=0.0, norm_first=norm_first)
    x, memory = random_array(2, 5, D), random_array(2, 4, D, seed=1)
    memory_mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], bool)
    full = to_numpy(decoder(x, memory, encoder_padding_mask=memory_mask))
    cache = decoder.initialize_cache(memory, max_length=5)
    assert len(cache[0]) == len(cache[1]) == 3  # one tensor per block
    assert tuple(cache[0][0].shape) == (2, 2, 5, H, D // H)
    assert tuple(cache[1][0].shape) == (2, 2, 4, H, D // H)
    steps = []
    for index in range(5):
        out, cache = decoder(x[:, index:index + 1], None, encoder_padding_mask=memory_mask,
                             cache=cache, cache_index=index)
        steps.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, rtol=1e-5, atol=1e-5)


def test_output_carries_no_keras_mask():
    decoder = Decoder(num_layers=1, num_heads=H, ff_dim=FF)
    assert decoder.compute_mask(random_array(1, 2, D)) is None

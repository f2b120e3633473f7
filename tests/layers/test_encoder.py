import numpy as np
import pytest

from keras_transformer.layers import Encoder, PositionalEmbedding
from tests.layer_checks import (
    assert_functional_model_round_trip,
    assert_symbolic_call_matches_eager,
    random_array,
    run_layer_checks,
    to_numpy,
)

D, FF, H = 8, 16, 2
NORMS = pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])


@NORMS
def test_standard_layer_checks(norm_first):
    run_layer_checks(
        Encoder,
        {"num_layers": 2, "num_heads": H, "ff_dim": FF, "dropout": 0.1, "norm_first": norm_first},
        np.random.default_rng(0).normal(size=(2, 4, D)).astype("float32"),
        expected_output_shape=(2, 4, D),
        expected_num_trainable_weights=2 * 16 + (2 if norm_first else 0),
    )


def test_stack_masks_padding_implicitly_and_returns_per_block_scores():
    ids = np.array([[4, 5, 6, 0], [7, 8, 0, 0]], "int32")
    embedded = PositionalEmbedding(20, D)(ids)
    encoder = Encoder(num_layers=2, num_heads=H, ff_dim=FF, dropout=0.0)
    implicit = encoder(embedded)
    explicit, scores = encoder(embedded, padding_mask=ids != 0, return_attention_scores=True)
    np.testing.assert_allclose(to_numpy(implicit), to_numpy(explicit), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(to_numpy(implicit._keras_mask), ids != 0)
    assert len(scores) == 2 and np.all(to_numpy(scores[1])[1, :, :, 2:] == 0.0)


def test_invalid_num_layers_raises():
    with pytest.raises(ValueError, match="num_layers=0"):
        Encoder(num_layers=0, num_heads=H, ff_dim=FF)


@pytest.mark.parametrize("call_kwargs", [{}, {"return_attention_scores": True}],
                         ids=["plain", "scores"])
def test_symbolic_call_returns_the_eager_structure(call_kwargs):
    encoder = Encoder(num_layers=2, num_heads=H, ff_dim=FF)
    assert_symbolic_call_matches_eager(encoder, random_array(2, 4, D), call_kwargs)


def test_functional_model_outputting_scores_fits_saves_and_reloads(tmp_path):
    outputs, *scores = assert_functional_model_round_trip(
        Encoder,
        {"num_layers": 2, "num_heads": H, "ff_dim": FF},
        random_array(2, 4, D),
        {"return_attention_scores": True},
        tmp_path / "encoder.keras",
    )
    assert outputs.shape == (2, 4, D) and [s.shape for s in scores] == [(2, H, 4, 4)] * 2

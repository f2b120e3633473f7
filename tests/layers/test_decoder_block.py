import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import DecoderBlock, PositionalEmbedding
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
    attention = 4 * (D * D + D)
    run_layer_checks(
        DecoderBlock,
        {"num_heads": H, "ff_dim": FF, "dropout": 0.1, "norm_first": norm_first},
        (random_array(2, 3, D), random_array(2, 5, D, seed=1)),
        expected_output_shape=(2, 3, D),
        expected_num_trainable_weights=8 + 8 + 4 + 6,
        expected_num_params=2 * attention + 2 * D * FF + FF + D + 3 * 2 * D,
    )


@NORMS
def test_changing_a_future_token_leaves_earlier_outputs_unchanged(norm_first):
    block = DecoderBlock(num_heads=H, ff_dim=FF, dropout=0.0, norm_first=norm_first)
    x, memory = random_array(1, 4, D), random_array(1, 5, D, seed=1)
    changed = x.copy()
    changed[:, 2:] += 3.0
    before, after = to_numpy(block(x, memory)), to_numpy(block(changed, memory))
    np.testing.assert_allclose(before[:, :2], after[:, :2], rtol=1e-5, atol=1e-5)
    assert not np.allclose(before[:, 2:], after[:, 2:])


@NORMS
def test_extra_padding_leaves_real_positions_unchanged(norm_first):
    block = DecoderBlock(num_heads=H, ff_dim=FF, dropout=0.0, norm_first=norm_first)
    x, memory = random_array(1, 3, D), random_array(1, 4, D, seed=1)
    reference = to_numpy(block(x, memory, padding_mask=np.ones((1, 3), bool),
                          encoder_padding_mask=np.ones((1, 4), bool)))
    padded_x = np.concatenate([x, random_array(1, 2, D, seed=7)], 1)
    padded_memory = np.concatenate([memory, random_array(1, 3, D, seed=8)], 1)
    padded = to_numpy(block(padded_x, padded_memory,
                       padding_mask=np.array([[1, 1, 1, 0, 0]], bool),
                       encoder_padding_mask=np.array([[1, 1, 1, 1, 0, 0, 0]], bool)))
    np.testing.assert_allclose(padded[:, :3], reference, rtol=1e-5, atol=1e-5)


def test_implicit_keras_masks_equal_explicit_masks():
    embedding = PositionalEmbedding(20, D)
    target = np.array([[1, 5, 6, 0], [1, 7, 0, 0]], "int32")
    source = np.array([[4, 5, 6, 0, 0], [7, 8, 9, 10, 0]], "int32")
    block = DecoderBlock(num_heads=H, ff_dim=FF, dropout=0.0)
    x, memory = embedding(target), embedding(source)
    implicit = to_numpy(block(x, memory))
    explicit = to_numpy(block(x, memory, padding_mask=target != 0, encoder_padding_mask=source != 0))
    unmasked = to_numpy(block(x, memory, padding_mask=np.ones_like(target, bool),
                         encoder_padding_mask=np.ones_like(source, bool)))
    np.testing.assert_allclose(implicit, explicit, rtol=1e-6, atol=1e-6)
    assert not np.allclose(implicit, unmasked, atol=1e-4)


@NORMS
def test_cached_step_by_step_equals_full_pass(norm_first):
    block = DecoderBlock(num_heads=H, ff_dim=FF, dropout=0.0, norm_first=norm_first)
    x, memory = random_array(2, 4, D), random_array(2, 5, D, seed=1)
    memory_mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
    full = to_numpy(block(x, memory, encoder_padding_mask=memory_mask))
    cache = block.initialize_cache(memory, max_length=6)
    outputs = []
    for index in range(4):
        out, cache = block(x[:, index:index + 1], None, encoder_padding_mask=memory_mask,
                           cache=cache, cache_index=index)
        outputs.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(outputs, 1), full, rtol=1e-5, atol=1e-5)


def test_scores_dict_and_arity():
    block = DecoderBlock(num_heads=H, ff_dim=FF)
    x, memory = random_array(2, 3, D), random_array(2, 5, D, seed=1)
    assert not isinstance(block(x, memory), tuple)
    _, scores = block(x, memory, return_attention_scores=True)
    assert tuple(scores["self_attention"].shape) == (2, H, 3, 3)
    assert tuple(scores["cross_attention"].shape) == (2, H, 3, 5)
    cache = block.initialize_cache(memory, max_length=3)
    assert len(block(x[:, :1], None, cache=cache, cache_index=0)) == 2
    with pytest.raises(ValueError, match="encoder_outputs"):
        block(x)
    with pytest.raises(ValueError, match="cache_index"):
        block(x[:, :1], None, cache=cache)
    with pytest.raises(ValueError, match="initialize_cache"):  # a cache without its mask
        block(x[:, :1], None, cache=cache[:2], cache_index=0)


@pytest.mark.parametrize(
    "cached, return_attention_scores",
    [(False, False), (False, True), (True, False), (True, True)],
    ids=["plain", "scores", "cache", "cache_scores"],
)
def test_symbolic_call_returns_the_eager_structure(cached, return_attention_scores):
    block = DecoderBlock(num_heads=H, ff_dim=FF)
    x, memory = random_array(2, 3, D), random_array(2, 5, D, seed=1)
    block(x, memory)  # build
    call_kwargs = {"return_attention_scores": return_attention_scores}
    if cached:
        call_kwargs.update(encoder_outputs=None, cache=block.initialize_cache(memory, 4),
                           cache_index=1)
        inputs = x[:, :1]
    else:
        inputs = (x, memory)
    assert_symbolic_call_matches_eager(block, inputs, call_kwargs)


@pytest.mark.slow
@NORMS
def test_functional_model_outputting_scores_fits_saves_and_reloads(tmp_path, norm_first):
    outputs, cross, self_scores = assert_functional_model_round_trip(
        DecoderBlock,
        {"num_heads": H, "ff_dim": FF, "norm_first": norm_first},
        (random_array(2, 3, D), random_array(2, 5, D, seed=1)),
        {"return_attention_scores": True},
        tmp_path / "block.keras",
    )
    assert outputs.shape == (2, 3, D)
    assert cross.shape == (2, H, 3, 5) and self_scores.shape == (2, H, 3, 3)


@NORMS
def test_cache_carries_the_memory_padding_mask(norm_first):
    """Cached steps with no `encoder_padding_mask` argument still hide padded source positions."""
    source = np.array([[4, 5, 6, 7, 8], [9, 10, 0, 0, 0], [11, 12, 13, 0, 0]], "int32")
    memory = PositionalEmbedding(20, D)(source)  # carries the Keras mask of the padding
    block = DecoderBlock(num_heads=H, ff_dim=FF, dropout=0.0, norm_first=norm_first)
    x = random_array(3, 4, D)
    full = to_numpy(block(x, memory))
    leaked = to_numpy(block(x, ops.convert_to_tensor(to_numpy(memory))))  # no mask at all
    assert not np.allclose(full, leaked, atol=1e-4)  # padding matters for this input
    cache = block.initialize_cache(memory, max_length=4)
    steps = []
    for index in range(4):
        out, cache = block(x[:, index:index + 1], None, cache=cache, cache_index=index)
        steps.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, rtol=1e-5, atol=1e-5)

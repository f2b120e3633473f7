import numpy as np
import pytest

from keras_transformer.layers import EncoderBlock, PositionalEmbedding
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
    feed_forward = 2 * D * FF + FF + D
    run_layer_checks(
        EncoderBlock,
        {"num_heads": H, "ff_dim": FF, "dropout": 0.1, "norm_first": norm_first},
        random_array(2, 4, D),
        expected_output_shape=(2, 4, D),
        expected_num_trainable_weights=8 + 4 + 4,
        expected_num_params=attention + feed_forward + 2 * 2 * D,
    )


@NORMS
def test_extra_padding_leaves_real_positions_unchanged(norm_first):
    block = EncoderBlock(num_heads=H, ff_dim=FF, dropout=0.0, norm_first=norm_first)
    x = random_array(1, 3, D)
    padded = np.concatenate([x, random_array(1, 4, D, seed=5)], axis=1)
    short = to_numpy(block(x, padding_mask=np.ones((1, 3), bool)))
    long = to_numpy(block(padded, padding_mask=np.array([[1, 1, 1, 0, 0, 0, 0]], bool)))
    np.testing.assert_allclose(long[:, :3], short, rtol=1e-5, atol=1e-5)
    # Without the mask the padding leaks in: the test can tell the difference.
    leaked = to_numpy(block(padded))
    assert not np.allclose(leaked[:, :3], short, atol=1e-4)


def test_implicit_keras_mask_equals_explicit_mask():
    ids = np.array([[4, 5, 6, 0, 0], [7, 8, 9, 10, 0]], "int32")
    embedded = PositionalEmbedding(20, D)(ids)
    block = EncoderBlock(num_heads=H, ff_dim=FF, dropout=0.0)
    implicit = block(embedded)
    explicit = block(embedded, padding_mask=ids != 0)
    np.testing.assert_allclose(to_numpy(implicit), to_numpy(explicit), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(to_numpy(implicit._keras_mask), ids != 0)  # mask passes through


def test_post_norm_output_is_normalized_and_pre_norm_is_residual():
    x = random_array(2, 4, D) * 5.0
    post = to_numpy(EncoderBlock(num_heads=H, ff_dim=FF, dropout=0.0)(x))
    np.testing.assert_allclose(post.mean(-1), 0.0, atol=1e-4)
    np.testing.assert_allclose(post.std(-1), 1.0, atol=1e-2)
    pre = to_numpy(EncoderBlock(num_heads=H, ff_dim=FF, dropout=0.0, norm_first=True)(x))
    assert np.abs(pre.std(-1) - 1.0).max() > 0.5  # the residual stream keeps its scale


def test_returns_scores_only_when_asked():
    block = EncoderBlock(num_heads=H, ff_dim=FF)
    x = random_array(2, 4, D)
    assert not isinstance(block(x), tuple)
    out, scores = block(x, return_attention_scores=True)
    assert tuple(scores.shape) == (2, H, 4, 4)


def test_invalid_settings_raise():
    with pytest.raises(ValueError, match="dropout=1.5"):
        EncoderBlock(num_heads=H, ff_dim=FF, dropout=1.5)
    with pytest.raises(ValueError, match=r"d_model=9.*num_heads=2"):
        EncoderBlock(num_heads=H, ff_dim=FF)(random_array(1, 2, 9))


@pytest.mark.parametrize("call_kwargs", [{}, {"return_attention_scores": True}],
                         ids=["plain", "scores"])
def test_symbolic_call_returns_the_eager_structure(call_kwargs):
    block = EncoderBlock(num_heads=H, ff_dim=FF)
    assert_symbolic_call_matches_eager(block, random_array(2, 4, D), call_kwargs)


@NORMS
def test_functional_model_outputting_scores_fits_saves_and_reloads(tmp_path, norm_first):
    outputs, scores = assert_functional_model_round_trip(
        EncoderBlock,
        {"num_heads": H, "ff_dim": FF, "norm_first": norm_first},
        random_array(2, 4, D),
        {"return_attention_scores": True},
        tmp_path / "block.keras",
    )
    assert outputs.shape == (2, 4, D) and scores.shape == (2, H, 4, 4)

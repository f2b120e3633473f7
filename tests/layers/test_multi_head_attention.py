import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import MultiHeadAttention, PositionalEmbedding
from tests.layer_checks import (
    assert_functional_model_round_trip,
    assert_symbolic_call_matches_eager,
    random_array,
    run_layer_checks,
    to_numpy,
)

B, T, S, D, H = 2, 4, 5, 8, 2


def test_standard_layer_checks():
    run_layer_checks(
        MultiHeadAttention,
        {"num_heads": H, "dropout": 0.1},
        (random_array(B, T, D), random_array(B, S, D, seed=1)),
        expected_output_shape=(B, T, D),
        expected_num_trainable_weights=8,
        expected_num_params=4 * (D * D + D),
    )


@pytest.mark.parametrize("inputs", ["self", "cross", "separate_key"])
def test_matches_numpy_reference(inputs):
    layer = MultiHeadAttention(num_heads=H)
    query = random_array(B, T, D)
    value = query if inputs == "self" else random_array(B, S, D, seed=1)
    key = random_array(B, S, D, seed=2) if inputs == "separate_key" else None
    mask = np.ones(value.shape[:2], bool)
    mask[1, 3:] = False
    outputs = to_numpy(layer(query, value, key=key, padding_mask=mask))

    def project(dense, x):
        kernel, bias = (to_numpy(w) for w in dense.weights)
        return (x @ kernel + bias).reshape(x.shape[0], x.shape[1], H, D // H)

    q = project(layer._query_dense, query)
    k = project(layer._key_dense, value if key is None else key)
    v = project(layer._value_dense, value)
    logits = np.einsum("bthk,bshk->bhts", q, k) / np.sqrt(D // H)
    logits = np.where(mask[:, None, None, :], logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    heads = np.einsum("bhts,bshk->bthk", weights, v).reshape(B, T, D)
    kernel, bias = (to_numpy(w) for w in layer._output_dense.weights)
    np.testing.assert_allclose(outputs, heads @ kernel + bias, rtol=1e-5, atol=1e-5)


def test_attention_weights_on_padding_are_exactly_zero():
    layer = MultiHeadAttention(num_heads=H)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    _, scores = layer(random_array(B, T, D), random_array(B, S, D), padding_mask=mask,
                      return_attention_scores=True)
    scores = to_numpy(scores)
    assert scores.shape == (B, H, T, S)
    assert np.all(scores[0, :, :, 3:] == 0.0)
    assert np.all(scores[0, :, :, :3] > 0.0)
    np.testing.assert_allclose(scores.sum(-1), 1.0, rtol=1e-6)


def test_fused_path_equals_explicit_path():
    layer = MultiHeadAttention(num_heads=H)
    query, value = random_array(B, T, D), random_array(B, S, D, seed=1)
    mask = np.array([[1, 1, 0, 0, 0], [1, 1, 1, 1, 0]], bool)
    fused = layer(query, value, padding_mask=mask)
    explicit, _ = layer(query, value, padding_mask=mask, return_attention_scores=True)
    np.testing.assert_allclose(to_numpy(fused), to_numpy(explicit), rtol=1e-6, atol=1e-6)


def test_implicit_keras_mask_equals_explicit_mask():
    ids = np.array([[4, 5, 6, 0, 0], [7, 8, 9, 10, 0]], "int32")
    embedded = PositionalEmbedding(20, D)(ids)  # carries a Keras mask
    layer = MultiHeadAttention(num_heads=H)
    query = random_array(B, T, D)
    implicit = to_numpy(layer(query, embedded))
    explicit = to_numpy(layer(query, embedded, padding_mask=ids != 0))
    unmasked = to_numpy(layer(query, embedded, padding_mask=np.ones_like(ids, bool)))
    np.testing.assert_allclose(implicit, explicit, rtol=1e-6, atol=1e-6)
    assert not np.allclose(implicit, unmasked, atol=1e-4)


def test_attention_mask_and_padding_mask_combine():
    layer = MultiHeadAttention(num_heads=H)
    padding = np.array([[1, 1, 1, 1, 0]] * B, bool)
    attention = np.ones((B, T, S), bool)
    attention[:, 0, 1:] = False  # query 0 may only see key 0
    _, scores = layer(random_array(B, T, D), random_array(B, S, D), padding_mask=padding,
                      attention_mask=attention, return_attention_scores=True)
    scores = to_numpy(scores)
    # Query 0 keeps key 0 alone. oneDNN's softmax may round a lone weight to 1 - 6e-8.
    assert np.all(scores[:, :, 0, 1:] == 0.0)
    np.testing.assert_allclose(scores[:, :, 0, 0], 1.0, rtol=0, atol=1e-6)
    assert np.all(scores[..., 4] == 0.0)


def test_causal_mask_ignores_future_positions():
    layer = MultiHeadAttention(num_heads=H)
    x = random_array(1, T, D)
    changed = x.copy()
    changed[:, -1] += 10.0
    before = to_numpy(layer(x, x, use_causal_mask=True))
    after = to_numpy(layer(changed, changed, use_causal_mask=True))
    np.testing.assert_allclose(before[:, :-1], after[:, :-1], rtol=1e-6, atol=1e-6)
    assert not np.allclose(before[:, -1], after[:, -1])


def test_self_attention_cache_step_by_step_equals_full_pass():
    layer = MultiHeadAttention(num_heads=H)
    x = random_array(B, T, D)
    full = to_numpy(layer(x, x, use_causal_mask=True))
    cache = ops.zeros((B, 2, T + 2, H, D // H))  # longer than needed: unwritten slots masked
    steps = []
    for index in range(T):
        step = x[:, index:index + 1]
        out, cache = layer(step, step, cache=cache, cache_index=index)
        steps.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, rtol=1e-5, atol=1e-5)
    # The cache holds the projected keys of every position that was fed.
    keys = to_numpy(layer._key_dense(x)).reshape(B, T, H, D // H)
    np.testing.assert_allclose(to_numpy(cache)[:, 0, :T], keys, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(to_numpy(cache)[:, :, T:], 0.0)


def test_cross_attention_cache_equals_direct_call():
    layer = MultiHeadAttention(num_heads=H)
    query, memory = random_array(B, T, D), random_array(B, S, D, seed=3)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    direct = to_numpy(layer(query, memory, padding_mask=mask))
    cache = layer.compute_key_value(memory)
    assert tuple(cache.shape) == (B, 2, S, H, D // H)
    cached, returned = layer(query, None, padding_mask=mask, cache=cache)
    np.testing.assert_allclose(to_numpy(cached), direct, rtol=1e-6, atol=1e-6)
    assert returned is cache


def test_all_padding_row_gives_no_nan():
    layer = MultiHeadAttention(num_heads=H)
    mask = np.zeros((B, S), bool)
    out = to_numpy(layer(random_array(B, T, D), random_array(B, S, D), padding_mask=mask))
    assert np.all(np.isfinite(out))


def test_output_arity_follows_arguments():
    layer = MultiHeadAttention(num_heads=H)
    x = random_array(B, T, D)
    assert not isinstance(layer(x, x), tuple)
    assert len(layer(x, x, return_attention_scores=True)) == 2
    cache = ops.zeros((B, 2, T, H, D // H))
    assert len(layer(x[:, :1], x[:, :1], cache=cache, cache_index=0)) == 2
    assert len(layer(x[:, :1], x[:, :1], cache=cache, cache_index=0,
                     return_attention_scores=True)) == 3


def test_invalid_heads_raise_value_error_naming_both_numbers():
    with pytest.raises(ValueError, match=r"d_model=10.*num_heads=4"):
        MultiHeadAttention(num_heads=4)(random_array(1, 3, 10), random_array(1, 3, 10))
    with pytest.raises(ValueError, match="num_heads"):
        MultiHeadAttention(num_heads=0)


def _self_cache():
    return ops.zeros((B, 2, T, H, D // H))


def _cross_cache():
    return ops.zeros((B, 2, S, H, D // H))


@pytest.mark.parametrize(
    "inputs, call_kwargs",
    [
        ((random_array(B, T, D), random_array(B, S, D, seed=1)), {}),
        ((random_array(B, T, D), random_array(B, S, D, seed=1)), {"return_attention_scores": True}),
        ((random_array(B, 1, D), random_array(B, 1, D)),
         {"cache": _self_cache(), "cache_index": 2}),
        ((random_array(B, 1, D), random_array(B, 1, D)),
         {"cache": _self_cache(), "cache_index": 2, "return_attention_scores": True}),
        ((random_array(B, T, D),), {"value": None, "cache": _cross_cache()}),
        ((random_array(B, T, D),),
         {"value": None, "cache": _cross_cache(), "return_attention_scores": True}),
    ],
    ids=["plain", "scores", "self_cache", "self_cache_scores", "cross_cache", "cross_cache_scores"],
)
def test_symbolic_call_returns_the_eager_structure(inputs, call_kwargs):
    assert_symbolic_call_matches_eager(MultiHeadAttention(num_heads=H), inputs, call_kwargs)


def test_functional_model_outputting_scores_fits_saves_and_reloads(tmp_path):
    outputs, scores = assert_functional_model_round_trip(
        MultiHeadAttention,
        {"num_heads": H, "dropout": 0.1},
        (random_array(B, T, D), random_array(B, S, D, seed=1)),
        {"return_attention_scores": True},
        tmp_path / "attention.keras",
    )
    assert outputs.shape == (B, T, D) and scores.shape == (B, H, T, S)


def test_logits_and_softmax_are_float32_under_mixed_bfloat16():
    """Q K^T itself is computed in float32 (from the bfloat16 projections), not cast afterwards."""
    keras.config.set_dtype_policy("mixed_bfloat16")  # the conftest fixture restores float32
    layer = MultiHeadAttention(num_heads=H)
    # Large inputs give logits of tens, where bfloat16's 8-bit mantissa loses whole tenths.
    query, value = 4.0 * random_array(B, T, D), 4.0 * random_array(B, S, D, seed=1)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    outputs, scores = layer(query, value, padding_mask=mask, return_attention_scores=True)
    assert layer.compute_dtype == "bfloat16" and outputs.dtype == "bfloat16"
    assert scores.dtype == "float32"

    def heads(dense, x):  # the layer's own bfloat16 projections, exactly as it computes them
        return to_numpy(ops.cast(dense(x), "float32")).astype("float64").reshape(B, -1, H, D // H)

    logits = np.einsum("bthk,bshk->bhts", heads(layer._query_dense, query),
                       heads(layer._key_dense, value)) / np.sqrt(D // H)
    logits = np.where(mask[:, None, None, :], logits, -np.inf)
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(to_numpy(scores), expected, rtol=0, atol=1e-5)
    # The path without scores (no dropout) computes the same attention.
    fused = layer(query, value, padding_mask=mask)
    np.testing.assert_array_equal(to_numpy(ops.cast(fused, "float32")),
                                  to_numpy(ops.cast(outputs, "float32")))

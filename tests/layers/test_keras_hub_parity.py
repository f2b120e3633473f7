"""keras-hub (and Keras) as the oracle: the same weights give the same outputs.

Each test builds a reference layer from `keras_hub.layers` (or `keras.layers`), sets every
one of its weights to random values (biases and norms included, so nothing agrees by being
zero or one), copies them into ours and compares the outputs to 1e-5, with and without
padding. Dropout is off; keras-hub's defaults (ReLU, layer-norm epsilon 1e-5) are matched.
"""

import keras
import keras_hub
import numpy as np
import pytest

from keras_transformer.layers import (
    Decoder,
    DecoderBlock,
    Encoder,
    EncoderBlock,
    MultiHeadAttention,
)
from tests.layer_checks import random_array, to_numpy

B, T, S, D, FF, H = 2, 5, 6, 16, 32, 4
# keras-hub's default layer-norm epsilon (ours defaults to 1e-6).
KERAS_HUB_EPSILON = 1e-5
TOLERANCE = dict(rtol=1e-5, atol=1e-5)
NORMS = pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
PADDING = pytest.mark.parametrize("padded", [False, True], ids=["no_padding", "padding"])


def _randomize(layer, seed=0):
    """Sets every weight of `layer` to random values: N(0, 0.3), norm scales around 1."""
    rng = np.random.default_rng(seed)
    for weight in layer.weights:
        values = rng.normal(scale=0.3, size=weight.shape)
        if weight.path.endswith("gamma"):
            values += 1.0
        weight.assign(values.astype("float32"))


def _copy_attention(reference, ours):
    """`keras.layers.MultiHeadAttention` (per-head kernels) -> our `MultiHeadAttention`."""
    for theirs, mine in (
        (reference._query_dense, ours._query_dense),
        (reference._key_dense, ours._key_dense),
        (reference._value_dense, ours._value_dense),
    ):
        kernel, bias = theirs.get_weights()  # (d, H, d_k), (H, d_k)
        mine.set_weights([kernel.reshape(kernel.shape[0], -1), bias.reshape(-1)])
    kernel, bias = reference._output_dense.get_weights()  # (H, d_k, d), (d,)
    ours._output_dense.set_weights([kernel.reshape(-1, kernel.shape[-1]), bias])


def _copy(reference, ours):
    ours.set_weights(reference.get_weights())


def _copy_feed_forward(reference, ours):
    _copy(reference._feedforward_intermediate_dense, ours._feed_forward._inner_dense)
    _copy(reference._feedforward_output_dense, ours._feed_forward._output_dense)
    _copy(reference._feedforward_layer_norm, ours._feed_forward_norm)


def _copy_encoder_block(reference, ours):
    _copy_attention(reference._self_attention_layer, ours._self_attention)
    _copy(reference._self_attention_layer_norm, ours._self_attention_norm)
    _copy_feed_forward(reference, ours)


def _copy_decoder_block(reference, ours):
    _copy_encoder_block(reference, ours)
    _copy_attention(reference._cross_attention_layer, ours._cross_attention)
    _copy(reference._cross_attention_layer_norm, ours._cross_attention_norm)


def _masks(padded):
    """Target `(B, T)` and source `(B, S)` padding masks: row 1 padded when `padded`."""
    target, source = np.ones((B, T), bool), np.ones((B, S), bool)
    if padded:
        target[1, 3:] = False
        source[1, 2:] = False
    return target, source


def _encoder_block_pair(norm_first, seed=0):
    reference = keras_hub.layers.TransformerEncoder(
        intermediate_dim=FF, num_heads=H, dropout=0.0, normalize_first=norm_first
    )
    reference.build((B, S, D))
    _randomize(reference, seed)
    ours = EncoderBlock(num_heads=H, ff_dim=FF, dropout=0.0, norm_first=norm_first,
                        layer_norm_epsilon=KERAS_HUB_EPSILON)
    ours.build((B, S, D))
    _copy_encoder_block(reference, ours)
    return reference, ours


def _decoder_block_pair(norm_first, seed=0):
    reference = keras_hub.layers.TransformerDecoder(
        intermediate_dim=FF, num_heads=H, dropout=0.0, normalize_first=norm_first
    )
    reference.build((B, T, D), (B, S, D))
    _randomize(reference, seed)
    ours = DecoderBlock(num_heads=H, ff_dim=FF, dropout=0.0, norm_first=norm_first,
                        layer_norm_epsilon=KERAS_HUB_EPSILON)
    ours.build((B, T, D), (B, S, D))
    _copy_decoder_block(reference, ours)
    return reference, ours


@PADDING
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_multi_head_attention_equals_keras(padded, causal):
    reference = keras.layers.MultiHeadAttention(num_heads=H, key_dim=D // H)
    query, value = random_array(B, S, D), random_array(B, S, D, seed=1)
    reference.build(query.shape, value.shape)
    _randomize(reference)
    ours = MultiHeadAttention(num_heads=H)
    ours.build(query.shape, value.shape)
    _copy_attention(reference, ours)
    _, mask = _masks(padded)
    expected, expected_scores = reference(
        query, value, attention_mask=mask[:, None, :], use_causal_mask=causal,
        return_attention_scores=True,
    )
    outputs, scores = ours(query, value, padding_mask=mask, use_causal_mask=causal,
                           return_attention_scores=True)
    np.testing.assert_allclose(to_numpy(outputs), to_numpy(expected), **TOLERANCE)
    np.testing.assert_allclose(to_numpy(scores), to_numpy(expected_scores), **TOLERANCE)
    fused = ours(query, value, padding_mask=mask, use_causal_mask=causal)  # no-scores path
    np.testing.assert_allclose(to_numpy(fused), to_numpy(expected), **TOLERANCE)


@NORMS
@PADDING
def test_encoder_block_equals_keras_hub_transformer_encoder(norm_first, padded):
    reference, ours = _encoder_block_pair(norm_first)
    _, mask = _masks(padded)
    x = random_array(B, S, D)
    expected, expected_scores = reference(x, padding_mask=mask, return_attention_scores=True)
    outputs, scores = ours(x, padding_mask=mask, return_attention_scores=True)
    np.testing.assert_allclose(to_numpy(outputs), to_numpy(expected), **TOLERANCE)
    np.testing.assert_allclose(to_numpy(scores), to_numpy(expected_scores), **TOLERANCE)


@NORMS
@PADDING
def test_decoder_block_equals_keras_hub_transformer_decoder(norm_first, padded):
    reference, ours = _decoder_block_pair(norm_first)
    target_mask, source_mask = _masks(padded)
    x, memory = random_array(B, T, D), random_array(B, S, D, seed=1)
    expected = reference(x, memory, decoder_padding_mask=target_mask,
                         encoder_padding_mask=source_mask)
    outputs = ours(x, memory, padding_mask=target_mask, encoder_padding_mask=source_mask)
    np.testing.assert_allclose(to_numpy(outputs), to_numpy(expected), **TOLERANCE)
    # Our cached step-by-step decoding reproduces keras-hub's full pass too.
    cache = ours.initialize_cache(memory, max_length=T, encoder_padding_mask=source_mask)
    steps = []
    for index in range(T):
        step, cache = ours(x[:, index:index + 1], None, cache=cache, cache_index=index)
        steps.append(to_numpy(step))
    real = target_mask[:, :, None]  # cached decoding has no target padding: compare real rows
    np.testing.assert_allclose(np.concatenate(steps, 1) * real, to_numpy(expected) * real,
                               **TOLERANCE)


@NORMS
@PADDING
def test_stacks_equal_keras_hub_layers_in_sequence(norm_first, padded):
    """Our `Encoder`/`Decoder` are keras-hub blocks in sequence (plus a final norm if pre-norm)."""
    num_layers = 2
    target_mask, source_mask = _masks(padded)
    x, source = random_array(B, T, D), random_array(B, S, D, seed=1)
    stack_kwargs = dict(num_layers=num_layers, num_heads=H, ff_dim=FF, dropout=0.0,
                        norm_first=norm_first, layer_norm_epsilon=KERAS_HUB_EPSILON)
    encoder, decoder = Encoder(**stack_kwargs), Decoder(**stack_kwargs)
    encoder.build((B, S, D))
    decoder.build((B, T, D), (B, S, D))
    if norm_first:  # pre-norm stacks end with a norm; give it non-trivial weights as well
        _randomize(encoder._final_norm, seed=20)
        _randomize(decoder._final_norm, seed=21)
    memory = source
    for index in range(num_layers):
        reference, _ = _encoder_block_pair(norm_first, seed=index)
        _copy_encoder_block(reference, encoder.blocks[index])
        memory = reference(memory, padding_mask=source_mask)
    if norm_first:
        memory = encoder._final_norm(memory)
    hidden = x
    for index in range(num_layers):
        reference, _ = _decoder_block_pair(norm_first, seed=10 + index)
        _copy_decoder_block(reference, decoder.blocks[index])
        hidden = reference(hidden, memory, decoder_padding_mask=target_mask,
                           encoder_padding_mask=source_mask)
    if norm_first:
        hidden = decoder._final_norm(hidden)
    our_memory = encoder(source, padding_mask=source_mask)
    np.testing.assert_allclose(to_numpy(our_memory), to_numpy(memory), **TOLERANCE)
    # Feed keras-hub's memory to our decoder so each stack is compared on its own.
    ours = decoder(x, memory, padding_mask=target_mask, encoder_padding_mask=source_mask)
    np.testing.assert_allclose(to_numpy(ours), to_numpy(hidden), **TOLERANCE)

"""A tiny stand-in for `build_transformer` with the same inputs and output.

Tests of the training code use it so they do not depend on the real model: logits
`(B, T, V)` come from an embedding of the decoder tokens plus a masked mean of the
embedded encoder tokens, followed by a `Dense` projection.
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer_tests")
class MaskedMeanPool(keras.layers.Layer):
    """Mean of `(B, S, D)` features over the non-padding source positions -> `(B, 1, D)`."""

    def call(self, features, tokens):
        mask = ops.cast(ops.not_equal(tokens, 0), features.dtype)[..., None]  # (B, S, 1)
        total = ops.sum(features * mask, axis=1, keepdims=True)  # (B, 1, D)
        count = ops.maximum(ops.sum(mask, axis=1, keepdims=True), 1.0)  # (B, 1, 1)
        return total / count


def build_stand_in_model(vocab_size=11, d_model=8, dropout=0.0, seed=0):
    """Builds the stand-in functional model.

    Args:
        vocab_size: int, size of the shared vocabulary. Defaults to `11`.
        d_model: int, width of the embeddings. Defaults to `8`.
        dropout: float, dropout rate before the projection. Defaults to `0.0`.
        seed: int, seed of the initializers (same seed, same weights). Defaults to `0`.

    Returns:
        A `keras.Model` mapping `{"encoder_tokens", "decoder_tokens"}` (int32) to float32
        logits `(B, T, vocab_size)`.
    """
    encoder_tokens = keras.Input((None,), dtype="int32", name="encoder_tokens")
    decoder_tokens = keras.Input((None,), dtype="int32", name="decoder_tokens")

    def init(offset):
        # One initializer instance per layer, each with its own fixed seed.
        return keras.initializers.RandomNormal(stddev=0.5, seed=seed + offset)

    source = keras.layers.Embedding(
        vocab_size, d_model, embeddings_initializer=init(1), name="source_embedding"
    )(encoder_tokens)
    target = keras.layers.Embedding(
        vocab_size, d_model, embeddings_initializer=init(2), name="target_embedding"
    )(decoder_tokens)
    hidden = keras.layers.Dense(
        d_model, activation="tanh", kernel_initializer=init(3), name="hidden"
    )(target + MaskedMeanPool(name="pool")(source, encoder_tokens))
    hidden = keras.layers.Dropout(dropout, seed=seed)(hidden)
    logits = keras.layers.Dense(
        vocab_size, kernel_initializer=init(4), name="output_projection"
    )(hidden)
    return keras.Model(
        {"encoder_tokens": encoder_tokens, "decoder_tokens": decoder_tokens}, logits
    )

"""Token embedding scaled by sqrt(d_model) plus position encoding, with dropout on the sum."""

import math

import keras
from keras import ops

from keras_transformer.layers import masking
from keras_transformer.layers.packing import PackedRows
from keras_transformer.layers.utils import (
    check_bool,
    check_positive_int,
    check_rate,
    read_saved_flags,
)

# The base of the sinusoid wavelengths in the paper (section 3.5).
SINUSOID_BASE = 10000.0


def sinusoidal_encoding(length, d_model, start_index=0, dtype="float32"):
    """The paper's position encoding, sin on even and cos on odd dimensions.

    `PE[pos, 2i] = sin(pos / 10000^(2i / d_model))`,
    `PE[pos, 2i + 1] = cos(pos / 10000^(2i / d_model))`.

    Args:
        length: int or scalar tensor, number of positions T.
        d_model: int, even model width.
        start_index: int or scalar tensor, the first position. Defaults to `0`.
        dtype: output dtype. Defaults to `"float32"`.

    Returns:
        `(T, d_model)` tensor.
    """
    positions = ops.cast(ops.arange(length), "float32") + ops.cast(start_index, "float32")
    # One frequency per (sin, cos) pair: 10000^(-2i / d_model) for i = 0 .. d_model / 2 - 1.
    pair = ops.arange(0, d_model, 2, dtype="float32")
    inverse_freq = ops.exp(pair * (-math.log(SINUSOID_BASE) / d_model))
    angles = ops.expand_dims(positions, 1) * ops.expand_dims(inverse_freq, 0)  # (T, d/2)
    # Interleave: stack to (T, d/2, 2) then flatten so sin lands on even, cos on odd indices.
    encoding = ops.reshape(ops.stack([ops.sin(angles), ops.cos(angles)], axis=-1), (-1, d_model))
    return ops.cast(encoding, dtype)


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionalEmbedding(keras.layers.Layer):
    """Token embedding times sqrt(d_model), plus position encoding, then dropout.

    Implements the input of both Transformer stacks (Vaswani et al., 2017, sections 3.4 and
    3.5). Positions are the paper's fixed sinusoids by default or a learned table
    (`learned_positions=True`, `max_length` rows). Token id 0 is padding: with
    `mask_zero=True` the output carries a Keras mask `(B, T)` that is `False` there, which the
    encoder and decoder blocks pick up when no explicit mask is given.

    The same layer is the pre-softmax projection when weights are tied: called with
    `reverse=True` on hidden states `(B, T, d_model)` it returns `hidden @ embeddings^T`,
    logits `(B, T, vocab_size)` (no scaling, no bias, no mask).

    Args:
        vocab_size: int, number of token ids V.
        d_model: int, embedding width (even with sinusoidal positions).
        max_length: int, the longest sequence; the size of the learned position table.
            Defaults to `512`.
        dropout: float, dropout rate on the sum. Defaults to `0.0`.
        learned_positions: bool, learn the position table instead of sinusoids. Defaults to
            `False`.
        scale_embeddings: bool, multiply token embeddings by sqrt(d_model). Defaults to `True`.
        mask_zero: bool, produce a Keras mask for padding id 0. Defaults to `True`.
        embeddings_initializer: initializer of the token table. Defaults to a normal
            distribution with standard deviation d_model^-0.5, which keeps the scaled embedding
            near unit variance and suits the tied projection.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: int `(B, T)` token ids, or float `(B, T, d_model)` with `reverse=True`.
        start_index: int scalar, absolute position of the first token (cached decoding feeds
            one token at a time). Defaults to `0`.
        reverse: bool, project hidden states to vocabulary logits. Defaults to `False`.
        padding_mask: bool or int `(B, T)` (true or non-zero for real positions: the token
            ids themselves will do) or `None`; with `reverse=True` only: project the real
            positions alone (`PackedRows`), zero logits at the padding. Defaults to `None`
            (every position).
        training: bool, whether dropout is active.

    Returns:
        `(B, T, d_model)` embeddings, or `(B, T, vocab_size)` logits with `reverse=True`.

    Example:
    >>> from keras import ops
    >>> from keras_transformer.layers import PositionalEmbedding
    >>> layer = PositionalEmbedding(vocab_size=100, d_model=8)
    >>> embedded = layer(ops.array([[5, 7, 0, 0]]))
    >>> tuple(embedded.shape)
    (1, 4, 8)
    >>> ops.convert_to_numpy(embedded._keras_mask).tolist()
    [[True, True, False, False]]

    References:
        Vaswani et al., "Attention Is All You Need", 2017.
    """

    def __init__(
        self,
        vocab_size,
        d_model,
        max_length=512,
        dropout=0.0,
        learned_positions=False,
        scale_embeddings=True,
        mask_zero=True,
        embeddings_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        vocab_size = check_positive_int("vocab_size", vocab_size)
        d_model = check_positive_int("d_model", d_model)
        max_length = check_positive_int("max_length", max_length)
        learned_positions = check_bool("learned_positions", learned_positions)
        scale_embeddings = check_bool("scale_embeddings", scale_embeddings)
        mask_zero = check_bool("mask_zero", mask_zero)
        if not learned_positions and d_model % 2:
            raise ValueError(
                "Sinusoidal positions need an even d_model (sin/cos pairs), got "
                f"d_model={d_model}. Use an even d_model or learned_positions=True."
            )
        dropout = check_rate("dropout", dropout)
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.max_length = max_length
        self.dropout = dropout
        self.learned_positions = learned_positions
        self.scale_embeddings = scale_embeddings
        self.mask_zero = mask_zero
        self.embeddings_initializer = keras.initializers.get(
            embeddings_initializer
            or keras.initializers.RandomNormal(mean=0.0, stddev=d_model**-0.5)
        )
        self.supports_masking = mask_zero

    def build(self, inputs_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocab_size, self.d_model),
            initializer=self.embeddings_initializer,
        )
        if self.learned_positions:
            self.position_embeddings = self.add_weight(
                name="position_embeddings",
                shape=(self.max_length, self.d_model),
                initializer=keras.initializers.RandomNormal(stddev=self.d_model**-0.5),
            )
        self._dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.built = True

    def call(self, inputs, start_index=0, reverse=False, padding_mask=None, training=None):
        if reverse:
            # Tied pre-softmax projection: (B, T, d) x (d, V) -> (B, T, V).
            kernel = ops.transpose(ops.cast(self.embeddings, inputs.dtype))
            if padding_mask is None:
                return ops.matmul(inputs, kernel)
            layout = PackedRows(padding_mask)
            return layout.unpack(ops.matmul(layout.pack(inputs), kernel))
        if padding_mask is not None:
            raise ValueError("`padding_mask` is for `reverse=True` (the embedding of token ids "
                             "masks padding by itself).")
        self._check_token_ids(inputs, start_index)
        length = ops.shape(inputs)[-1]
        tokens = ops.take(self.embeddings, ops.cast(inputs, "int32"), axis=0)  # (B, T, d)
        if self.scale_embeddings:
            tokens = tokens * ops.cast(math.sqrt(self.d_model), tokens.dtype)
        if self.learned_positions:
            start = ops.cast(self._checked_start(start_index, length), "int32")
            positions = ops.slice(
                self.position_embeddings, [start, ops.zeros((), "int32")], [length, self.d_model]
            )
        else:
            positions = sinusoidal_encoding(length, self.d_model, start_index, tokens.dtype)
        outputs = tokens + ops.cast(positions, tokens.dtype)[None]  # (B, T, d)
        return self._dropout_layer(outputs, training=training)

    def _check_token_ids(self, inputs, start_index):
        """Integer ids of shape (B, T) (floats would embed but mask nothing) and an integer
        start (`call` checks it against a learned position table)."""
        if len(inputs.shape) != 2:  # the last axis is the length: other ranks got wrong positions
            raise ValueError(
                f"{self.name} expects token ids of shape (B, T), got shape {tuple(inputs.shape)}.")
        dtype = keras.backend.standardize_dtype(inputs.dtype)
        if "int" not in dtype:
            raise TypeError(
                f"{self.name} expects integer token ids, got {dtype} (keras.Input's default; "
                "a keras.Sequential without an Input makes its input in the first layer's "
                "float dtype): start the model with keras.Input(shape=(None,), "
                "dtype=\"int32\"). Float ids would embed but compute no padding mask."
            )
        masking.check_integer_position("start_index", start_index)

    def _checked_start(self, start_index, length):
        """`start_index`, refused when `length` positions from it pass the learned table
        (`masking.checked_position`)."""
        return masking.checked_position(
            start_index, lambda start: start + length <= self.max_length,
            lambda start: ["Positions ", start, " .. ", start + length - 1, " are ",
                           self._past_table_message()])

    def _past_table_message(self):
        return (f"past the learned position table of {self.name} "
                f"(max_length={self.max_length}): shorten the inputs or build the layer with a "
                "larger max_length.")

    def compute_mask(self, inputs, mask=None):
        # Only token ids carry padding; hidden states projected with `reverse=True` do not.
        if not self.mask_zero or "int" not in str(inputs.dtype):
            return None
        return ops.not_equal(inputs, 0)

    def compute_output_shape(self, input_shape):
        """Token ids `(B, T)` -> `(B, T, d_model)` (the projection, `reverse=True`, gives
        `(B, T, vocab_size)`: `compute_output_spec` knows both)."""
        return tuple(input_shape) + (self.d_model,)

    def compute_output_spec(self, inputs, start_index=0, reverse=False, padding_mask=None,
                            training=None):
        if reverse:
            shape = tuple(inputs.shape[:-1]) + (self.vocab_size,)
        else:
            self._check_token_ids(inputs, start_index)
            if self.learned_positions and inputs.shape[-1] is not None:
                self._checked_start(start_index, inputs.shape[-1])
            shape = tuple(inputs.shape) + (self.d_model,)
        return keras.KerasTensor(shape, dtype=self.compute_dtype)

    @classmethod
    def from_config(cls, config):
        return super().from_config(read_saved_flags(
            config, ("learned_positions", "scale_embeddings", "mask_zero")))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocab_size": self.vocab_size,
                "d_model": self.d_model,
                "max_length": self.max_length,
                "dropout": self.dropout,
                "learned_positions": self.learned_positions,
                "scale_embeddings": self.scale_embeddings,
                "mask_zero": self.mask_zero,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer
                ),
            }
        )
        return config

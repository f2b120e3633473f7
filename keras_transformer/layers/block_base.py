"""The constructor, config and sub-layer plumbing shared by `EncoderBlock` and `DecoderBlock`."""

import keras

from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.multi_head_attention import MultiHeadAttention
from keras_transformer.layers.utils import (
    check_bool,
    check_epsilon,
    check_positive_int,
    check_rate,
    clone_initializer,
    read_saved_flags,
    sublayer_connection,
)


class BlockBase(keras.layers.Layer):
    """Base of the encoder and decoder blocks and stacks (not a layer to use on its own).

    Holds the hyperparameters they all take, builds the sub-layers the blocks share (an
    attention or feed-forward sub-layer with its norm and dropout), and serializes them.
    """

    def __init__(
        self,
        num_heads,
        ff_dim,
        dropout=0.1,
        attention_dropout=None,
        activation="relu",
        norm_first=False,
        layer_norm_epsilon=1e-6,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        num_heads = check_positive_int("num_heads", num_heads)
        ff_dim = check_positive_int("ff_dim", ff_dim)
        dropout = check_rate("dropout", dropout)
        if attention_dropout is not None:
            attention_dropout = check_rate("attention_dropout", attention_dropout)
        self.num_heads = num_heads
        self.ff_dim = ff_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation = keras.activations.get(activation)
        self.norm_first = check_bool("norm_first", norm_first)
        self.layer_norm_epsilon = check_epsilon("layer_norm_epsilon", layer_norm_epsilon)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    @property
    def _attention_dropout_rate(self):
        return self.dropout if self.attention_dropout is None else self.attention_dropout

    def _sublayer_kwargs(self, name):
        """The name, fresh initializers (own seeds) and dtype policy of the sublayer `name`."""
        return dict(
            kernel_initializer=clone_initializer(self.kernel_initializer, name),
            bias_initializer=clone_initializer(self.bias_initializer, name),
            dtype=self.dtype_policy,
            name=name,
        )

    def _build_norm_and_dropout(self, name, inputs_shape):
        norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=f"{name}_norm"
        )
        norm.build(inputs_shape)
        dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy, name=f"{name}_dropout")
        return norm, dropout

    def _build_attention(self, name, query_shape, value_shape):
        """An attention sub-layer `name` with its norm and dropout, as attributes."""
        attention = MultiHeadAttention(
            self.num_heads,
            dropout=self._attention_dropout_rate,
            **self._sublayer_kwargs(name),
        )
        attention.build(query_shape, value_shape)
        setattr(self, f"_{name}", attention)
        norm, dropout = self._build_norm_and_dropout(name, query_shape)
        setattr(self, f"_{name}_norm", norm)
        setattr(self, f"_{name}_dropout", dropout)

    def _build_feed_forward(self, inputs_shape):
        """The feed-forward sub-layer with its norm and dropout."""
        self._feed_forward = FeedForward(
            self.ff_dim, activation=self.activation, **self._sublayer_kwargs("feed_forward")
        )
        self._feed_forward.build(inputs_shape)
        self._feed_forward_norm, self._feed_forward_dropout = self._build_norm_and_dropout(
            "feed_forward", inputs_shape
        )

    def _sublayer(self, name, inputs, sublayer, training):
        """Runs `sublayer` inside the residual, dropout and norm built for sub-layer `name`."""
        return sublayer_connection(
            inputs,
            sublayer,
            getattr(self, f"_{name}_norm"),
            getattr(self, f"_{name}_dropout"),
            self.norm_first,
            training,
        )

    def _feed_forward_sublayer(self, inputs, training):
        """The feed-forward sub-layer with its residual, dropout and norm."""
        outputs, _ = self._sublayer(
            "feed_forward", inputs, lambda h: self._feed_forward(h, training=training), training
        )
        return outputs

    def _check_cache_request(self, encoder_outputs):
        """What `initialize_cache` needs: the layer built and a real memory."""
        if not self.built:
            raise ValueError(f"{self.name} is not built: call it once (or build it) before "
                             "initialize_cache, which sizes the caches from its layers.")
        if isinstance(encoder_outputs, keras.KerasTensor):
            raise ValueError(
                f"{self.name}.initialize_cache got a symbolic tensor (a `keras.Input` or a "
                "functional model's tensor): the cache holds values, made at decoding time "
                "from the encoder's real outputs (eagerly or inside a `tf.function`). A "
                "functional step model takes the caches as inputs of its own."
            )

    def compute_output_shape(self, inputs_shape, *args, **kwargs):
        return inputs_shape

    def _outputs_spec(self, inputs):
        """The spec of the hidden states a block or stack returns for `inputs` `(B, T, d)`."""
        return keras.KerasTensor(tuple(inputs.shape), dtype=self.compute_dtype)

    def _scores_spec(self, inputs, key_length):
        """The spec of float32 attention scores `(B, H, T, key_length)` for `inputs`."""
        shape = (inputs.shape[0], self.num_heads, inputs.shape[1], key_length)
        return keras.KerasTensor(shape, dtype="float32")

    def _decoder_scores_spec(self, inputs, memory_length, cached):
        """The spec of a decoder block's scores dict (see `DecoderBlock`).

        With a cache the self-attention covers the written part of the cache, whose length
        is known only when the call runs.
        """
        return {
            "self_attention": self._scores_spec(inputs, None if cached else inputs.shape[1]),
            "cross_attention": self._scores_spec(inputs, memory_length),
        }

    @classmethod
    def from_config(cls, config):
        # `skip_padding` is the stacks' (`Encoder`, `Decoder`); absent from a block's config.
        return super().from_config(read_saved_flags(config, ("norm_first", "skip_padding")))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "ff_dim": self.ff_dim,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "activation": keras.activations.serialize(self.activation),
                "norm_first": self.norm_first,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config


def unpack_decoder_cache(cache, stack=False):
    """`(self_attention_cache(s), cross_attention_cache(s), encoder_padding_mask)`, checked.

    Args:
        cache: what the layer was called with.
        stack: bool, whether the caller is a `Decoder` (per-block tuples of caches) rather
            than a `DecoderBlock` (one tensor each).
    """
    if not isinstance(cache, (tuple, list)) or len(cache) != 3:
        raise ValueError(
            "A decoder cache is `(self_attention_cache, cross_attention_cache, "
            "encoder_padding_mask)` as returned by `initialize_cache`, got "
            f"{type(cache).__name__} {cache!r:.200}."
        )
    per_block = isinstance(cache[0], (tuple, list))
    if per_block != stack:
        owner, other = ("Decoder", "DecoderBlock") if stack else ("DecoderBlock", "Decoder")
        raise ValueError(
            f"This cache is a {other}'s (its parts are "
            f"{'tuples of per-block tensors' if per_block else 'tensors'}); a {owner} takes "
            f"the cache of its own `initialize_cache` ({owner}.initialize_cache)."
        )
    return tuple(cache)


def spec_like(tensor):
    """A `KerasTensor` with the shape and dtype of `tensor`."""
    dtype = keras.backend.standardize_dtype(tensor.dtype)
    return keras.KerasTensor(tuple(tensor.shape), dtype=dtype)

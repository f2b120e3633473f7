"""Position-wise feed-forward network."""

import keras

from keras_transformer.layers.utils import check_positive_int, check_rate, clone_initializer


@keras.saving.register_keras_serializable(package="keras_transformer")
class FeedForward(keras.layers.Layer):
    """Position-wise feed-forward network, `FFN(x) = max(0, x W1 + b1) W2 + b2`.

    Applied to each position separately and identically (Vaswani et al., 2017, section 3.3).
    The output width equals the input width `d_model`, inferred in `build`.

    Args:
        ff_dim: int, inner width (2048 in the base model).
        activation: activation of the inner layer. Defaults to `"relu"`.
        dropout: float, dropout on the inner activations (not in the paper; the block applies
            the paper's dropout to this layer's output). Defaults to `0.0`.
        kernel_initializer: initializer of both kernels. Defaults to `"glorot_uniform"`.
        bias_initializer: initializer of both biases. Defaults to `"zeros"`.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(B, T, d_model)`.
        training: bool, whether dropout is active.

    Returns:
        `(B, T, d_model)`.

    Example:
    >>> import keras
    >>> from keras_transformer.layers import FeedForward
    >>> tuple(FeedForward(ff_dim=32)(keras.random.normal((2, 4, 8))).shape)
    (2, 4, 8)

    References:
        Vaswani et al., "Attention Is All You Need", 2017.
    """

    def __init__(
        self,
        ff_dim,
        activation="relu",
        dropout=0.0,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        ff_dim = check_positive_int("ff_dim", ff_dim)
        dropout = check_rate("dropout", dropout)
        self.ff_dim = ff_dim
        self.activation = keras.activations.get(activation)
        self.dropout = dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    def build(self, inputs_shape):
        d_model = inputs_shape[-1]
        self._inner_dense = keras.layers.Dense(
            self.ff_dim,
            activation=self.activation,
            kernel_initializer=clone_initializer(self.kernel_initializer, "inner_dense"),
            bias_initializer=clone_initializer(self.bias_initializer, "inner_dense"),
            dtype=self.dtype_policy,
            name="inner_dense",
        )
        self._inner_dense.build(inputs_shape)
        self._dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self._output_dense = keras.layers.Dense(
            d_model,
            kernel_initializer=clone_initializer(self.kernel_initializer, "output_dense"),
            bias_initializer=clone_initializer(self.bias_initializer, "output_dense"),
            dtype=self.dtype_policy,
            name="output_dense",
        )
        self._output_dense.build(tuple(inputs_shape[:-1]) + (self.ff_dim,))
        self.built = True

    def call(self, inputs, training=None):
        hidden = self._dropout_layer(self._inner_dense(inputs), training=training)  # (B, T, ff)
        return self._output_dense(hidden)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "ff_dim": self.ff_dim,
                "activation": keras.activations.serialize(self.activation),
                "dropout": self.dropout,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config

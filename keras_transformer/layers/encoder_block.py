"""One layer of the Transformer encoder."""

import keras

from keras_transformer.layers import masking
from keras_transformer.layers.block_base import BlockBase


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderBlock(BlockBase):
    """Encoder layer: self-attention then feed-forward, each with residual, dropout and norm.

    Post-norm (`norm_first=False`, the paper) computes `LayerNorm(x + Dropout(Sublayer(x)))`;
    pre-norm (`norm_first=True`) computes `x + Dropout(Sublayer(LayerNorm(x)))`, which trains
    more stably in deep stacks (the stack then needs a final norm, see `Encoder`).

    Masking: `padding_mask` `(B, S)` hides padded positions as keys; without it the Keras mask
    of `inputs` is used, so a block after `PositionalEmbedding` masks padding by itself. The
    output keeps the input's Keras mask.

    Args:
        num_heads: int, attention heads.
        ff_dim: int, inner width of the feed-forward network.
        dropout: float, dropout on each sub-layer output (P_drop). Defaults to `0.1`.
        attention_dropout: float or `None`, dropout on attention weights. Defaults to `dropout`.
        activation: feed-forward activation. Defaults to `"relu"`.
        norm_first: bool, pre-norm instead of the paper's post-norm. Defaults to `False`.
        layer_norm_epsilon: float. Defaults to `1e-6`.
        kernel_initializer: kernels' initializer. Defaults to `"glorot_uniform"`.
        bias_initializer: biases' initializer. Defaults to `"zeros"`.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(B, S, d_model)`.
        padding_mask: bool `(B, S)`, `True` for real tokens.
        attention_mask: bool `(B, S, S)`.
        return_attention_scores: bool. Defaults to `False`.
        training: bool, whether dropout is active.

    Returns:
        `(B, S, d_model)`, or `(outputs, scores)` with `return_attention_scores=True`
        (`scores` float32 `(B, H, S, S)`), symbolically as eagerly.

    Example:
    >>> import keras
    >>> from keras_transformer.layers import EncoderBlock
    >>> block = EncoderBlock(num_heads=2, ff_dim=16)
    >>> tuple(block(keras.random.normal((2, 4, 8))).shape)
    (2, 4, 8)
    >>> inputs = keras.Input((None, 8))
    >>> outputs, scores = block(inputs, return_attention_scores=True)
    >>> scores.shape
    (None, 2, None, None)

    References:
        Vaswani et al., "Attention Is All You Need", 2017.
    """

    def build(self, inputs_shape):
        self._build_attention("self_attention", inputs_shape, inputs_shape)
        self._build_feed_forward(inputs_shape)
        self.built = True

    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
    ):
        if padding_mask is None:
            padding_mask = masking.keras_mask(inputs)

        def attend(x):
            return self._self_attention(
                x,
                x,
                padding_mask=padding_mask,
                attention_mask=attention_mask,
                return_attention_scores=return_attention_scores,
                training=training,
            )

        x, extras = self._sublayer("self_attention", inputs, attend, training)
        x = self._feed_forward_sublayer(x, training)
        return (x,) + extras if return_attention_scores else x

    def call_packed(self, rows, layout, training=None):
        """`call` on the real positions only: `(N, d_model)` rows of `layout` (a
        `PackedRows` of the padding mask) in, rows out (see `Encoder(skip_padding=True)`)."""

        def attend(x):
            return self._self_attention.call_packed(x, layout, x, layout, training=training)

        x, _ = self._sublayer("self_attention", rows, attend, training)
        return self._feed_forward_sublayer(x, training)

    def compute_output_spec(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
    ):
        # The same structure as `call`, so symbolic (functional) calls match eager ones.
        outputs = self._outputs_spec(inputs)
        if return_attention_scores:
            return outputs, self._scores_spec(inputs, inputs.shape[1])
        return outputs

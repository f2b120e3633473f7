"""The Transformer encoder: a stack of `EncoderBlock`s."""

import keras

from keras_transformer.layers import masking
from keras_transformer.layers.block_base import BlockBase
from keras_transformer.layers.encoder_block import EncoderBlock
from keras_transformer.layers.packing import PackedRows
from keras_transformer.layers.utils import check_bool, check_positive_int, clone_initializer


class BlockStack(BlockBase):
    """What `Encoder` and `Decoder` share: `num_layers` blocks of one configuration and,
    pre-norm, a final `LayerNormalization`. Not a layer to use alone (its subclasses build
    their blocks and calls); a `Decoder` is not an `Encoder`, so code choosing a stack by
    its type (`isinstance(layer, Encoder)` to freeze the encoder) finds only the one.
    """

    def __init__(self, num_layers, num_heads, ff_dim, skip_padding=False, **kwargs):
        super().__init__(num_heads, ff_dim, **kwargs)
        self.num_layers = check_positive_int("num_layers", num_layers)
        self.skip_padding = check_bool("skip_padding", skip_padding)
        # Keras then compiles a model holding this stack without XLA (`jit_compile`).
        self.supports_jit = not self.skip_padding

    def _block_kwargs(self, name):
        return dict(
            num_heads=self.num_heads,
            ff_dim=self.ff_dim,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            activation=self.activation,
            norm_first=self.norm_first,
            layer_norm_epsilon=self.layer_norm_epsilon,
            kernel_initializer=clone_initializer(self.kernel_initializer, name),
            bias_initializer=clone_initializer(self.bias_initializer, name),
            dtype=self.dtype_policy,
            name=name,
        )

    def _build_final_norm(self, inputs_shape):
        self._final_norm = None
        if self.norm_first:
            self._final_norm = keras.layers.LayerNormalization(
                epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="final_norm"
            )
            self._final_norm.build(inputs_shape)

    def get_config(self):
        config = super().get_config()
        config["num_layers"] = self.num_layers
        config["skip_padding"] = self.skip_padding
        return config


@keras.saving.register_keras_serializable(package="keras_transformer")
class Encoder(BlockStack):
    """A stack of `num_layers` encoder blocks (Vaswani et al., 2017, section 3.1).

    With `norm_first=True` (pre-norm) a final `LayerNormalization` follows the stack, since
    pre-norm blocks leave their output un-normalized.

    Args:
        num_layers: int, number of blocks N.
        num_heads: int, attention heads per block.
        ff_dim: int, feed-forward inner width.
        dropout: float, sub-layer output dropout. Defaults to `0.1`.
        attention_dropout: float or `None`, attention-weight dropout. Defaults to `dropout`.
        activation: feed-forward activation. Defaults to `"relu"`.
        norm_first: bool, pre-norm blocks and a final norm. Defaults to `False`.
        layer_norm_epsilon: float. Defaults to `1e-6`.
        kernel_initializer: kernels' initializer. Defaults to `"glorot_uniform"`.
        bias_initializer: biases' initializer. Defaults to `"zeros"`.
        skip_padding: bool, run the per-token work (projections, feed-forward layers, norms,
            residuals, dropout) on the real positions only, packed into rows, in calls with
            a padding mask and without attention scores (`PackedRows`); the attention still
            sees the padded layout. Real positions get the same values up to rounding,
            padded ones zeros. (In a `Decoder`, except the rows of a sentence whose source
            has no real token at all: with every key masked, cross-attention averages the
            memory's padded positions in the padded layout and zeros when packed; the
            trainer's readers drop empty sources.) It saves the padding's share of nearly all
            of the stack's arithmetic (benchmarks/RESULTS.md); its shapes depend on the data,
            so not under XLA (`jit_compile`). Defaults to `False`.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(B, S, d_model)` source embeddings.
        padding_mask: bool `(B, S)`; defaults to the Keras mask of `inputs`.
        return_attention_scores: bool. Defaults to `False`.
        training: bool, whether dropout is active.
        skip_padding: bool or `None`, this call's choice (pass `False` in code compiled
            with XLA). Defaults to `None`, the layer's `skip_padding`.

    Returns:
        `(B, S, d_model)` memory (carrying the input's Keras mask), or `(memory, scores)` with
        `return_attention_scores=True`, `scores` a list of float32 `(B, H, S, S)`, one per
        block; symbolic (functional API) calls return the same structure.

    Example:
    >>> import keras
    >>> from keras_transformer.layers import Encoder
    >>> encoder = Encoder(num_layers=2, num_heads=2, ff_dim=16)
    >>> tuple(encoder(keras.random.normal((2, 4, 8))).shape)
    (2, 4, 8)
    >>> memory, scores = encoder(keras.Input((None, 8)), return_attention_scores=True)
    >>> [s.shape for s in scores]
    [(None, 2, None, None), (None, 2, None, None)]
    """

    def build(self, inputs_shape):
        self.blocks = []
        for index in range(self.num_layers):
            block = EncoderBlock(**self._block_kwargs(f"block_{index}"))
            block.build(inputs_shape)
            self.blocks.append(block)
        self._build_final_norm(inputs_shape)
        self.built = True

    def call(self, inputs, padding_mask=None, return_attention_scores=False, training=None,
             skip_padding=None):
        if padding_mask is None:
            padding_mask = masking.keras_mask(inputs)
        masking.check_mask_rank("padding_mask", padding_mask)
        skip_padding = self.skip_padding if skip_padding is None else skip_padding
        if skip_padding and padding_mask is not None and not return_attention_scores:
            layout = PackedRows(padding_mask)
            x = layout.pack(inputs)
            for block in self.blocks:
                x = block.call_packed(x, layout, training=training)
            return layout.unpack(self._final_norm(x) if self._final_norm is not None else x)
        x, scores = inputs, []
        for block in self.blocks:
            x = block(
                x,
                padding_mask=padding_mask,
                return_attention_scores=return_attention_scores,
                training=training,
            )
            if return_attention_scores:
                x, block_scores = x
                scores.append(block_scores)
        if self._final_norm is not None:
            x = self._final_norm(x)
        return (x, scores) if return_attention_scores else x

    def compute_output_spec(
        self, inputs, padding_mask=None, return_attention_scores=False, training=None,
        skip_padding=None,
    ):
        # The same structure as `call`, so symbolic (functional) calls match eager ones.
        outputs = self._outputs_spec(inputs)
        if return_attention_scores:
            scores = [self._scores_spec(inputs, inputs.shape[1]) for _ in range(self.num_layers)]
            return outputs, scores
        return outputs

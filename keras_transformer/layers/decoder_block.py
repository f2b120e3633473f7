"""One layer of the Transformer decoder."""

import keras

from keras_transformer.layers import masking
from keras_transformer.layers.block_base import BlockBase, spec_like, unpack_decoder_cache


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderBlock(BlockBase):
    """Decoder layer: masked self-attention, cross-attention, feed-forward.

    Each of the three sub-layers has a residual connection, dropout and layer norm: post-norm
    (`norm_first=False`, the paper) or pre-norm (`norm_first=True`).

    Masking: self-attention is causal (`use_causal_mask=True` by default) and hides padded
    target positions given by `padding_mask` `(B, T)`; cross-attention hides padded source
    positions given by `encoder_padding_mask` `(B, S)`. Without explicit masks, the Keras masks
    of `inputs` and `encoder_outputs` are used. The output keeps the input's Keras mask.

    Incremental decoding: pass `cache = (self_attention_cache, cross_attention_cache,
    encoder_padding_mask)` with shapes `(B, 2, T_max, H, d_k)`, `(B, 2, S, H, d_k)` and bool
    `(B, S)`, made by `initialize_cache`, and `cache_index`, the position of `inputs[:, 0]`.
    The self-attention keys/values of the new positions are written into the cache; the
    cross-attention keys/values come from the cache, so `encoder_outputs` may be `None`, and
    so does the memory's padding mask (an `encoder_padding_mask` argument, if given, is used
    instead). `padding_mask` is not used (decoded tokens are never padding).

    Args: the same as `EncoderBlock`.
        num_heads: int, attention heads.
        ff_dim: int, inner width of the feed-forward network.
        dropout: float, dropout on each sub-layer output. Defaults to `0.1`.
        attention_dropout: float or `None`, dropout on attention weights. Defaults to `dropout`.
        activation: feed-forward activation. Defaults to `"relu"`.
        norm_first: bool, pre-norm instead of the paper's post-norm. Defaults to `False`.
        layer_norm_epsilon: float. Defaults to `1e-6`.
        kernel_initializer: kernels' initializer. Defaults to `"glorot_uniform"`.
        bias_initializer: biases' initializer. Defaults to `"zeros"`.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(B, T, d_model)` target embeddings.
        encoder_outputs: `(B, S, d_model)`, the encoder's output (memory).
        padding_mask: bool `(B, T)`, `True` for real target tokens.
        encoder_padding_mask: bool `(B, S)`, `True` for real source tokens.
        attention_mask: bool `(B, T, T)`, extra mask for self-attention.
        use_causal_mask: bool, look-ahead mask on self-attention. Defaults to `True`.
        cache: tuple `(self_attention_cache, cross_attention_cache, encoder_padding_mask)`,
            see above.
        cache_index: int scalar, position of the first input token in the cache.
        return_attention_scores: bool. Defaults to `False`.
        training: bool, whether dropout is active.

    Returns:
        `outputs` `(B, T, d_model)`; with `return_attention_scores=True` also a dict of float32
        scores `{"self_attention": (B, H, T, T'), "cross_attention": (B, H, T, S)}`; with a
        cache, the updated cache tuple last. Symbolic (functional API) calls return the same
        structure.

    Example:
    >>> import keras
    >>> from keras_transformer.layers import DecoderBlock
    >>> block = DecoderBlock(num_heads=2, ff_dim=16)
    >>> memory = keras.random.normal((2, 5, 8))
    >>> tuple(block(keras.random.normal((2, 3, 8)), memory).shape)
    (2, 3, 8)
    >>> source_mask = keras.ops.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], "bool")
    >>> cache = block.initialize_cache(memory, max_length=3, encoder_padding_mask=source_mask)
    >>> outputs, cache = block(keras.random.normal((2, 1, 8)), None, cache=cache, cache_index=0)
    >>> tuple(outputs.shape)
    (2, 1, 8)

    References:
        Vaswani et al., "Attention Is All You Need", 2017.
    """

    def build(self, inputs_shape, encoder_outputs_shape=None):
        self._build_attention("self_attention", inputs_shape, inputs_shape)
        self._build_attention("cross_attention", inputs_shape, encoder_outputs_shape or inputs_shape)
        self._build_feed_forward(inputs_shape)
        self.built = True

    def initialize_cache(self, encoder_outputs, max_length, encoder_padding_mask=None):
        """An empty self-attention cache, the memory's cross-attention keys/values and mask.

        Args:
            encoder_outputs: `(B, S, d_model)`.
            max_length: int, the number of decoder positions the cache holds (T_max).
            encoder_padding_mask: bool `(B, S)`, `True` for real source tokens. Defaults to
                the Keras mask of `encoder_outputs`, else no padding.

        Returns:
            `(self_attention_cache (B, 2, T_max, H, d_k) zeros,
            cross_attention_cache (B, 2, S, H, d_k), encoder_padding_mask bool (B, S))`.
        """
        self._check_cache_request(encoder_outputs)
        mask = masking.memory_padding_mask(encoder_outputs, encoder_padding_mask)
        cross = self._cross_attention.compute_key_value(encoder_outputs)
        shape = (keras.ops.shape(encoder_outputs)[0], 2, max_length) + tuple(cross.shape[3:])
        return keras.ops.zeros(shape, dtype=cross.dtype), cross, mask

    def call(
        self,
        inputs,
        encoder_outputs=None,
        padding_mask=None,
        encoder_padding_mask=None,
        attention_mask=None,
        use_causal_mask=True,
        cache=None,
        cache_index=None,
        return_attention_scores=False,
        training=None,
    ):
        if cache is None:
            if encoder_outputs is None:
                raise ValueError("`encoder_outputs` is required when no cache is passed.")
            if padding_mask is None:
                padding_mask = masking.keras_mask(inputs)
            self_cache = cross_cache = None
        else:
            if cache_index is None:
                raise ValueError("`cache_index` is required when a cache is passed.")
            self_cache, cross_cache, cached_mask = unpack_decoder_cache(cache)
            padding_mask = None  # decoded tokens are never padding
            if encoder_padding_mask is None:
                encoder_padding_mask = cached_mask
        if encoder_padding_mask is None and encoder_outputs is not None:
            encoder_padding_mask = masking.keras_mask(encoder_outputs)

        def self_attend(x):
            return self._self_attention(
                x,
                x,
                padding_mask=padding_mask,
                attention_mask=attention_mask,
                use_causal_mask=use_causal_mask,
                cache=self_cache,
                cache_index=cache_index,
                return_attention_scores=return_attention_scores,
                training=training,
            )

        def cross_attend(x):
            return self._cross_attention(
                x,
                encoder_outputs,
                padding_mask=encoder_padding_mask,
                cache=cross_cache,
                return_attention_scores=return_attention_scores,
                training=training,
            )

        x, self_extras = self._sublayer("self_attention", inputs, self_attend, training)
        x, cross_extras = self._sublayer("cross_attention", x, cross_attend, training)
        x = self._feed_forward_sublayer(x, training)
        results = (x,)
        if return_attention_scores:
            results += ({"self_attention": self_extras[0], "cross_attention": cross_extras[0]},)
        if cache is not None:
            results += ((self_extras[-1], cross_cache, cached_mask),)
        return results[0] if len(results) == 1 else results

    def call_packed(self, rows, layout, memory_rows, memory_layout, training=None):
        """`call` (causal, no cache) on the real positions only: `(N, d_model)` rows of
        `layout` and the memory's `(M, d_model)` rows of `memory_layout` (`PackedRows` of the
        two padding masks) in, rows out (see `Decoder(skip_padding=True)`)."""

        def self_attend(x):
            return self._self_attention.call_packed(x, layout, x, layout, use_causal_mask=True,
                                                    training=training)

        def cross_attend(x):
            return self._cross_attention.call_packed(x, layout, memory_rows, memory_layout,
                                                     training=training)

        x, _ = self._sublayer("self_attention", rows, self_attend, training)
        x, _ = self._sublayer("cross_attention", x, cross_attend, training)
        return self._feed_forward_sublayer(x, training)

    def compute_output_spec(
        self,
        inputs,
        encoder_outputs=None,
        padding_mask=None,
        encoder_padding_mask=None,
        attention_mask=None,
        use_causal_mask=True,
        cache=None,
        cache_index=None,
        return_attention_scores=False,
        training=None,
    ):
        if cache is None and encoder_outputs is None:  # as `call`, before a model is built
            raise ValueError("`encoder_outputs` is required when no cache is passed.")
        # The same structure as `call`, so symbolic (functional) calls match eager ones.
        results = (self._outputs_spec(inputs),)
        if return_attention_scores:
            if cache is None:
                memory_length = encoder_outputs.shape[1]
            else:
                memory_length = unpack_decoder_cache(cache)[1].shape[2]
            results += (self._decoder_scores_spec(inputs, memory_length, cache is not None),)
        if cache is not None:
            results += (tuple(spec_like(part) for part in unpack_decoder_cache(cache)),)
        return results[0] if len(results) == 1 else results

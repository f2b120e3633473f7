"""The Transformer decoder: a stack of `DecoderBlock`s with a cache for incremental decoding."""

import keras

from keras_transformer.layers import masking
from keras_transformer.layers.block_base import spec_like, unpack_decoder_cache
from keras_transformer.layers.decoder_block import DecoderBlock
from keras_transformer.layers.encoder import BlockStack
from keras_transformer.layers.packing import PackedRows


@keras.saving.register_keras_serializable(package="keras_transformer")
class Decoder(BlockStack):
    """A stack of `num_layers` decoder blocks (Vaswani et al., 2017, section 3.1).

    Takes the same arguments as `Encoder` (the two stacks differ in their blocks and calls);
    with `norm_first=True` a final `LayerNormalization` follows the stack.

    Incremental decoding: `initialize_cache(encoder_outputs, max_length)` returns the stack's
    cache `(self_attention_caches, cross_attention_caches, encoder_padding_mask)`: two tuples
    with one tensor per block, `(B, 2, T_max, H, d_k)` and `(B, 2, S, H, d_k)`, and the
    memory's padding mask, bool `(B, S)`, which travels with the cache so that cached steps
    with `encoder_outputs=None` hide padded source positions without being told again. Each
    call with `cache` and `cache_index` decodes the positions `cache_index ..` and returns the
    updated cache. Cached step-by-step decoding gives the same outputs as the full forward
    pass. (Per-block tensors rather than one stacked `(B, L, ...)` tensor: a step then copies
    no cache to slice a block's part out or to stack the parts back.)

    Call arguments:
        inputs: `(B, T, d_model)` target embeddings.
        encoder_outputs: `(B, S, d_model)`, the memory; may be `None` with a cache.
        padding_mask: bool `(B, T)`; defaults to the Keras mask of `inputs`.
        encoder_padding_mask: bool `(B, S)`; defaults to the Keras mask of `encoder_outputs`,
            or with a cache to the mask the cache carries.
        cache: the stack's cache tuple, see above.
        cache_index: int scalar, position of `inputs[:, 0]`.
        return_attention_scores: bool. Defaults to `False`.
        training: bool, whether dropout is active.
        skip_padding: bool or `None`, this call's choice (pass `False` in code compiled
            with XLA; cached calls never skip). Defaults to `None`, the layer's
            `skip_padding`.

    Returns:
        `(B, T, d_model)` hidden states (without a Keras mask: the loss masks by label);
        with `return_attention_scores=True` also a list of per-block score dicts; with a cache,
        the updated cache last. Symbolic (functional API) calls return the same structure.

    Example:
    >>> import keras
    >>> from keras_transformer.layers import Decoder
    >>> decoder = Decoder(num_layers=2, num_heads=2, ff_dim=16)
    >>> memory = keras.random.normal((2, 5, 8))
    >>> tuple(decoder(keras.random.normal((2, 3, 8)), memory).shape)
    (2, 3, 8)
    >>> source_mask = keras.ops.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], "bool")
    >>> cache = decoder.initialize_cache(memory, max_length=3, encoder_padding_mask=source_mask)
    >>> for index in range(3):  # the cache carries the source mask from step to step
    ...     step = keras.random.normal((2, 1, 8))
    ...     outputs, cache = decoder(step, None, cache=cache, cache_index=index)
    >>> tuple(outputs.shape), tuple(cache[2].shape)
    ((2, 1, 8), (2, 5))
    """

    def build(self, inputs_shape, encoder_outputs_shape=None):
        self.blocks = []
        for index in range(self.num_layers):
            block = DecoderBlock(**self._block_kwargs(f"block_{index}"))
            block.build(inputs_shape, encoder_outputs_shape)
            self.blocks.append(block)
        self._build_final_norm(inputs_shape)
        self.built = True

    def initialize_cache(self, encoder_outputs, max_length, encoder_padding_mask=None):
        """Empty self-attention caches, every block's cross-attention keys/values, the mask.

        Args:
            encoder_outputs: `(B, S, d_model)`.
            max_length: int, decoder positions the cache holds (T_max).
            encoder_padding_mask: bool `(B, S)`, `True` for real source tokens. Defaults to
                the Keras mask of `encoder_outputs`, else no padding.

        Returns:
            `(self_attention_caches, cross_attention_caches, encoder_padding_mask)`: tuples of
            `L` tensors, `(B, 2, T_max, H, d_k)` zeros and `(B, 2, S, H, d_k)`, and bool
            `(B, S)`.
        """
        self._check_cache_request(encoder_outputs)
        mask = masking.memory_padding_mask(encoder_outputs, encoder_padding_mask)
        caches = [
            block.initialize_cache(encoder_outputs, max_length, encoder_padding_mask=mask)
            for block in self.blocks
        ]
        return (
            tuple(self_cache for self_cache, _, _ in caches),
            tuple(cross_cache for _, cross_cache, _ in caches),
            mask,
        )

    def call(
        self,
        inputs,
        encoder_outputs=None,
        padding_mask=None,
        encoder_padding_mask=None,
        cache=None,
        cache_index=None,
        return_attention_scores=False,
        training=None,
        skip_padding=None,
    ):
        if cache is not None:
            cache = unpack_decoder_cache(cache, stack=True)
        if padding_mask is None and cache is None:
            padding_mask = masking.keras_mask(inputs)
        if encoder_padding_mask is None and encoder_outputs is not None:
            encoder_padding_mask = masking.keras_mask(encoder_outputs)
        masking.check_mask_rank("padding_mask", padding_mask)
        masking.check_mask_rank("encoder_padding_mask", encoder_padding_mask)
        skip_padding = self.skip_padding if skip_padding is None else skip_padding
        if (skip_padding and cache is None and padding_mask is not None
                and not return_attention_scores):
            return self._call_packed(inputs, encoder_outputs, padding_mask,
                                     encoder_padding_mask, training)
        x, scores, self_caches = inputs, [], []
        for index, block in enumerate(self.blocks):
            block_cache = None if cache is None else (cache[0][index], cache[1][index], cache[2])
            outputs = block(
                x,
                encoder_outputs,
                padding_mask=padding_mask,
                encoder_padding_mask=encoder_padding_mask,
                cache=block_cache,
                cache_index=cache_index,
                return_attention_scores=return_attention_scores,
                training=training,
            )
            if not isinstance(outputs, tuple):
                outputs = (outputs,)
            x = outputs[0]
            if return_attention_scores:
                scores.append(outputs[1])
            if cache is not None:
                self_caches.append(outputs[-1][0])
        if self._final_norm is not None:
            x = self._final_norm(x)
        if masking.keras_mask(x) is not None:
            # The last block's tensor carries the target's Keras mask; the stack's output
            # has none (`compute_mask`), on this path as on the packed one.
            x = keras.ops.copy(x)
        results = (x,)
        if return_attention_scores:
            results += (scores,)
        if cache is not None:
            results += ((tuple(self_caches), tuple(cache[1]), cache[2]),)
        return results[0] if len(results) == 1 else results

    def _call_packed(self, inputs, encoder_outputs, padding_mask, encoder_padding_mask,
                     training):
        """The stack on the real target and memory positions only (`skip_padding`)."""
        if encoder_outputs is None:
            raise ValueError("`encoder_outputs` is required when no cache is passed.")
        if encoder_padding_mask is None:  # no padding in the memory
            encoder_padding_mask = keras.ops.ones(keras.ops.shape(encoder_outputs)[:2], "bool")
        layout, memory_layout = PackedRows(padding_mask), PackedRows(encoder_padding_mask)
        memory_rows = memory_layout.pack(keras.ops.cast(encoder_outputs, self.compute_dtype))
        x = layout.pack(inputs)
        for block in self.blocks:
            x = block.call_packed(x, layout, memory_rows, memory_layout, training=training)
        return layout.unpack(self._final_norm(x) if self._final_norm is not None else x)

    def compute_output_spec(
        self,
        inputs,
        encoder_outputs=None,
        padding_mask=None,
        encoder_padding_mask=None,
        cache=None,
        cache_index=None,
        return_attention_scores=False,
        training=None,
        skip_padding=None,
    ):
        if cache is None and encoder_outputs is None:  # as `call`, before a model is built
            raise ValueError("`encoder_outputs` is required when no cache is passed.")
        # The same structure as `call`, so symbolic (functional) calls match eager ones.
        results = (self._outputs_spec(inputs),)
        if return_attention_scores:
            if cache is None:
                memory_length = encoder_outputs.shape[1]
            else:
                memory_length = unpack_decoder_cache(cache, stack=True)[1][0].shape[2]
            # A spec of its own for each block: shared tensors made a functional model's
            # scores of every block the last block's.
            results += ([self._decoder_scores_spec(inputs, memory_length, cache is not None)
                         for _ in range(self.num_layers)],)
        if cache is not None:
            self_caches, cross_caches, mask = unpack_decoder_cache(cache, stack=True)
            results += (
                (
                    tuple(spec_like(part) for part in self_caches),
                    tuple(spec_like(part) for part in cross_caches),
                    spec_like(mask),
                ),
            )
        return results[0] if len(results) == 1 else results

    def compute_mask(self, inputs, mask=None):
        return None

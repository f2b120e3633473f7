"""Multi-head scaled dot-product attention with an optional key/value cache."""

import math

import keras
from keras import ops

from keras_transformer.layers import masking
from keras_transformer.layers.utils import check_positive_int, check_rate, clone_initializer


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head scaled dot-product attention (Vaswani et al., 2017, section 3.2).

    Each of `num_heads` heads projects queries, keys and values to `d_k = d_v = d_model /
    num_heads` dimensions, computes `softmax(Q K^T / sqrt(d_k)) V`, and the heads are
    concatenated and projected back to `d_model` (the last dimension of `query`).

    Masking: `padding_mask` `(B, S)` hides padded keys, `attention_mask` `(B, T, S)` hides any
    query/key pair, `use_causal_mask=True` hides future keys; they are combined with a logical
    AND. When `padding_mask` is not given, the Keras mask of `value` (set by
    `PositionalEmbedding` for padding id 0) is used. Masked logits get a large finite negative,
    so masked keys get exactly zero weight and an all-masked row gives no NaN.

    Precision: under any dtype policy the logits `Q K^T` are computed in float32 (the
    projections are cast before the product, not the product after it), and so are the
    masking and the softmax; the returned scores are float32. The projections and the
    weighted sum of values run in the layer's compute dtype.

    Caching for incremental decoding:
    - self-attention: pass `cache` `(B, 2, T_max, H, d_k)` (keys at `[:, 0]`, values at
      `[:, 1]`) and `cache_index`, the position of the first query. The keys/values of the new
      query positions are written into the cache at `cache_index` and the queries attend over
      the written part of the cache (positions `< cache_index + T`) with a look-ahead mask
      offset by `cache_index`. Returns the updated cache.
    - cross-attention: pass `cache` from `compute_key_value(encoder_outputs)` and no
      `cache_index`; the cached keys/values are used as they are and `value`/`key` are ignored,
      so the memory's padding must be given as `padding_mask` (`DecoderBlock` keeps it in its
      cache and does this).

    Args:
        num_heads: int, number of heads H.
        key_dim: int or `None`, size of each head. Defaults to `d_model // num_heads`.
        dropout: float, dropout rate on the attention weights. Defaults to `0.0`.
        use_bias: bool, whether the projections have biases. Defaults to `True`.
        kernel_initializer: initializer of the projection kernels. Defaults to
            `"glorot_uniform"`.
        bias_initializer: initializer of the biases. Defaults to `"zeros"`.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        query: `(B, T, d_model)`.
        value: `(B, S, d_value)`. Ignored when a cross-attention cache is passed.
        key: `(B, S, d_key)`, defaults to `value`.
        padding_mask: bool `(B, S)`, `True` for real key positions.
        attention_mask: bool `(B, T, S)`, `True` where query `t` may attend to key `s`.
        use_causal_mask: bool, hide keys after each query. Defaults to `False`.
        cache: `(B, 2, S_cache, H, d_k)` key/value cache, see above.
        cache_index: int scalar, position of the first query in a self-attention cache.
        return_attention_scores: bool, also return the attention weights. Defaults to `False`.
        training: bool, whether dropout is active.

    Returns:
        `outputs` `(B, T, d_model)`; `(outputs, scores)` with `return_attention_scores=True`
        (`scores` float32 `(B, H, T, S)`); `cache` is appended as the last element when a
        cache was passed. Symbolic (functional API) calls return the same structure.

    Example:
    >>> import keras
    >>> from keras_transformer.layers import MultiHeadAttention
    >>> layer = MultiHeadAttention(num_heads=2)
    >>> x = keras.random.normal((2, 4, 8))
    >>> tuple(layer(x, x, use_causal_mask=True).shape)
    (2, 4, 8)
    >>> inputs = keras.Input((None, 8))  # symbolic calls return what eager calls return
    >>> outputs, scores = layer(inputs, inputs, return_attention_scores=True)
    >>> model = keras.Model(inputs, [outputs, scores])
    >>> [tuple(t.shape) for t in model(x)]
    [(2, 4, 8), (2, 2, 4, 4)]

    References:
        Vaswani et al., "Attention Is All You Need", 2017.
    """

    def __init__(
        self,
        num_heads,
        key_dim=None,
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        num_heads = check_positive_int("num_heads", num_heads)
        if key_dim is not None:  # 0 had meant "the default" silently
            key_dim = check_positive_int("key_dim", key_dim)
        dropout = check_rate("dropout", dropout)
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.dropout = dropout
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    def _dense(self, units, name):
        # Plain `Dense` projections (they pass Keras masks through quietly); each gets its own
        # initializer instance (with its own seed when seeded), so no two share values.
        return keras.layers.Dense(
            units,
            use_bias=self.use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer, name),
            bias_initializer=clone_initializer(self.bias_initializer, name),
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, query_shape, value_shape=None, key_shape=None):
        masking.check_rank("query", query_shape, "(B, T, d)")
        masking.check_rank("value", value_shape, "(B, S, d)")
        masking.check_rank("key", key_shape, "(B, S, d)")
        d_model = query_shape[-1]
        if d_model is None:
            raise ValueError("The last dimension of `query` (d_model) must be known.")
        if self.key_dim is None and d_model % self.num_heads != 0:
            raise ValueError(
                f"d_model must be divisible by num_heads, got d_model={d_model} and "
                f"num_heads={self.num_heads}."
            )
        self._d_model = d_model
        self._head_dim = self.key_dim or d_model // self.num_heads
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        inner = self.num_heads * self._head_dim
        self._query_dense = self._dense(inner, "query")
        self._query_dense.build(query_shape)
        self._key_dense = self._dense(inner, "key")
        self._key_dense.build(key_shape)
        self._value_dense = self._dense(inner, "value")
        self._value_dense.build(value_shape)
        self._output_dense = self._dense(d_model, "attention_output")
        self._output_dense.build(tuple(query_shape[:-1]) + (inner,))
        self._dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.built = True

    def _split_heads(self, x):
        """`(B, T, H * d_k)` -> `(B, T, H, d_k)`."""
        shape = ops.shape(x)
        return ops.reshape(x, (shape[0], shape[1], self.num_heads, self._head_dim))

    def _merge_heads(self, x):
        """`(B, T, H, d_k)` -> `(B, T, H * d_k)`."""
        shape = ops.shape(x)
        return ops.reshape(x, (shape[0], shape[1], self.num_heads * self._head_dim))

    def compute_key_value(self, value, key=None):
        """Projects the encoder output once for a cross-attention cache.

        Args:
            value: `(B, S, d_value)`.
            key: `(B, S, d_key)`, defaults to `value`.

        Returns:
            `(B, 2, S, H, d_k)`: keys at `[:, 0]`, values at `[:, 1]`.
        """
        key = value if key is None else key
        keys = self._split_heads(self._key_dense(key))  # (B, S, H, d_k)
        values = self._split_heads(self._value_dense(value))  # (B, S, H, d_k)
        return ops.stack([keys, values], axis=1)

    def call(
        self,
        query,
        value,
        key=None,
        padding_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        cache=None,
        cache_index=None,
        return_attention_scores=False,
        training=None,
    ):
        masking.check_rank("query", getattr(query, "shape", None), "(B, T, d)")
        masking.check_rank("value", getattr(value, "shape", None), "(B, S, d)")
        masking.check_rank("key", getattr(key, "shape", None), "(B, S, d)")
        if padding_mask is None and cache is None:
            padding_mask = masking.keras_mask(value)
        key = value if key is None else key
        query_heads = self._split_heads(self._query_dense(query))  # (B, T, H, d_k)
        causal_offset = 0
        if cache is not None:
            self._check_cache(cache, query, "T_max" if cache_index is not None else "S")
        if cache is not None and cache_index is None:
            # Cross-attention over keys/values projected once from the encoder output.
            key_heads, value_heads = cache[:, 0], cache[:, 1]
        else:
            key_heads = self._split_heads(self._key_dense(key))  # (B, S, H, d_k)
            value_heads = self._split_heads(self._value_dense(value))  # (B, S, H, d_v)
            if cache is not None:
                cache_index = _checked_cache_index(cache, cache_index, query_heads.shape[1])
                # Write the new positions into the fixed-size cache, then attend over all of it.
                update = ops.stack([key_heads, value_heads], axis=1)  # (B, 2, T, H, d_k)
                zero = ops.zeros((), "int32")
                start = [zero, zero, ops.cast(cache_index, "int32"), zero, zero]
                cache = ops.slice_update(cache, start, ops.cast(update, cache.dtype))
                # Attend over the positions written so far only: the cost of a step then
                # grows with the decoded length, not with the cache's fixed size.
                written = ops.cast(cache_index, "int32") + ops.shape(query_heads)[1]
                key_heads, value_heads = cache[:, 0, :written], cache[:, 1, :written]
                causal_offset = cache_index
                use_causal_mask = True  # causal among the new queries themselves
                if attention_mask is not None and attention_mask.shape[-1] == cache.shape[2]:
                    # A mask over the whole cache (keras-hub's form): its written part.
                    attention_mask = attention_mask[..., :written]
        mask = masking.merge_masks(
            padding_mask=padding_mask,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            query_length=ops.shape(query_heads)[1],
            key_length=ops.shape(key_heads)[1],
            causal_offset=causal_offset,
            batch_size=query_heads.shape[0],
        )
        outputs, scores = self._attend(
            query_heads, key_heads, value_heads, mask, return_attention_scores, training
        )
        outputs = self._output_dense(self._merge_heads(outputs))  # (B, T, d_model)
        results = (outputs,)
        if return_attention_scores:
            results += (scores,)
        if cache is not None:
            results += (cache,)
        return results[0] if len(results) == 1 else results

    def _check_cache(self, cache, query, positions):
        """Refuses a cache whose static shape is not `(B, 2, positions, H, d_k)` for this layer
        and `query`'s batch (it failed deep in an einsum or a slice update)."""
        shape = tuple(getattr(cache, "shape", ()))
        form = f"(B, 2, {positions}, {self.num_heads}, {self._head_dim})"
        expected = (None, 2, None, self.num_heads, self._head_dim)
        if len(shape) != 5 or any(size is not None and want is not None and size != want
                                  for size, want in zip(shape, expected)):
            raise ValueError(f"`cache` must be {form}, as `initialize_cache` makes it for this "
                             f"layer, got shape {shape}.")
        batch = query.shape[0]
        if shape[0] is not None and batch is not None and shape[0] != batch:
            raise ValueError(f"The `cache` holds a batch of {shape[0]} sentences, the query "
                             f"{batch}: initialize the cache from a memory of the same batch.")

    def call_packed(self, query_rows, query_layout, value_rows, value_layout,
                    use_causal_mask=False, training=None):
        """`call` on the real positions only, packed into rows (see `PackedRows`).

        The projections run on the rows (`(N, d)` queries, `(M, d)` keys/values); only the
        attention itself sees the padded layouts, and the padding of `value_layout` is hidden
        as keys. At every real query position the result equals `call`'s with the layouts'
        masks as padding masks (up to rounding).

        Args:
            query_rows: `(N, d_model)`, the rows of `query_layout`.
            query_layout: `PackedRows` of the queries' `(B, T)` mask.
            value_rows: `(M, d_value)`, the rows of `value_layout` (keys = values).
            value_layout: `PackedRows` of the keys' `(B, S)` mask.
            use_causal_mask: bool. Defaults to `False`.
            training: bool, whether dropout is active.

        Returns:
            `(N, d_model)` rows.
        """
        query_heads = self._split_heads(query_layout.unpack(self._query_dense(query_rows)))
        key_heads = self._split_heads(value_layout.unpack(self._key_dense(value_rows)))
        value_heads = self._split_heads(value_layout.unpack(self._value_dense(value_rows)))
        mask = masking.merge_masks(
            padding_mask=value_layout.mask,
            use_causal_mask=use_causal_mask,
            query_length=ops.shape(query_heads)[1],
            key_length=ops.shape(key_heads)[1],
        )
        outputs, _ = self._attend(query_heads, key_heads, value_heads, mask, False, training)
        return self._output_dense(query_layout.pack(self._merge_heads(outputs)))

    def _attend(self, query, key, value, mask, return_attention_scores, training):
        """softmax(Q K^T / sqrt(d_k)) V on `(B, T|S, H, d_k)` heads; mask `(B, T, S)` or None."""
        scale = 1.0 / math.sqrt(self._head_dim)
        use_dropout = training and self.dropout > 0.0
        if self.compute_dtype == "float32" and not (return_attention_scores or use_dropout):
            # Keras' fused op: the same math, used whenever nothing between the softmax and the
            # weighted sum (dropout, returning the weights) is needed. Only under float32: it
            # computes Q K^T in the inputs' dtype and casts the product afterwards.
            mask = None if mask is None else ops.expand_dims(mask, 1)  # (B, 1, T, S)
            return ops.dot_product_attention(query, key, value, mask=mask, scale=scale), None
        # Q K^T in float32 from the (possibly bfloat16/float16) projections: a bfloat16 product
        # keeps 8 bits of mantissa, an error of ~0.1 on logits of ~30 that the softmax then
        # exponentiates. Only the weighted sum of values runs in the compute dtype.
        query, key = ops.cast(query, "float32"), ops.cast(key, "float32")
        logits = ops.einsum("bthk,bshk->bhts", query, key) * scale  # (B, H, T, S), float32
        if mask is not None:
            logits = ops.where(ops.expand_dims(mask, 1), logits, masking.large_negative("float32"))
        scores = ops.softmax(logits, axis=-1)  # (B, H, T, S), float32
        weights = self._dropout_layer(ops.cast(scores, self.compute_dtype), training=training)
        outputs = ops.einsum("bhts,bshk->bthk", weights, value)  # (B, T, H, d_v)
        return outputs, scores

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return query_shape

    def compute_output_spec(
        self,
        query,
        value,
        key=None,
        padding_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        cache=None,
        cache_index=None,
        return_attention_scores=False,
        training=None,
    ):
        # The same structure as `call` returns, so symbolic (functional) calls match eager ones.
        results = (keras.KerasTensor(tuple(query.shape), dtype=self.compute_dtype),)
        if return_attention_scores:
            if cache is None:
                key_length = (value if key is None else key).shape[1]
            elif cache_index is None:
                key_length = cache.shape[2]  # cross-attention over the cached memory
            else:
                key_length = None  # the written part of a self-attention cache
            batch, query_length = query.shape[0], query.shape[1]
            results += (
                keras.KerasTensor(
                    (batch, self.num_heads, query_length, key_length), dtype="float32"
                ),
            )
        if cache is not None:
            results += (keras.KerasTensor(tuple(cache.shape), dtype=cache.dtype),)
        return results[0] if len(results) == 1 else results

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config


def _checked_cache_index(cache, cache_index, length):
    """`cache_index`, refused unless one integer whose `length` new positions fit the cache.

    Writing past a fixed-size cache would clamp the update into its last positions, and the
    step would attend a cache it had half overwritten. An index known before running (a
    Python, NumPy or eager integer) is checked here; a graph tensor (a `tf.function` or
    `while_loop` step) gets a runtime assertion (which XLA, having none, compiles away).
    """
    masking.check_integer_position("cache_index", cache_index)
    if len(getattr(cache_index, "shape", ())) != 0:
        raise ValueError(
            "`cache_index` must be one integer for the whole batch (every row decodes the "
            f"same position), got shape {tuple(cache_index.shape)}."
        )
    positions = cache.shape[2]
    if positions is None or length is None:
        return cache_index
    message = (f" with {length} new position(s) does not fit a cache of {positions} "
               "positions: initialize_cache(..., max_length) bounds the positions a cached "
               "decoder writes.")
    return masking.checked_position(
        cache_index, lambda index: (index >= 0) & (index + length <= positions),
        lambda index: ["cache_index=", index, message])

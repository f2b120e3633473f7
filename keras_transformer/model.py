"""`build_transformer`: the encoder-decoder Transformer as a Keras functional model."""

import math

import keras
from keras import ops

from keras_transformer.layers import Decoder, Encoder, PackedRows, PositionalEmbedding, masking
from keras_transformer.layers.positional_embedding import sinusoidal_encoding
from keras_transformer.layers.utils import (
    check_bool,
    check_epsilon,
    check_positive_int,
    check_rate,
    sublayer_connection,
)

ENCODER_INPUT = "encoder_tokens"
DECODER_INPUT = "decoder_tokens"


def _check_positive(**values):
    """Refuses non-integers (NumPy's included) and values below 1; returns Python ints."""
    return {name: check_positive_int(name, value) for name, value in values.items()}


def build_transformer(
    vocab_size,
    target_vocab_size=None,
    d_model=512,
    num_heads=8,
    ff_dim=2048,
    num_layers=6,
    num_decoder_layers=None,
    dropout=0.1,
    attention_dropout=None,
    activation="relu",
    norm_first=False,
    tie_embeddings=True,
    learned_positions=False,
    max_length=512,
    layer_norm_epsilon=1e-6,
    skip_padding=False,
    name="transformer",
):
    """Builds the encoder-decoder Transformer of Vaswani et al. (2017) as a `keras.Model`.

    The model maps `{"encoder_tokens": int32 (B, S), "decoder_tokens": int32 (B, T)}` (token id
    0 is padding) to float32 logits `(B, T, V_target)` for the next target token at each
    position (teacher forcing: `decoder_tokens` is the target shifted right behind a start
    token). The logits stay float32 under a mixed-precision policy.

    Weight tying (`tie_embeddings=True`): with one shared vocabulary (`target_vocab_size` not
    given) the source embedding, the target embedding and the pre-softmax projection are one
    matrix (one `PositionalEmbedding` layer named `embedding`); with separate vocabularies the
    target embedding and the projection share one. Without tying, the projection is a `Dense`
    named `output_projection` (with bias) and each vocabulary has its own embedding.

    Args:
        vocab_size: int, source vocabulary size (and target one when shared).
        target_vocab_size: int or `None`, a separate target vocabulary. Defaults to `None`.
        d_model: int, model width. Defaults to `512`.
        num_heads: int, attention heads; must divide `d_model`. Defaults to `8`.
        ff_dim: int, feed-forward inner width. Defaults to `2048`.
        num_layers: int, encoder blocks (and decoder blocks by default). Defaults to `6`.
        num_decoder_layers: int or `None`, decoder blocks. Defaults to `num_layers`.
        dropout: float, P_drop on embeddings and sub-layer outputs. Defaults to `0.1`.
        attention_dropout: float or `None`, dropout on attention weights. Defaults to `dropout`.
        activation: feed-forward activation. Defaults to `"relu"`.
        norm_first: bool, pre-norm blocks with a final norm per stack instead of the paper's
            post-norm. Defaults to `False`.
        tie_embeddings: bool, share embedding and projection matrices. Defaults to `True`.
        learned_positions: bool, learned position table instead of sinusoids. Defaults to
            `False`.
        max_length: int, longest sequence (size of a learned position table; documents the
            longest input the model was meant for). Defaults to `512`.
        layer_norm_epsilon: float. Defaults to `1e-6`.
        skip_padding: bool, both stacks run their per-token work on the real tokens only
            (`Encoder(skip_padding=True)`), and so does a tied projection: the same logits at
            real positions up to rounding, zeros at padded ones, less arithmetic on padded
            batches. Not under XLA. Defaults to `False`.
        name: str, model name. Defaults to `"transformer"`.

    Returns:
        A `keras.Model`.

    Raises:
        ValueError: on non-positive sizes, `d_model % num_heads != 0`, an odd `d_model` with
            sinusoidal positions, a dropout rate outside `[0, 1)`, a `layer_norm_epsilon`
            that is not a finite number above 0, or an option that is not a bool.

    Example:
    >>> model = build_transformer(vocab_size=1000, d_model=64, num_heads=4, ff_dim=128,
    ...                           num_layers=2)
    >>> model.count_params()
    231424

    References:
        Vaswani et al., "Attention Is All You Need", 2017.
    """
    num_decoder_layers = num_layers if num_decoder_layers is None else num_decoder_layers
    shared_vocabulary = target_vocab_size is None
    target_vocab_size = vocab_size if shared_vocabulary else target_vocab_size
    (vocab_size, target_vocab_size, d_model, num_heads, ff_dim, num_layers,
     num_decoder_layers, max_length) = _check_positive(
        vocab_size=vocab_size,
        target_vocab_size=target_vocab_size,
        d_model=d_model,
        num_heads=num_heads,
        ff_dim=ff_dim,
        num_layers=num_layers,
        num_decoder_layers=num_decoder_layers,
        max_length=max_length,
    ).values()
    if d_model % num_heads:
        raise ValueError(
            f"d_model must be divisible by num_heads, got d_model={d_model} and "
            f"num_heads={num_heads}."
        )
    if not learned_positions and d_model % 2:
        raise ValueError(
            f"Sinusoidal positions need an even d_model, got d_model={d_model}; use an even "
            "d_model or learned_positions=True."
        )
    dropout = check_rate("dropout", dropout)  # NumPy's numbers too, as the layers take
    if attention_dropout is not None:  # None: the same as `dropout`
        attention_dropout = check_rate("attention_dropout", attention_dropout)
    layer_norm_epsilon = check_epsilon("layer_norm_epsilon", layer_norm_epsilon)
    norm_first, tie_embeddings, learned_positions, skip_padding = (
        check_bool(name, value) for name, value in (
            ("norm_first", norm_first), ("tie_embeddings", tie_embeddings),
            ("learned_positions", learned_positions), ("skip_padding", skip_padding)))

    def embedding(vocab, layer_name):
        return PositionalEmbedding(
            vocab,
            d_model,
            max_length=max_length,
            dropout=dropout,
            learned_positions=learned_positions,
            name=layer_name,
        )

    if shared_vocabulary and tie_embeddings:
        source_embedding = target_embedding = embedding(vocab_size, "embedding")
    else:
        source_embedding = embedding(vocab_size, "source_embedding")
        target_embedding = embedding(target_vocab_size, "target_embedding")
    stack_kwargs = dict(
        num_heads=num_heads,
        ff_dim=ff_dim,
        dropout=dropout,
        attention_dropout=attention_dropout,
        activation=activation,
        norm_first=norm_first,
        layer_norm_epsilon=layer_norm_epsilon,
    )
    encoder = Encoder(num_layers, name="encoder", skip_padding=skip_padding, **stack_kwargs)
    decoder = Decoder(num_decoder_layers, name="decoder", skip_padding=skip_padding,
                      **stack_kwargs)

    encoder_tokens = keras.Input(shape=(None,), dtype="int32", name=ENCODER_INPUT)
    decoder_tokens = keras.Input(shape=(None,), dtype="int32", name=DECODER_INPUT)
    # Padding masks travel as Keras masks from the embeddings (token id 0) into both stacks.
    memory = encoder(source_embedding(encoder_tokens))
    hidden = decoder(target_embedding(decoder_tokens), memory)
    if tie_embeddings:
        # Skipping padding, the tied projection computes the real target positions only (the
        # token ids are the mask: no op outside a layer, so the model's layers stay layers).
        logits = target_embedding(hidden, reverse=True,
                                  padding_mask=decoder_tokens if skip_padding else None)
    else:
        logits = keras.layers.Dense(target_vocab_size, name="output_projection")(hidden)
    # Logits in float32 even under mixed precision: softmax and the loss need the range.
    logits = keras.layers.Activation("linear", dtype="float32", name="logits")(logits)
    return keras.Model(
        inputs={ENCODER_INPUT: encoder_tokens, DECODER_INPUT: decoder_tokens},
        outputs=logits,
        name=name,
    )


# The layer `build_transformer` keeps in float32 under any policy (the logits).
_FLOAT32_LAYERS = ("logits",)


def with_dtype_policy(model, policy):
    """A copy of a `build_transformer` model that computes under another dtype policy.

    A model trained under `mixed_bfloat16` saves that policy in every layer's config, so it
    would decode in bfloat16 wherever it is loaded; this makes it float32 again (or turns a
    float32 model into a bfloat16 one for a CPU that computes bfloat16 natively). Every
    layer's policy is replaced except the float32 `logits` layer, and the weights are copied
    (cast to the new variable dtype).

    Args:
        model: a model made by `build_transformer` (or loaded from one's `.keras` file).
        policy: string, a Keras dtype policy name: `"float32"`, `"mixed_bfloat16"`,
            `"bfloat16"`, `"mixed_float16"` or `"float16"`.

    Returns:
        A new `keras.Model`, or `model` itself when every layer already has `policy`.

    Example:

    >>> model = build_transformer(100, d_model=16, num_heads=2, ff_dim=32, num_layers=1)
    >>> bf16 = with_dtype_policy(model, "bfloat16")
    >>> bf16.get_layer("decoder").compute_dtype, bf16.get_layer("logits").compute_dtype
    ('bfloat16', 'float32')
    """
    policy = keras.dtype_policies.get(policy).name
    config = model.get_config()
    changed = False
    for layer_config in config["layers"]:
        name = layer_config["name"]
        if layer_config["class_name"] == "InputLayer" or name in _FLOAT32_LAYERS:
            continue
        changed |= model.get_layer(name).dtype_policy.name != policy
        layer_config["config"]["dtype"] = policy
    if not changed:
        return model
    converted = model.__class__.from_config(config)
    for source, target in zip(model.weights, converted.weights):
        if source.path != target.path:  # the same architecture, so the same order
            raise ValueError(f"Weights differ after the policy change: {source.path} against "
                             f"{target.path}.")
        target.assign(ops.cast(source, target.dtype))
    return converted


def closed_form_parameter_count(
    vocab_size,
    d_model,
    ff_dim,
    num_layers,
    num_decoder_layers=None,
    target_vocab_size=None,
    tie_embeddings=True,
    norm_first=False,
):
    """The parameter count of `build_transformer` (sinusoidal positions) in closed form.

    Per encoder layer: attention `4 (d^2 + d)`, feed-forward `2 d ff + ff + d`, two layer norms
    `2 * 2 d`. Per decoder layer: two attentions, the feed-forward and three norms. Embeddings:
    `V d` for one tied shared matrix; otherwise each vocabulary's embedding plus a projection
    `d V_t + V_t` unless tied to the target embedding. Pre-norm adds a final norm per stack.
    """
    num_decoder_layers = num_layers if num_decoder_layers is None else num_decoder_layers
    attention = 4 * (d_model * d_model + d_model)
    feed_forward = 2 * d_model * ff_dim + ff_dim + d_model
    norm = 2 * d_model
    encoder_layer = attention + feed_forward + 2 * norm
    decoder_layer = 2 * attention + feed_forward + 3 * norm
    final_norms = 2 * norm if norm_first else 0
    if target_vocab_size is None and tie_embeddings:
        embeddings = vocab_size * d_model
    else:
        target = vocab_size if target_vocab_size is None else target_vocab_size
        embeddings = (vocab_size + target) * d_model
        if not tie_embeddings:
            embeddings += d_model * target + target
    return (
        embeddings
        + num_layers * encoder_layer
        + num_decoder_layers * decoder_layer
        + final_norms
    )


class TransformerParts:
    """The pieces of a built Transformer that incremental decoding needs.

    Decoding sees the model only through `encode` and `next_logits` (see docs/CONTRACTS.md);
    this class builds them from the layers of a model made by `build_transformer`, so a loaded
    `.keras` model decodes with a key/value cache without being rebuilt.

    The cached step is a decoding-time fast path over the trained weights, not a call of the
    Keras layers: hidden states are `(N, d_model)` matrices (one position per row), the
    self-attention query/key/value projections run as one matmul and the cross-attention
    key/value projections as another (kernels concatenated from the trained ones when
    decoding starts; the trained weights and `.keras` files are unchanged), attention is a
    batched matmul over `(N, H, t, d_k)` keys/values, and positions come from a table
    computed once. It computes the same function as the layers (`full_logits`).

    Cache layout: `{"self": per block (keys, values), "memory": {"cross": per block (keys,
    values), "bias": (B, 1, S, 1, 1)}}`. Self-attention keys/values are `(N, H, t, d_k)` and
    grow by one position per step (concatenation: a step copies the `t` positions written,
    where a fixed `T_max` buffer would be copied whole by every write and every beam
    reorder); the searches let an axis that starts empty grow. The memory part holds the
    cross-attention keys/values `(B, 1, S, H, d_k)` and the additive padding bias of the
    source. `step_function` keeps that part at `B` rows outside the search's cache: with
    `N = B * K` beam rows (beams of one sentence adjacent), the queries of a sentence's `K`
    beams are attended together as `K` query positions, so the memory is never tiled to
    `B * K` rows nor reordered with the beams.

    Args:
        model: a `keras.Model` from `build_transformer` (or loaded from its `.keras` file).

    Example:
    >>> from keras import ops
    >>> from keras_transformer import TransformerParts, build_transformer
    >>> model = build_transformer(vocab_size=100, d_model=16, num_heads=2, ff_dim=32,
    ...                           num_layers=1)
    >>> parts = TransformerParts(model)
    >>> memory, memory_mask = parts.encode(ops.array([[5, 6, 7, 2], [8, 2, 0, 0]], "int32"))
    >>> cache = parts.initial_cache(memory, memory_mask, max_length=8)
    >>> start_tokens = ops.ones((2, 1), "int32")
    >>> logits, cache = parts.next_logits(start_tokens, cache, 0)
    >>> tuple(logits.shape)
    (2, 100)
    """

    def __init__(self, model):
        self.model = model
        names = {layer.name for layer in model.layers}
        if "embedding" in names:
            self.source_embedding = self.target_embedding = model.get_layer("embedding")
        else:
            self.source_embedding = model.get_layer("source_embedding")
            self.target_embedding = model.get_layer("target_embedding")
        self.encoder = model.get_layer("encoder")
        self.decoder = model.get_layer("decoder")
        self.output_projection = (
            model.get_layer("output_projection") if "output_projection" in names else None
        )
        self.vocab_size = self.target_embedding.vocab_size
        # A tied model's pre-softmax kernel `(d_model, V)`, when a user stores it (see the
        # `Translator`'s `DecodingConfig.stored_projection`); `None`: transposed per search.
        self.projection_kernel = None

    def encode(self, source_ids, training=False):
        """`source_ids` int `(B, S)` -> `(memory (B, S, d_model), memory_mask bool (B, S))`."""
        memory_mask = ops.not_equal(source_ids, 0)
        embedded = self.source_embedding(source_ids, training=training)
        # Every position (`skip_padding=False`): this path also runs under XLA (`--jit`);
        # `encode_packed` is the one without the padding.
        memory = self.encoder(embedded, padding_mask=memory_mask, training=training,
                              skip_padding=False)
        return memory, memory_mask

    def encode_packed(self, source_ids):
        """`encode` at inference with the padding left out of every per-token computation.

        The projections, feed-forward layers and norms of the encoder (nearly all of its
        arithmetic) run on the real tokens only, packed into `(T, d_model)` rows; only the
        attention itself sees the padded `(B, S)` layout, scattered there and gathered back
        each block. In batches of sentences of mixed lengths (test_2016 in 32s, input order)
        46% of the source positions are padding (benchmarks/encoder_share.py). The same
        arithmetic as `encode`, in the same dtypes, up to rounding; the memory's padding
        positions are zero (`encode` leaves values there that every reader masks). Except
        for a source with no real token at all (a row of padding alone): with every key
        masked, cross-attention averages the memory's padded positions, so a decoder reads
        other values from the two, and neither means anything (a `Translator` always
        appends END, so it never makes such a row). Shapes depend on the data: no XLA.

        Args:
            source_ids: int `(B, S)`, 0 = padding.

        Returns:
            `(memory (B, S, d_model), memory_mask bool (B, S))`, as `encode`.
        """
        memory_mask = ops.not_equal(source_ids, 0)
        batch, length = ops.shape(source_ids)[0], ops.shape(source_ids)[1]
        layout = PackedRows(memory_mask)  # the T real positions
        mask = memory_mask[:, None, :]  # (B, 1, S): every query sees the real keys

        # The embedding is a gather: as cheap on the padded layout.
        x = layout.pack(self.source_embedding(source_ids, training=False))  # (T, d)

        for block in self.encoder.blocks:
            attention = block._self_attention
            num_heads, head_dim = attention.num_heads, attention._head_dim
            qkv_weights = _cast_projection(
                _fused_projection(attention, ("query", "key", "value")), block.compute_dtype)
            output_weights = _dense_weights(attention._output_dense, block.compute_dtype)
            inner = _dense_weights(block._feed_forward._inner_dense, block.compute_dtype)
            outer = _dense_weights(block._feed_forward._output_dense, block.compute_dtype)

            def attend(h, attention=attention, num_heads=num_heads, head_dim=head_dim,
                       qkv_weights=qkv_weights, output_weights=output_weights):
                qkv = ops.reshape(layout.unpack(_linear(h, *qkv_weights)),
                                  (batch, length, 3, num_heads, head_dim))
                queries, keys, values = ops.unstack(qkv, axis=2)  # (B, S, H, d_k) each
                outputs, _ = attention._attend(queries, keys, values, mask, False, False)
                outputs = ops.reshape(layout.pack(outputs), (-1, num_heads * head_dim))
                return _linear(outputs, *output_weights)  # (T, d)

            def feed(h, block=block, inner=inner, outer=outer):
                return _feed_forward_step(block, inner, outer, h)

            for name, function in (("self_attention", attend), ("feed_forward", feed)):
                norm = _norm_weights(getattr(block, f"_{name}_norm"))
                x, _ = _sublayer_step(block, name, norm, x, function)
        final_norm = self.encoder._final_norm
        if final_norm is not None:
            x = _layer_norm(x, _norm_weights(final_norm))
        return layout.unpack(x), memory_mask

    def initial_cache(self, memory, memory_mask, max_length=None):
        """The whole decoding cache, memory part included (see the class docstring).

        Args:
            memory: `(B, S, d_model)` from `encode`.
            memory_mask: bool `(B, S)`, `True` for real source tokens.
            max_length: int or `None`, unused: the self-attention cache grows step by step.
                Kept for callers that size a cache.

        Returns:
            `{"self": ..., "memory": ...}` with leading axis `B` everywhere.
        """
        del max_length
        return {"self": self._empty_self_cache(memory), "memory": self.memory_state(
            memory, memory_mask)}

    def memory_state(self, memory, memory_mask):
        """Every block's cross-attention keys/values `(B, 1, S, H, d_k)` (the axis of 1 for
        the beams of a sentence) and the padding bias `(B, 1, S, 1, 1)`.

        Source positions stay on the axis before the heads, as the projection leaves them:
        a reshape, where `(B, H, S, d_k)` would cost a transpose per block and tensor
        (oneDNN's, ~220 us each whatever the size: about 4% of the op time of a beam-4
        call at batch 1, benchmarks/profile_decoder.py).
        """
        cross = []
        for block in self.decoder.blocks:
            kernel, bias = _fused_projection(block._cross_attention, ("key", "value"))
            keys_values = _linear(memory, kernel, bias)  # (B, S, 2 * H * d_k)
            shape = ops.shape(keys_values)
            keys_values = ops.reshape(
                keys_values, (shape[0], 1, shape[1], 2, block.num_heads, -1))
            cross.append(tuple(ops.unstack(keys_values, axis=3)))  # (B, 1, S, H, d_k) each
        # Additive bias: 0 on real source tokens, a large negative on padding.
        bias = ops.where(
            ops.cast(memory_mask, "bool"), 0.0, masking.large_negative("float32")
        )[:, None, :, None, None]  # (B, 1, S, 1, 1)
        return {"cross": tuple(cross), "bias": bias}

    def _empty_self_cache(self, memory, length=0):
        batch = ops.shape(memory)[0]
        caches = []
        for block in self.decoder.blocks:
            attention = block._self_attention
            shape = (batch, attention.num_heads, length, attention._head_dim)
            caches.append((ops.zeros(shape, memory.dtype), ops.zeros(shape, memory.dtype)))
        return tuple(caches)

    def _projection_kernel(self):
        """`(d_model, V)` kernel and bias of the pre-softmax projection (tied: the
        stored `projection_kernel`, or the embedding matrix transposed once per search
        rather than every step)."""
        if self.output_projection is None:
            if self.projection_kernel is not None:
                # `convert_to_tensor` would pass a variable on, read at every step.
                return ops.copy(self.projection_kernel), None
            return ops.transpose(ops.convert_to_tensor(self.target_embedding.embeddings)), None
        dense = self.output_projection
        return ops.convert_to_tensor(dense.kernel), ops.convert_to_tensor(dense.bias)

    def project(self, hidden):
        """Hidden states `(..., d_model)` -> float32 logits `(..., V)`."""
        if self.output_projection is None:
            logits = self.target_embedding(hidden, reverse=True)
        else:
            logits = self.output_projection(hidden)
        return ops.cast(logits, "float32")

    def next_logits(self, tokens, cache, index):
        """One cached decoder step: `tokens` `(N, 1)` at position `index` -> logits `(N, V)`.

        `cache` is `initial_cache`'s structure; its memory part may have `N` rows or fewer
        (`B` rows for `N = B * K` adjacent beams).
        """
        weights = self._step_weights()
        logits, self_cache = self._step(
            tokens, cache["self"], cache["memory"], index, weights,
            self._positions(self._checked_position(index), weights),
        )
        return logits, {"self": self_cache, "memory": cache["memory"]}

    def step_function(self, memory, memory_mask, max_length, fixed_length=False):
        """`(next_logits, cache)` for a search, the memory kept out of the search's cache.

        The memory part (cross-attention keys/values, padding bias), the fused kernels and
        the position table are computed once here and captured by `next_logits`, so a
        beam search neither tiles nor reorders them; `cache` holds the self-attention
        keys/values only. `search_step` passes the memory as an argument instead; the
        searches' `drop_finished=True` (finished sentences leave the batch) needs it, and
        refuses this step.

        Args:
            memory: `(B, S, d_model)` from `encode`.
            memory_mask: bool `(B, S)`.
            max_length: int, the number of decoder positions (the position table's size).
            fixed_length: bool, a self-attention cache of `max_length` positions written in
                place at each step (`(N, H, T_max, d_k)`, unwritten positions masked)
                instead of a growing one: every shape in the loop is then static, which XLA
                compilation needs. Defaults to `False`.

        Returns:
            `(next_logits(tokens (N, 1), cache, index) -> (logits (N, V), cache), cache)`.
        """
        step, cache, memory_state = self.search_step(memory, memory_mask, max_length,
                                                     fixed_length)

        def next_logits(tokens, cache, index):
            return step(tokens, cache, index, memory_state)

        from keras_transformer.decoding import utils as decoding_utils

        # The memory's B rows are held here: the searches refuse `drop_finished=True`.
        setattr(next_logits, decoding_utils.HOLDS_EXAMPLE_ROWS, True)
        return next_logits, cache

    def search_step(self, memory, memory_mask, max_length, fixed_length=False,
                    cache_layout=None, cache_length=None):
        """`step_function` with the memory as the step's fourth argument.

        For the searches' `sentence_cache` (with `drop_finished`, finished sentences leave
        the batch, their memory rows with them): nothing with a batch axis is captured.

        Args:
            memory, memory_mask, max_length, fixed_length: as in `step_function`.
            cache_length: with `fixed_length`, the fixed cache's positions, an int or an
                int32 scalar tensor at most `max_length` (XLA needs it known when it
                compiles, e.g. computed from the source's shape), for a caller that knows
                the search writes no position past it (its `max_lengths`): the loop reads
                and reorders that many positions a step instead of `max_length`. Defaults to
                `None` (`max_length`).
            cache_layout: `None` (the growing or fixed cache) or a
                `decoding.InPlaceCache`: the self-attention keys/values in its time-major
                buffers written in place (`max_length` positions, one buffer per block
                for keys and one for values); the cache is then that layout's, and the
                search must get the same object as `cache_rows`. Defaults to `None`.

        Returns:
            `(next_logits(tokens (N, 1), cache, index, memory_state) -> (logits (N, V),
            cache), cache, memory_state)`, `memory_state` with `B` rows (`N = B * K` for
            `K` adjacent beams per sentence).
        """
        embedding = self.target_embedding
        if embedding.learned_positions and max_length > embedding.max_length:
            # The table would be shorter than the search: an out-of-range position is an
            # error deep in the loop, or clamped into the last one under XLA.
            raise ValueError(
                f"A search of max_length={max_length} positions is past the learned position "
                f"table of {embedding.max_length} positions of {embedding.name}: pass "
                f"max_length <= {embedding.max_length}."
            )
        memory_state = self.memory_state(memory, memory_mask)
        weights = self._step_weights()
        table = self._position_table(max_length)  # (T_max, d_model)
        if cache_length is not None and not fixed_length:
            raise ValueError("`cache_length` sizes the fixed cache: it needs "
                             "`fixed_length=True`.")
        if isinstance(cache_length, int) and not 1 <= cache_length <= max_length:
            # A tensor is the caller's to bound: XLA would clamp a write past the end.
            raise ValueError(f"`cache_length` must be in [1, max_length={max_length}], got "
                             f"{cache_length}.")
        fixed = (max_length if cache_length is None else cache_length) if fixed_length else None

        if cache_layout is not None:
            if fixed_length:
                raise ValueError("`cache_layout` and `fixed_length=True` exclude each other.")
            shapes = [(block._self_attention.num_heads, block._self_attention._head_dim)
                      for block in self.decoder.blocks for _ in ("keys", "values")]
            cache = cache_layout.initial(ops.shape(memory)[0], max_length, shapes,
                                         memory.dtype)
        else:
            cache = {"self": self._empty_self_cache(memory, 0 if fixed is None else fixed)}

        def next_logits(tokens, cache, index, memory_state):
            positions = ops.slice(table, (ops.cast(index, "int32"), 0),
                                  (1, ops.shape(table)[1]))  # (1, d_model)
            if cache_layout is not None:  # the layout's cache is the whole cache
                return self._step(tokens, cache, memory_state, index, weights, positions,
                                  layout=cache_layout)
            logits, self_cache = self._step(
                tokens, cache["self"], memory_state, index, weights, positions, fixed
            )
            return logits, {"self": self_cache}

        return next_logits, cache, memory_state

    def _step_weights(self):
        """The decoder's weights as a decoding step uses them, read once per search.

        Every projection is `(kernel, bias or None)` in the decoder's compute dtype; the
        self-attention's Q/K/V kernels are fused side by side and the queries of both
        attentions scaled by 1/sqrt(d_k) (which folds the attention scale into the
        projection); layer norms are `(gamma, beta, epsilon)` in float32, the dtype Keras'
        `LayerNormalization` computes in. Read outside the search loop, none of these costs a
        variable read, reshape or cast per step.

        Returns:
            A dict: `"blocks"` (per block a dict of its projections and norms),
            `"final_norm"` (norm weights or `None`), `"projection"` (the pre-softmax
            `(kernel, bias)`) and `"embeddings"` (the target token table, float32).
        """
        blocks = []
        for block in self.decoder.blocks:
            dtype = block.compute_dtype
            self_attention, cross_attention = block._self_attention, block._cross_attention
            feed_forward = block._feed_forward
            blocks.append({
                "self_qkv": _cast_projection(_fused_projection(
                    self_attention, ("query", "key", "value"),
                    query_scale=self_attention._head_dim ** -0.5,
                ), dtype),
                "self_output": _dense_weights(self_attention._output_dense, dtype),
                "cross_query": _cast_projection(_fused_projection(
                    cross_attention, ("query",), query_scale=cross_attention._head_dim ** -0.5
                ), dtype),
                "cross_output": _dense_weights(cross_attention._output_dense, dtype),
                "ff_inner": _dense_weights(feed_forward._inner_dense, dtype),
                "ff_output": _dense_weights(feed_forward._output_dense, dtype),
                "norms": {name: _norm_weights(getattr(block, f"_{name}_norm"))
                          for name in ("self_attention", "cross_attention", "feed_forward")},
            })
        final_norm = self.decoder._final_norm
        return {
            "blocks": blocks,
            "final_norm": None if final_norm is None else _norm_weights(final_norm),
            "projection": _cast_projection(self._projection_kernel(),
                                           self.decoder.compute_dtype),
            # `convert_to_tensor` would pass the variable itself on, read at every step.
            "embeddings": ops.copy(self.target_embedding.embeddings),
        }

    def _position_table(self, length):
        """Position encodings of positions `0 .. length - 1`, `(length, d_model)`."""
        embedding = self.target_embedding
        if embedding.learned_positions:
            return ops.convert_to_tensor(embedding.position_embeddings)[:length]
        return sinusoidal_encoding(length, embedding.d_model, dtype=embedding.compute_dtype)

    def _checked_position(self, index):
        """`index`, refused when past a learned position table: now if it is known, when
        the graph runs if not (XLA compiles the assertion away)."""
        embedding = self.target_embedding
        if not embedding.learned_positions:
            return index
        return masking.checked_position(
            index, lambda position: position < embedding.max_length,
            lambda position: [
                "A decoder step at position ", position, " is past the learned position table "
                f"of {embedding.max_length} positions of {embedding.name}: decode at most "
                f"{embedding.max_length} positions."])

    def _positions(self, index, weights):
        embedding = self.target_embedding
        if embedding.learned_positions:
            return ops.take(embedding.position_embeddings, ops.reshape(index, (1,)), axis=0)
        return sinusoidal_encoding(1, embedding.d_model, index, dtype=embedding.compute_dtype)

    def _step(self, tokens, self_cache, memory_state, index, weights, positions, fixed=None,
              layout=None):
        """The decoder on one position: `(logits (N, V), new self-attention cache)`.

        `self_cache`: per block `(keys, values)`, growing or of `fixed` positions; with a
        `layout` (`decoding.InPlaceCache`), that layout's cache.
        """
        embedding = self.target_embedding
        # The table is float32: compute in the policy's dtype, as the layers do.
        x = ops.cast(ops.take(weights["embeddings"], ops.reshape(ops.cast(tokens, "int32"),
                                                                  (-1,)), axis=0),
                     embedding.compute_dtype)  # (N, d)
        if embedding.scale_embeddings:
            x = x * ops.cast(math.sqrt(embedding.d_model), x.dtype)
        x = x + ops.cast(positions, x.dtype)  # (N, d)
        # A fixed-size cache hides the positions not written yet: (1, 1, 1, T_max).
        self_bias = None if fixed is None else ops.where(
            ops.arange(fixed)[None, None, None, :] <= ops.cast(index, "int32"),
            0.0, masking.large_negative("float32"))
        new_cache = []
        if layout is None:
            block_caches, store = self_cache, None
        else:
            buffers = self_cache["buffers"]
            block_caches = tuple(zip(buffers[::2], buffers[1::2]))
            store = (layout, layout.plan(self_cache, index, ops.shape(x)[0]))
        # The K beams of a sentence attend its memory (B rows) together.
        memory_bias = memory_state["bias"]  # (B, 1, S, 1, 1)
        sentences = ops.shape(memory_bias)[0]
        for block, block_weights, block_cache, cross in zip(
            self.decoder.blocks, weights["blocks"], block_caches, memory_state["cross"]
        ):
            x, block_cache = _decoder_block_step(
                block, block_weights, x, block_cache, cross, memory_bias, sentences, index,
                self_bias, store
            )
            new_cache.append(block_cache)
        if weights["final_norm"] is not None:
            x = _layer_norm(x, weights["final_norm"])
        logits = ops.cast(_linear(x, *weights["projection"]), "float32")  # (N, V)
        if layout is None:
            return logits, tuple(new_cache)
        buffers = tuple(buffer for keys_values in new_cache for buffer in keys_values)
        return logits, layout.finish(store[1], self_cache, buffers)

    def full_logits(self, decoder_tokens, memory, memory_mask):
        """Uncached reference: logits `(B, T, V)` for a whole prefix, recomputed from scratch."""
        embedded = self.target_embedding(decoder_tokens, training=False)
        hidden = self.decoder(
            embedded,
            memory,
            padding_mask=ops.not_equal(decoder_tokens, 0),
            encoder_padding_mask=memory_mask,
            training=False,
            skip_padding=False,  # a reference of every position, XLA or not
        )
        return self.project(hidden)


def _fused_projection(attention, names, query_scale=None):
    """The kernels (and biases) of `attention`'s projections `names`, side by side.

    Args:
        attention: a built `MultiHeadAttention`.
        names: projections among `"query"`, `"key"`, `"value"`.
        query_scale: float or `None`, multiplies the query kernel and bias.

    Returns:
        `(kernel (d_in, len(names) * H * d_k), bias or None)`.
    """
    kernels, biases = [], []
    for name in names:
        dense = getattr(attention, f"_{name}_dense")
        kernel = ops.convert_to_tensor(dense.kernel)
        bias = ops.convert_to_tensor(dense.bias) if dense.use_bias else None
        if name == "query" and query_scale is not None:
            kernel = kernel * query_scale
            bias = None if bias is None else bias * query_scale
        kernels.append(kernel)
        biases.append(bias)
    kernel = kernels[0] if len(kernels) == 1 else ops.concatenate(kernels, axis=-1)
    if biases[0] is None:
        return kernel, None
    return kernel, (biases[0] if len(biases) == 1 else ops.concatenate(biases, axis=-1))


def _linear(x, kernel, bias):
    """`x @ kernel + bias` in `x`'s dtype (a `BiasAdd`, which TensorFlow fuses into the
    matmul; a cast of a kernel already in that dtype adds no op)."""
    y = ops.matmul(x, ops.cast(kernel, x.dtype))
    return y if bias is None else ops.add(y, ops.cast(bias, x.dtype))


def _cast_projection(projection, dtype):
    """`(kernel, bias or None)` cast to `dtype`."""
    kernel, bias = projection
    return ops.cast(kernel, dtype), None if bias is None else ops.cast(bias, dtype)


def _dense_weights(dense, dtype):
    """A `Dense` layer's `(kernel, bias or None)` in `dtype`."""
    return _cast_projection((ops.convert_to_tensor(dense.kernel),
                             ops.convert_to_tensor(dense.bias) if dense.use_bias else None),
                            dtype)


def _norm_weights(norm):
    """A `LayerNormalization`'s `(gamma, beta, epsilon)`, float32 (`None` where it has
    none); only a norm over the last axis, without RMS scaling, as the blocks build."""
    if norm.rms_scaling or norm.axis not in (-1, [-1]):
        raise NotImplementedError(f"The decoding step has no form of {norm.name}'s "
                                  "LayerNormalization (RMS scaling or an axis but the last).")
    gamma = None if norm.gamma is None else ops.cast(norm.gamma, "float32")
    beta = None if norm.beta is None else ops.cast(norm.beta, "float32")
    return gamma, beta, norm.epsilon


def _layer_norm(x, norm):
    """Keras' `LayerNormalization` over the last axis with `_norm_weights` read once per
    search: in float32, as that layer computes, the result in `x`'s dtype.

    Nine ops where the layer's call has about sixteen (it reads and reshapes its weights
    every time); the same arithmetic up to rounding (`(x - mean) * (inv * gamma) + beta`
    where the layer computes `x * (inv * gamma) + (beta - mean * inv * gamma)`).
    """
    gamma, beta, epsilon = norm
    y = ops.cast(x, "float32")
    mean = ops.mean(y, axis=-1, keepdims=True)
    centered = y - mean
    variance = ops.mean(ops.square(centered), axis=-1, keepdims=True)
    scale = ops.rsqrt(variance + epsilon)
    if gamma is not None:
        scale = scale * gamma
    y = centered * scale
    if beta is not None:
        y = y + beta
    return ops.cast(y, x.dtype)


def _elementwise_attention(queries, keys, values, axis, bias=None, keepdims=False):
    """softmax(Q K^T + bias) V for a few queries per row, with elementwise products and sums.

    For one query (or the K of a sentence's beams) the batched matmuls and the softmax that
    TensorFlow hands to oneDNN cost a fixed ~100-200 us each (measured with
    benchmarks/profile_decoder.py), more than the arithmetic. `queries` (already scaled)
    broadcast against `keys` and `values`, whose key positions lie on `axis`; the logits
    (float32) keep a trailing axis of 1 in place of `d_k`, so that neither they nor the
    weights need a reshape, and `bias` broadcasts against them.

    Returns:
        The weighted values, summed over `axis` (kept with `keepdims`).
    """
    logits = ops.sum(ops.cast(queries, "float32") * ops.cast(keys, "float32"), axis=-1,
                     keepdims=True)
    if bias is not None:
        logits = logits + bias
    logits = logits - ops.max(logits, axis=axis, keepdims=True)
    exp = ops.exp(logits)
    weights = ops.cast(exp / ops.sum(exp, axis=axis, keepdims=True), values.dtype)
    return ops.sum(weights * values, axis=axis, keepdims=keepdims)


def _decoder_block_step(block, weights, x, self_cache, cross, memory_bias, sentences, index,
                        self_bias=None, store=None):
    """One `DecoderBlock` on `(N, d)` rows, with `weights` from `TransformerParts._step_weights`.

    The block's arithmetic at inference (dropout is the identity), written for one position
    with no reshape whose shape is computed per step. The self-attention cache grows by
    concatenation, or with `self_bias` (the mask of the written positions of a fixed-size
    cache) is written in place at `index`, or with `store` (`(InPlaceCache, its plan for
    this step)`) is a pair of time-major buffers written in place by that layout.
    `sentences`: the memory's rows `B` (`N = B * K` for `K` adjacent beams per sentence).

    Returns:
        `(x (N, d), (keys, values))`, `(N, H, t + 1, d_k)`, the fixed size or the buffers.
    """
    self_attention = block._self_attention
    num_heads, head_dim = self_attention.num_heads, self_attention._head_dim
    width = num_heads * head_dim
    norms = weights["norms"]

    def self_attend(h):
        if store is not None:
            layout, plan = store
            qkv = ops.reshape(_linear(h, *weights["self_qkv"]), (-1, 3, num_heads, head_dim))
            queries, new_keys, new_values = ops.unstack(qkv, axis=1)  # (N, H, d_k) each
            keys = layout.append(plan, self_cache[0], new_keys)  # (T_max * R, H, d_k)
            values = layout.append(plan, self_cache[1], new_values)
            # (N, H, d_k) queries over time-major (t, N, H, d_k) keys and values.
            outputs = _elementwise_attention(
                queries, layout.read(plan, keys), layout.read(plan, values), axis=0
            )  # (N, H, d_k)
        else:
            qkv = ops.reshape(_linear(h, *weights["self_qkv"]),
                              (-1, 3, num_heads, 1, head_dim))
            queries, new_keys, new_values = ops.unstack(qkv, axis=1)  # (N, H, 1, d_k) each
            if self_bias is None:
                keys = ops.concatenate([self_cache[0], new_keys], axis=2)  # (N, H, t + 1, d_k)
                values = ops.concatenate([self_cache[1], new_values], axis=2)
            else:
                zero = ops.zeros((), "int32")
                start = [zero, zero, ops.cast(index, "int32"), zero]
                keys = ops.slice_update(self_cache[0], start, new_keys)  # (N, H, T_max, d_k)
                values = ops.slice_update(self_cache[1], start, new_values)
            outputs = _elementwise_attention(
                queries, keys, values, axis=-2, keepdims=True,
                bias=None if self_bias is None else ops.swapaxes(self_bias, -1, -2),
            )  # (N, H, 1, d_k) over (N, H, t, d_k)
        outputs = _linear(ops.reshape(outputs, (-1, width)), *weights["self_output"])
        return outputs, (keys, values)

    def cross_attend(h):
        # The K beams of a sentence attend its memory together, in a layout that needs no
        # transpose.
        memory_keys, memory_values = cross  # (B, 1, S, H, d_k)
        queries = ops.reshape(_linear(h, *weights["cross_query"]),
                              (sentences, -1, 1, num_heads, head_dim))  # (B, K, 1, H, d_k)
        outputs = _elementwise_attention(queries, memory_keys, memory_values, axis=-3,
                                         bias=memory_bias)  # (B, K, H, d_k)
        return _linear(ops.reshape(outputs, (-1, width)), *weights["cross_output"])

    def feed_forward(h):
        return _feed_forward_step(block, weights["ff_inner"], weights["ff_output"], h)

    x, (new_cache,) = _sublayer_step(block, "self_attention", norms["self_attention"], x,
                                     self_attend)
    x, _ = _sublayer_step(block, "cross_attention", norms["cross_attention"], x, cross_attend)
    x, _ = _sublayer_step(block, "feed_forward", norms["feed_forward"], x, feed_forward)
    return x, new_cache


def _sublayer_step(block, name, norm, x, function):
    """A block's sub-layer `name` at inference: `function` with the block's own residual,
    dropout (the identity) and norm, before (`norm_first`) or after it, the norm computed
    with the `_norm_weights` `norm` its caller read once."""
    return sublayer_connection(x, function, lambda y: _layer_norm(y, norm),
                               getattr(block, f"_{name}_dropout"), block.norm_first,
                               training=False)


def _feed_forward_step(block, inner, outer, h):
    """A block's feed-forward layer on rows `h`, with its `_dense_weights` read once."""
    return _linear(block._feed_forward._inner_dense.activation(_linear(h, *inner)), *outer)

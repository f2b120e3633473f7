"""Greedy search, with a cached decoder step or by recomputing the whole prefix.

Both searches follow one hypothesis per example and pick the next token with a selection
function (argmax for greedy search; `sampling.sample` reuses the same loop with a sampler).
PAD and START (and UNK when `unk_id` is given) are masked before the choice.
"""

import tensorflow as tf

from keras_transformer.decoding import utils


def greedy_token(log_probs, step):
    """Selects the most likely token, the lowest id on ties (like `tf.math.top_k`).

    Args:
        log_probs: float32 `(B, V)`, forbidden tokens already masked.
        step: int32 scalar, unused.

    Returns:
        int32 `(B,)`.
    """
    del step
    return tf.math.top_k(log_probs, k=1).indices[:, 0]


def _advance(step, next_token, log_probs, state, bounds, end_id, pad_id):
    """Appends one token to every unfinished hypothesis and updates the bookkeeping.

    Args:
        step: int32 scalar, the output position being written (0 = first generated).
        next_token: int32 `(B,)`, the selected tokens.
        log_probs: float32 `(B, V)`, the model's log-probabilities at this step.
        state: tuple `(tokens (B, T), scores (B,), lengths (B,), finished (B,))`.
        bounds: int32 `(B,)`, per-example bounds on the number of generated tokens.
        end_id: int, the END token.
        pad_id: int, written after END.

    Returns:
        `(next_token (B,), state)` with `pad_id` fed to already-finished rows.
    """
    tokens, scores, lengths, finished = state
    # The selected token's log-probability, before PAD replaces it in finished rows (a
    # `pad_id` outside the vocabulary has none).
    token_log_prob = tf.gather(log_probs, next_token, batch_dims=1)  # (B,)
    next_token = tf.where(finished, pad_id, next_token)  # (B,)
    scores = scores + tf.where(finished, 0.0, token_log_prob)
    lengths = lengths + tf.cast(tf.logical_not(finished), tf.int32)
    tokens = utils.write_column(tokens, step, next_token)  # (B, T)
    # An example ends with END or when it has generated its bound of tokens.
    finished = finished | tf.equal(next_token, end_id) | (step + 1 >= bounds)
    return next_token, (tokens, scores, lengths, finished)


def _initial_state(batch_size, max_length, pad_id):
    """`(tokens, scores, lengths, finished)` before the first step."""
    return (
        tf.fill([batch_size, max_length], tf.constant(pad_id, tf.int32)),
        tf.zeros([batch_size], tf.float32),
        tf.zeros([batch_size], tf.int32),
        tf.zeros([batch_size], tf.bool),
    )


def _state_invariants(max_length):
    return (
        tf.TensorShape([None, max_length]),
        tf.TensorShape([None]),
        tf.TensorShape([None]),
        tf.TensorShape([None]),
    )


def _result(state):
    tokens, scores, lengths, _ = state
    return utils.SearchResult(
        tokens=tokens, scores=scores, lengths=lengths, normalized_scores=scores
    )


def decode_single_path(
    next_logits,
    initial_cache,
    batch_size,
    max_length,
    select_token,
    start_id=1,
    end_id=2,
    pad_id=0,
    max_lengths=None,
    unk_id=None,
    sentence_cache=None,
    drop_finished=False,
    cache_rows=None,
):
    """Runs one hypothesis per example, choosing each token with `select_token`.

    The loop used by `greedy_search` and `sampling.sample`: a `tf.while_loop` of at most
    `max_length` steps that stops as soon as every example has finished (produced END or
    reached its bound in `max_lengths`).

    Args:
        next_logits: callable `(tokens (N, 1), cache, index) -> (logits (N, V), cache)`,
            with a fourth argument, the sentence cache, when `sentence_cache` is given.
        initial_cache: nest of tensors with leading axis `B`.
        batch_size: int or int32 scalar tensor, `B`.
        max_length: int, the static number of steps.
        select_token: callable `(log_probs (B, V), step) -> int32 (B,)`; the forbidden
            tokens of `log_probs` are `NEG_INF` already.
        start_id: int, the token fed at position 0. Defaults to `1`.
        end_id: int, the token that ends a hypothesis. Defaults to `2`.
        pad_id: int, written after END. Defaults to `0`.
        max_lengths: optional int `(B,)` (or one int for all), per-example bounds on the
            number of generated tokens, clipped to `[1, max_length]`. Defaults to
            `max_length` for all.
        unk_id: int or `None`, a token never produced besides PAD and START (UNK).
            Defaults to `None`.
        sentence_cache: optional nest of tensors with leading axis `B` that the steps read
            but do not change (an encoder's memory); passed to `next_logits` as its fourth
            argument. Defaults to `None`.
        drop_finished: bool, finished examples leave the batch (see `greedy_search`); then
            `select_token` must not depend on a row's position. Defaults to `False`.
        cache_rows: how the cache moves its rows (see `greedy_search`). Defaults to
            `None`, every tensor's leading axis.

    Returns:
        A `SearchResult` with `tokens (B, max_length)`, `scores (B,)`, `lengths (B,)`.
    """
    max_length = utils.check_max_length(max_length)
    utils.check_drop_finished(next_logits, drop_finished)
    forbidden = utils.forbidden_ids(start_id, end_id, pad_id, unk_id)
    batch_size = tf.convert_to_tensor(batch_size, tf.int32)
    bounds = utils.resolve_max_lengths(max_lengths, batch_size, max_length)  # (B,)
    cache_rows = cache_rows or utils.BatchMajorRows()
    cache = utils.to_tensors(initial_cache)
    sentences = utils.to_tensors(sentence_cache if sentence_cache is not None else {})
    first_tokens = tf.fill([batch_size, 1], tf.constant(start_id, tf.int32))  # (B, 1)
    state = _initial_state(batch_size, max_length, pad_id)

    def step_fn(last_tokens, cache, sentences, state, bounds, step):
        if sentence_cache is None:
            logits, cache = next_logits(last_tokens, cache, step)
        else:
            logits, cache = next_logits(last_tokens, cache, step, sentences)
        logits = tf.cast(logits, tf.float32)  # (N, V)
        log_probs = utils.mask_tokens(tf.nn.log_softmax(logits, axis=-1), forbidden)  # (N, V)
        chosen = tf.cast(select_token(log_probs, step), tf.int32)  # (N,)
        chosen, state = _advance(step, chosen, log_probs, state, bounds, end_id, pad_id)
        return chosen[:, None], cache, state

    def cond(step, unused_tokens, unused_cache, unused_sentences, state, *unused):
        return tf.logical_not(tf.reduce_all(state[3]))

    # The rows still decoded: `rows[n]` is the example of row `n` (all of them unless
    # `drop_finished`), `output` the finished examples' results at their own index.
    rows = tf.range(batch_size)
    output = state[:3]
    invariants = (
        tf.TensorShape([]),
        tf.TensorShape([None, 1]),
        cache_rows.shape_invariants(cache),
        utils.relaxed_batch_shapes(sentences),
        _state_invariants(max_length),
    )
    if not drop_finished:
        def body(step, last_tokens, cache, sentences, state):
            last_tokens, cache, state = step_fn(last_tokens, cache, sentences, state,
                                                bounds, step)
            return step + 1, last_tokens, cache, sentences, state

        _, _, _, _, state = tf.while_loop(
            cond, body, loop_vars=(tf.constant(0, tf.int32), first_tokens, cache, sentences,
                                   state),
            shape_invariants=invariants, maximum_iterations=max_length,
        )
        return _result(state)

    def body(step, last_tokens, cache, sentences, state, bounds, rows, output):
        last_tokens, cache, state = step_fn(last_tokens, cache, sentences, state, bounds, step)
        active = (last_tokens, sentences, state, bounds, rows)
        active, _, cache, output = utils.drop_done_rows(
            active, output, rows, state[3], state[:3], cache=cache, cache_rows=cache_rows)
        last_tokens, sentences, state, bounds, rows = active
        return step + 1, last_tokens, cache, sentences, state, bounds, rows, output

    loop = tf.while_loop(
        cond, body,
        loop_vars=(tf.constant(0, tf.int32), first_tokens, cache, sentences, state, bounds,
                   rows, output),
        shape_invariants=invariants + (
            tf.TensorShape([None]), tf.TensorShape([None]), _state_invariants(max_length)[:3]
        ),
        maximum_iterations=max_length,
    )
    state, rows, output = loop[4], loop[6], loop[7]
    tokens, scores, lengths = utils.scatter_rows(output, rows, state[:3])
    return utils.SearchResult(
        tokens=tokens, scores=scores, lengths=lengths, normalized_scores=scores
    )


def greedy_search(
    next_logits,
    initial_cache,
    batch_size,
    max_length,
    start_id=1,
    end_id=2,
    pad_id=0,
    max_lengths=None,
    unk_id=None,
    sentence_cache=None,
    drop_finished=False,
    cache_rows=None,
):
    """Greedy decoding: the most likely token at every step, with a cached decoder step.

    Position 0 holds `start_id`; step `i` feeds the token at position `i` and receives the
    logits of position `i + 1`. An example finishes when it emits `end_id` or when it has
    generated `max_lengths[b]` tokens; finished examples are fed `pad_id` and their
    outputs ignored. The `tf.while_loop` stops when every example has finished, yet the
    output shapes stay `(B, max_length)`, so the search traces once with an unknown
    batch size and can be saved into a SavedModel. PAD and START are never chosen (their
    log-probabilities are masked before the argmax), nor UNK when `unk_id` is given.

    Args:
        next_logits: callable `(tokens, cache, index) -> (logits, cache)`: `tokens` int32
            `(B, 1)`, the token at position `index`; `cache` a nest of tensors with
            leading axis `B`; `index` an int32 scalar; `logits` float `(B, V)` for
            position `index + 1`; the returned cache keeps the structure and shapes.
        initial_cache: nest of tensors with leading axis `B` (may be empty, `{}`).
        batch_size: int or int32 scalar tensor (`tf.shape(x)[0]`), `B`.
        max_length: int, the static number of steps: the size of the cache's time axis
            and of the output buffer.
        start_id: int, the START token. Defaults to `1`.
        end_id: int, the END token. Defaults to `2`.
        pad_id: int, the padding written after END. Defaults to `0`.
        max_lengths: optional int `(B,)` (or one int for all), per-example bounds on the
            number of generated tokens (END included), clipped to `[1, max_length]`.
            Defaults to `None` (`max_length` for every example).
        unk_id: int or `None`, the UNK token, never produced when given (CTranslate2's
            `disable_unk`). Defaults to `None`: these searches do not know the vocabulary,
            so they forbid only PAD and START; `Translator` passes UNK (its
            `DecodingConfig.disable_unk` defaults to `True`).
        sentence_cache: optional nest of tensors with leading axis `B` that the steps read
            but never change, such as the encoder's memory; `next_logits` then receives it
            as a fourth argument, `(tokens, cache, index, sentence_cache)`. Defaults to
            `None`.
        drop_finished: bool, finished examples leave the batch: at the end of every step
            at which rows finish, their results are set aside and the search goes on with
            the others (every tensor of `cache` and `sentence_cache` gathered
            to those rows), so a finished sentence stops costing compute. `next_logits`
            must then take every per-example tensor from its arguments (none captured from
            outside with `B` rows). The results are the same; the shapes in the loop are
            not static (no XLA). Defaults to `False`.
        cache_rows: how the search moves the rows of `initial_cache` (`gather(cache,
            indices)`, `shape_invariants(cache)`; beam search also `tile(cache, K)`):
            `decoding.InPlaceCache` for its time-major buffers. Defaults to `None`: every
            tensor's leading axis is the row axis (`utils.BatchMajorRows`).

    Returns:
        A `SearchResult`: `tokens` int32 `(B, max_length)` (no START, END included,
        `pad_id` afterwards), `scores` float32 `(B,)` (sum of the log-probabilities of the
        generated tokens), `lengths` int32 `(B,)` (generated tokens, END included),
        `normalized_scores` equal to `scores`.

    Example:

    >>> table = tf.math.log(tf.constant([[.1, .1, .1, .7], [.1, .1, .1, .7],
    ...                                  [.1, .1, .1, .7], [.1, .1, .7, .1]]))
    >>> def next_logits(tokens, cache, index):
    ...     return tf.gather(table, tokens[:, 0]), cache
    >>> greedy_search(next_logits, {}, 1, 4).tokens.numpy().tolist()
    [[3, 2, 0, 0]]
    """
    return decode_single_path(
        next_logits,
        initial_cache,
        batch_size,
        max_length,
        greedy_token,
        start_id=start_id,
        end_id=end_id,
        pad_id=pad_id,
        max_lengths=max_lengths,
        unk_id=unk_id,
        sentence_cache=sentence_cache,
        drop_finished=drop_finished,
        cache_rows=cache_rows,
    )


def greedy_search_uncached(
    logits_fn,
    encoder_state,
    batch_size,
    max_length,
    start_id=1,
    end_id=2,
    pad_id=0,
    max_lengths=None,
    unk_id=None,
):
    """Greedy decoding that recomputes the whole prefix every step (no cache).

    The reference path of the TensorFlow Transformer tutorial: the prefix
    `[START, y_1, ..., y_i]` grows by one token per step (a `tf.while_loop` variable
    whose time axis is `None` in its shape invariant) and the full decoder runs on it
    again, costing O(T^2) decoder positions. It gives the same outputs as `greedy_search`
    when `logits_fn` and the cached `next_logits` describe the same model, and exists for
    tests and benchmarks.

    Args:
        logits_fn: callable `(prefix_tokens, encoder_state) -> logits`, `prefix_tokens`
            int32 `(B, t)`, `logits` float `(B, t, V)`; only the last position is used.
        encoder_state: any nest passed through unchanged (for example the encoder's
            memory and mask).
        batch_size: int or int32 scalar tensor, `B`.
        max_length: int, the maximum number of generated tokens.
        start_id: int, the START token. Defaults to `1`.
        end_id: int, the END token. Defaults to `2`.
        pad_id: int, appended to finished examples. Defaults to `0`.
        max_lengths: optional int `(B,)` (or one int for all), per-example bounds clipped to
            `[1, max_length]`. Defaults to `None`.
        unk_id: int or `None`, a token never produced besides PAD and START, as in
            `greedy_search`. Defaults to `None`.

    Returns:
        A `SearchResult` as returned by `greedy_search`.

    Example:

    >>> def logits_fn(prefix, state):
    ...     return tf.one_hot(tf.fill(tf.shape(prefix), 2), 4) * 10.0
    >>> greedy_search_uncached(logits_fn, (), 2, 3).lengths.numpy().tolist()
    [1, 1]
    """
    max_length = utils.check_max_length(max_length)
    batch_size = tf.convert_to_tensor(batch_size, tf.int32)
    bounds = utils.resolve_max_lengths(max_lengths, batch_size, max_length)  # (B,)
    forbidden = utils.forbidden_ids(start_id, end_id, pad_id, unk_id)
    prefix = tf.fill([batch_size, 1], tf.constant(start_id, tf.int32))  # (B, 1)

    def cond(step, unused_prefix, state):
        return tf.logical_not(tf.reduce_all(state[3]))

    def body(step, prefix, state):
        logits = tf.cast(logits_fn(prefix, encoder_state), tf.float32)  # (B, t, V)
        log_probs = utils.mask_tokens(
            tf.nn.log_softmax(logits[:, -1, :], axis=-1), forbidden
        )  # (B, V)
        chosen = greedy_token(log_probs, step)  # (B,)
        chosen, state = _advance(step, chosen, log_probs, state, bounds, end_id, pad_id)
        prefix = tf.concat([prefix, chosen[:, None]], axis=1)  # (B, t + 1)
        return step + 1, prefix, state

    _, _, state = tf.while_loop(
        cond,
        body,
        loop_vars=(
            tf.constant(0, tf.int32),
            prefix,
            _initial_state(batch_size, max_length, pad_id),
        ),
        shape_invariants=(
            tf.TensorShape([]),
            tf.TensorShape([None, None]),
            _state_invariants(max_length),
        ),
        maximum_iterations=max_length,
    )
    return _result(state)

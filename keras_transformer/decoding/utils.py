"""Pieces shared by the searches: the result tuple, the length penalty, beam tiling.

Everything here is pure TensorFlow and shape-static in the time axis, so the searches that
use it trace once inside a `tf.function` whose batch dimension is unknown (`None`).
"""

import collections

import numpy as np
import tensorflow as tf

# A large finite negative used for impossible hypotheses and masked logits. Finite (not
# `-inf`) so that sums, divisions by the length penalty and softmaxes never give NaN.
NEG_INF = -1e9

# Log-probabilities at or below this value mark a hypothesis as impossible (it went through a
# masked logit or a dead beam slot): a real log-probability is never this small.
IMPOSSIBLE = NEG_INF / 2.0


class SearchResult(
    collections.namedtuple(
        "SearchResult", ["tokens", "scores", "lengths", "normalized_scores"]
    )
):
    """The output of every search: generated tokens and their scores.

    Fields:
        tokens: int32 `(B, max_length)` (or `(B, beam_size, max_length)` when all beams
            were asked for), the generated tokens without START, END included, `pad_id`
            after END (or after the last token when the example was stopped by its length
            bound).
        scores: float32 `(B,)`, the sum of the model's log-probabilities of the generated
            tokens, END included (unnormalized).
        lengths: int32 `(B,)`, the number of generated tokens, END included; an example
            stopped by its length bound counts the tokens it generated.
        normalized_scores: float32 `(B,)`, the score the search ranked by:
            `scores / length_penalty(lengths, alpha, form)` for beam search, equal to `scores`
            for greedy search and sampling (which apply no length penalty).
    """

    __slots__ = ()


# Set to True on a step function that holds tensors of one row per example that are not
# among its arguments (`TransformerParts.step_function` holds the encoder's memory): such a
# step cannot follow rows leaving the batch.
HOLDS_EXAMPLE_ROWS = "holds_example_rows"


def check_drop_finished(next_logits, drop_finished):
    """Refuses `drop_finished=True` for a step marked `HOLDS_EXAMPLE_ROWS`: with rows
    leaving the batch, its rows would no longer line up with the examples they belong to
    (another example's memory, no error)."""
    if drop_finished and getattr(next_logits, HOLDS_EXAMPLE_ROWS, False):
        raise ValueError(
            "drop_finished=True needs a step that takes every per-example tensor from its "
            "arguments, but this one holds the encoder's memory of every example "
            "(`TransformerParts.step_function`): use `TransformerParts.search_step` and "
            "pass its memory state as `sentence_cache=`, or drop_finished=False."
        )


def forbidden_ids(start_id, end_id, pad_id, unk_id=None):
    """The tokens a search never produces: PAD, START and, when `unk_id` is given, UNK.

    PAD only fills the positions after END and START only opens the decoder input, so a
    model that gives them probability (an undertrained one, or one whose loss never saw
    them as labels) must not get them into an output. END is never forbidden, even when it
    shares an id with one of them.

    Args:
        start_id: int, the START token.
        end_id: int, the END token.
        pad_id: int, the padding token.
        unk_id: int or `None`, the UNK token to forbid as well. Defaults to `None`.

    Returns:
        A sorted tuple of ints.

    Example:

    >>> forbidden_ids(start_id=1, end_id=2, pad_id=0, unk_id=3)
    (0, 1, 3)
    """
    ids = {pad_id, start_id} if unk_id is None else {pad_id, start_id, unk_id}
    return tuple(sorted(int(i) for i in ids - {end_id}))


def mask_tokens(scores, token_ids):
    """Sets the columns `token_ids` of `scores` to `NEG_INF`, so no search can choose them.

    The searches call it on the log-probabilities, after the softmax: the remaining tokens
    keep the model's own log-probabilities (the scores are not renormalized), as fairseq
    does for PAD. With a static vocabulary size the mask is a constant and the step costs
    one `tf.where`.

    Args:
        scores: float32 `(..., V)` logits or log-probabilities.
        token_ids: sequence of ints, the columns to mask; ids outside `[0, V)` are ignored.

    Returns:
        float32 `(..., V)`.

    Example:

    >>> mask_tokens(tf.zeros([1, 4]), (0, 1)).numpy().tolist()
    [[-1000000000.0, -1000000000.0, 0.0, 0.0]]
    """
    if not token_ids:
        return scores
    vocab_size = scores.shape[-1]
    if vocab_size is not None:
        mask = np.zeros([vocab_size], bool)
        mask[[i for i in token_ids if 0 <= i < vocab_size]] = True
        mask = tf.constant(mask)  # (V,)
    else:
        columns = tf.range(tf.shape(scores)[-1], dtype=tf.int32)[:, None]  # (V, 1)
        mask = tf.reduce_any(tf.equal(columns, tf.constant(token_ids, tf.int32)), axis=-1)
    return tf.where(mask, tf.constant(NEG_INF, scores.dtype), scores)


# `top_candidates` scans the vocabulary in chunks of this many tokens (measured on the
# reference model's 8,000 tokens; see benchmarks/RESULTS.md).
CANDIDATE_CHUNK = 16


class Candidates(collections.namedtuple("Candidates", ["log_probs", "beams", "tokens"])):
    """The best extensions of a search step, best first, per example.

    Fields:
        log_probs: float32 `(B, C)`, the extended hypothesis' log-probability.
        beams: int32 `(B, C)`, the beam it extends, in `[0, K)`.
        tokens: int32 `(B, C)`, the token it adds, in `[0, V)`.
    """

    __slots__ = ()


def top_candidates(logits, alive_log_probs, num_candidates, forbidden=()):
    """The `num_candidates` best one-token extensions of each example's beams.

    Equal to a top-k over every beam's every token, `alive_log_probs[b, k] +
    log_softmax(logits)[b * K + k, v]` with the `forbidden` tokens' log-probabilities set
    to `NEG_INF` (ties go to the lower `(beam, token)`), without building that
    `(B, K * V)` array: a top-k over it costs more than the decoder's vocabulary
    projection (benchmarks/RESULTS.md). The vocabulary is cut into chunks of
    `CANDIDATE_CHUNK` tokens; an element among the `C` best lies in a chunk whose maximum
    is among the `C + K * F` best chunk maxima of its example, `F` the number of chunks
    holding a forbidden token (a forbidden token can lead its chunk in each of the `K`
    beams; the other `C` would each hold an allowed element at least as good), so the
    top-k runs over those chunks only. The
    softmax's normalizer is still computed over the whole vocabulary, one pass.

    Greedy search keeps its plain top-1 over the log-probabilities: this function, or an
    argmax with one logsumexp, made its full steps no faster (benchmarks/RESULTS.md).

    Args:
        logits: float32 `(B * K, V)`, the step's logits, the `K` beams of an example
            adjacent.
        alive_log_probs: float32 `(B, K)`, each beam's log-probability so far (`NEG_INF`
            for a dead beam).
        num_candidates: int, `C`, at most `K * V`.
        forbidden: sequence of ints, tokens whose log-probability counts as `NEG_INF`.

    Returns:
        `Candidates`, every field `(B, C)`.

    Example:

    >>> logits = tf.math.log(tf.constant([[.1, .2, .7], [.5, .4, .1]]))
    >>> best = top_candidates(logits, tf.constant([[0.0, -1.0]]), 2)
    >>> best.beams.numpy().tolist(), best.tokens.numpy().tolist()
    ([[0, 0]], [[2, 1]])
    """
    logits = tf.convert_to_tensor(logits, tf.float32)
    alive_log_probs = tf.convert_to_tensor(alive_log_probs, tf.float32)
    beam_size = alive_log_probs.shape[-1]
    vocab_size = logits.shape[-1]
    if beam_size is None:
        raise ValueError("`top_candidates` needs a static beam size; got alive_log_probs "
                         f"of shape {alive_log_probs.shape}.")
    if vocab_size is None:  # no static vocabulary to cut into chunks: the plain top-k
        return _full_top_candidates(logits, alive_log_probs, num_candidates, forbidden)
    chunk = CANDIDATE_CHUNK
    num_chunks = -(-vocab_size // chunk)  # M, per row
    rows = tf.shape(logits)[0]
    batch_size = tf.shape(alive_log_probs)[0]
    # log_softmax(x) = (x - max) - log(sum(exp(x - max))), per row, over the whole vocabulary.
    padded = logits
    if num_chunks * chunk != vocab_size:  # padding no candidate can beat
        padded = tf.pad(logits, [[0, 0], [0, num_chunks * chunk - vocab_size]],
                        constant_values=-np.inf)
    chunks = tf.reshape(padded, [rows, num_chunks, chunk])  # (N, M, S)
    chunk_max = tf.reduce_max(chunks, axis=-1)  # (N, M)
    row_max = tf.reduce_max(chunk_max, axis=-1)  # (N,)
    log_sum = tf.math.log(tf.reduce_sum(tf.exp(logits - row_max[:, None]), axis=-1))  # (N,)
    alive = tf.reshape(alive_log_probs, [-1])  # (N,)
    # Chunks ranked by their best token's score; the best `C + K * F` kept (see above), in
    # index order, so that the last top-k breaks ties as a top-k over everything would.
    chunk_scores = tf.reshape(
        alive[:, None] + ((chunk_max - row_max[:, None]) - log_sum[:, None]),
        [batch_size, beam_size * num_chunks])  # (B, K * M)
    forbidden_chunks = len({token // chunk for token in forbidden})
    kept = min(num_candidates + beam_size * forbidden_chunks, beam_size * num_chunks)
    _, best_chunks = tf.math.top_k(chunk_scores, k=kept)
    best_chunks = tf.sort(best_chunks, axis=-1)  # (B, kept)
    beams = best_chunks // num_chunks  # (B, kept)
    row_chunks = best_chunks % num_chunks  # (B, kept), the chunk's place in its row
    source_rows = tf.range(batch_size)[:, None] * beam_size + beams  # (B, kept)
    values = tf.gather(tf.reshape(chunks, [-1, chunk]),
                       source_rows * num_chunks + row_chunks)  # (B, kept, S)
    tokens = row_chunks[:, :, None] * chunk + tf.range(chunk)  # (B, kept, S)
    log_probs = (values - tf.gather(row_max, source_rows)[:, :, None]) - tf.gather(
        log_sum, source_rows)[:, :, None]
    if forbidden:
        banned = tf.reduce_any(tf.equal(tokens[:, :, :, None], tf.constant(forbidden, tf.int32)),
                               axis=-1)
        # -inf stays -inf (padding), as `mask_tokens` would never have seen it.
        log_probs = tf.where(banned & (values > -np.inf), NEG_INF, log_probs)
    scores = tf.gather(alive, source_rows)[:, :, None] + log_probs  # (B, kept, S)
    top_scores, positions = tf.math.top_k(tf.reshape(scores, [batch_size, kept * chunk]),
                                          k=num_candidates)  # (B, C)
    return Candidates(
        log_probs=top_scores,
        beams=tf.gather(beams, positions // chunk, batch_dims=1),
        tokens=tf.gather(tf.reshape(tokens, [batch_size, -1]), positions, batch_dims=1),
    )


def _full_top_candidates(logits, alive_log_probs, num_candidates, forbidden):
    """`top_candidates` by a top-k over the whole `(B, K * V)` array."""
    batch_size, beam_size = tf.shape(alive_log_probs)[0], alive_log_probs.shape[-1]
    vocab_size = tf.shape(logits)[-1]
    log_probs = mask_tokens(tf.nn.log_softmax(logits, axis=-1), forbidden)
    scores = alive_log_probs[:, :, None] + tf.reshape(log_probs, [batch_size, beam_size, -1])
    top_scores, indices = tf.math.top_k(tf.reshape(scores, [batch_size, -1]), k=num_candidates)
    return Candidates(log_probs=top_scores, beams=indices // vocab_size,
                      tokens=indices % vocab_size)


LENGTH_PENALTY_FORMS = ("gnmt", "power")


def check_length_penalty_form(form):
    """Raises `ValueError` unless `form` is one of `LENGTH_PENALTY_FORMS`."""
    if form not in LENGTH_PENALTY_FORMS:
        raise ValueError(f"length_penalty_form must be one of {LENGTH_PENALTY_FORMS}, got "
                         f"length_penalty_form={form!r}.")


def length_penalty(length, alpha, form="gnmt"):
    """The length penalty beam search divides a hypothesis' log-probability by.

    `"gnmt"`: `((5 + length) / 6) ** alpha` (Wu et al., 2016). `"power"`: `length **
    alpha`, CTranslate2's `length_penalty` (an average log-probability at `alpha = 1`).
    With `alpha > 0` longer hypotheses are penalized less for their extra (negative)
    log-probability terms; `alpha = 0` gives 1 (no normalization).

    Args:
        length: int or float tensor of any shape, the number of generated tokens, at least
            1 (beam search counts END, as CTranslate2 does).
        alpha: float or float32 scalar tensor, the strength of the penalty.
        form: str, `"gnmt"` or `"power"`. Defaults to `"gnmt"`.

    Returns:
        A float32 tensor with the shape of `length`.

    Example:

    >>> float(length_penalty(1, 1.0))
    1.0
    >>> float(length_penalty(4, 0.5, form="power"))
    2.0

    References:
        Wu et al., 2016, "Google's Neural Machine Translation System", eq. 14.
    """
    check_length_penalty_form(form)
    length = tf.cast(length, tf.float32)
    alpha = tf.cast(alpha, tf.float32)
    if form == "power":
        return tf.pow(length, alpha)
    return tf.pow((5.0 + length) / 6.0, alpha)


def tile_beams(nest, beam_size):
    """Repeats every tensor of a nest `beam_size` times along its leading (batch) axis.

    Example `b`'s copies end up adjacent: rows `b * beam_size ... b * beam_size + K - 1`,
    the layout `gather_beams` and `beam_search` assume.

    Args:
        nest: a nest (dict, tuple, list) of tensors whose leading axis is `B`.
        beam_size: int, the number of beams `K`.

    Returns:
        The same nest with each tensor of leading axis `B * K`.

    Example:

    >>> tile_beams({"x": tf.constant([[1], [2]])}, 2)["x"].numpy().ravel().tolist()
    [1, 1, 2, 2]
    """
    return tf.nest.map_structure(
        lambda t: tf.repeat(t, beam_size, axis=0), nest
    )


def gather_beams(nest, beam_indices, beam_size):
    """Reorders the beams of a flat `(B * K, ...)` nest.

    Args:
        nest: a nest of tensors whose leading axis is `B * K` (beams of one example
            adjacent, as `tile_beams` lays them out).
        beam_indices: int32 `(B, K)`, for every new beam the index (in `[0, K)`) of the
            beam of the same example it comes from.
        beam_size: int, `K`.

    Returns:
        The nest with row `b * K + j` taken from row `b * K + beam_indices[b, j]`.
    """
    return BatchMajorRows().gather(nest, beam_rows(beam_indices, beam_size))


def beam_rows(beam_indices, beam_size):
    """The flat rows `(B * K,)` of a beam reorder: `b * K + beam_indices[b, j]`."""
    batch_size = tf.shape(beam_indices)[0]
    offsets = tf.range(batch_size, dtype=tf.int32)[:, None] * beam_size  # (B, 1)
    return tf.reshape(beam_indices + offsets, [-1])  # (B*K,)


def resolve_max_lengths(max_lengths, batch_size, max_length):
    """Per-example bounds on the number of generated tokens, clipped to `[1, max_length]`.

    Args:
        max_lengths: `None`, an int (one bound for every example) or int `(B,)`.
        batch_size: int or int32 scalar tensor, `B`.
        max_length: int, the static number of decoding steps.

    Returns:
        int32 `(B,)`.

    Raises:
        ValueError: when `max_lengths` is neither a number nor one bound per example (as
            far as the shapes are known before the graph runs).
    """
    if max_lengths is None:
        return tf.fill([batch_size], tf.constant(max_length, tf.int32))
    max_lengths = tf.cast(max_lengths, tf.int32)
    static_batch = tf.get_static_value(batch_size)
    rank = max_lengths.shape.rank
    if rank not in (0, 1, None) or (
            rank == 1 and static_batch is not None
            and max_lengths.shape[0] not in (None, int(static_batch))):
        raise ValueError(
            "`max_lengths` must be one bound for every example or one per example, shape "
            f"({static_batch},); got shape {tuple(max_lengths.shape)}."
        )
    if rank == 0:
        max_lengths = tf.fill([batch_size], max_lengths)
    return tf.clip_by_value(max_lengths, 1, max_length)


def check_max_length(max_length):
    """Returns `max_length` as a Python int, or raises `ValueError`."""
    if isinstance(max_length, tf.Tensor):
        raise ValueError(
            "`max_length` must be a Python int (it fixes the static shapes of the "
            f"search); received the tensor {max_length}. Pass a per-example bound "
            "through `max_lengths` instead."
        )
    if isinstance(max_length, bool) or int(max_length) != max_length:
        raise ValueError(f"`max_length` must be a Python int, received {max_length!r}.")
    max_length = int(max_length)
    if max_length < 1:
        raise ValueError(f"`max_length` must be at least 1, received {max_length}.")
    return max_length


def write_column(buffer, step, values):
    """Writes `values` at time position `step` of a `(..., T)` buffer.

    Args:
        buffer: a tensor `(..., T)`.
        step: int32 scalar, the position to write.
        values: a tensor `(...)` with the leading shape of `buffer`.

    Returns:
        The updated buffer (same shape).
    """
    max_length = buffer.shape[-1]
    at_step = tf.equal(tf.range(max_length, dtype=tf.int32), step)  # (T,)
    return tf.where(at_step, values[..., None], buffer)


def relaxed_batch_shapes(nest):
    """`tf.TensorShape` invariants with the leading (batch) axis unknown.

    An axis that starts empty (size 0) is unknown as well: such a tensor grows along it
    from step to step (a key/value cache extended by concatenation).
    """

    def relaxed(tensor):
        dims = [None if size == 0 else size for size in tensor.shape.as_list()[1:]]
        return tf.TensorShape([None] + dims)

    return tf.nest.map_structure(relaxed, nest)


def to_tensors(nest):
    """Converts every leaf of a nest to a tensor."""
    return tf.nest.map_structure(tf.convert_to_tensor, nest)


def scatter_rows(output, rows, values):
    """Writes row `n` of every tensor of `values` at row `rows[n]` of `output`'s tensor.

    Args:
        output: a nest of tensors with leading axis `B` (all the examples).
        rows: int32 `(N,)`, distinct indices into `[0, B)`.
        values: a nest of `output`'s structure with leading axis `N`.

    Returns:
        `output` with those rows replaced.

    Example:

    >>> out = scatter_rows((tf.zeros([3]),), tf.constant([2, 0]), (tf.constant([5., 7.]),))
    >>> out[0].numpy().tolist()
    [7.0, 0.0, 5.0]
    """
    indices = rows[:, None]
    return tf.nest.map_structure(
        lambda old, new: tf.tensor_scatter_nd_update(old, indices, new), output, values
    )


def drop_done_rows(active, output, rows, done, results, beams=(), beam_size=1, cache=(),
                   cache_rows=None):
    """Sets the finished examples of a search aside at the step they are done.

    When some of the examples still decoded are done (and not all of them: the loop ends
    then), their `results` are written to `output` at their index in
    `rows`, and every tensor of `active` (leading axis: the examples still decoded) and of
    `beams` (leading axis: those examples' `beam_size` adjacent rows) keeps the rows of the
    examples not done, and so does `cache` (the decoder's rows, moved by `cache_rows`).
    Otherwise nothing changes. A `tf.cond`, so a step that drops nothing costs a few
    scalar ops.

    Args:
        active: nest of tensors with leading axis `N`, `rows` among them.
        output: nest of tensors with leading axis `B`, the results of finished examples.
        rows: int32 `(N,)`, the example index of each row of `active`.
        done: bool `(N,)`.
        results: nest of `output`'s structure with leading axis `N`.
        beams: nest of tensors with leading axis `N * beam_size`. Defaults to `()`.
        beam_size: int. Defaults to `1`.
        cache: the search's cache, `N * beam_size` rows. Defaults to `()`.
        cache_rows: how `cache` moves its rows (`gather(cache, indices)`). Defaults to
            `None`, `BatchMajorRows()`.

    Returns:
        `(active, beams, cache, output)`.
    """
    cache_rows = cache_rows or BatchMajorRows()
    num_done = tf.reduce_sum(tf.cast(done, tf.int32))
    num_rows = tf.size(done)
    drop = (num_done > 0) & (num_done < num_rows)

    def gather():
        kept = tf.cast(tf.reshape(tf.where(tf.logical_not(done)), [-1]), tf.int32)  # (N',)
        kept_beams = tf.reshape(
            kept[:, None] * beam_size + tf.range(beam_size, dtype=tf.int32), [-1]
        )  # (N' * K,)
        return (
            tf.nest.map_structure(lambda t: tf.gather(t, kept), active),
            tf.nest.map_structure(lambda t: tf.gather(t, kept_beams), beams),
            cache_rows.gather(cache, kept_beams),
            scatter_rows(output, rows, results),
        )

    return tf.cond(drop, gather, lambda: (active, beams, cache, output))


class BatchMajorRows:
    """How a search moves the rows of its cache when every tensor's leading axis is the
    row axis: the default `cache_rows` of the searches.

    A search tiles its cache to beams (`tile`), reorders rows (`gather`: beam reorders,
    finished sentences dropped) and states its `tf.while_loop` shape invariants
    (`shape_invariants`) through such an object, so a cache of another layout (for
    example `InPlaceCache`, time-major) brings its own.

    Example:

    >>> rows = BatchMajorRows()
    >>> cache = rows.tile({"x": tf.constant([[1], [2]])}, 2)
    >>> rows.gather(cache, tf.constant([3, 0]))["x"].numpy().ravel().tolist()
    [2, 1]
    """

    def tile(self, cache, beam_size):
        """Every row repeated `beam_size` times, copies adjacent (`tile_beams`)."""
        return tile_beams(cache, beam_size)

    def gather(self, cache, indices):
        """Row `i` of every tensor taken from row `indices[i]`."""
        return tf.nest.map_structure(lambda t: tf.gather(t, indices, axis=0), cache)

    def shape_invariants(self, cache):
        """The leading axis and every axis that starts empty unknown
        (`relaxed_batch_shapes`)."""
        return relaxed_batch_shapes(cache)

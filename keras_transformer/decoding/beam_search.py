"""Beam search with a length penalty (GNMT's or CTranslate2's) over a cached `next_logits`
step."""

import math
import numbers

import tensorflow as tf

from keras_transformer.decoding import utils


def _upper_bound(best_alive_log_prob, step, bounds, alpha, form="gnmt"):
    """The best normalized score any extension of the alive beams can still reach.

    Log-probabilities only decrease as tokens are added, and the length penalty is monotone
    in the length, so the best case is the current best alive log-probability divided by
    the largest penalty over the lengths still reachable, `step + 2 ... bounds`.

    Args:
        best_alive_log_prob: float32 `(B,)`.
        step: int32 scalar, the step just completed (its hypotheses have `step + 1` tokens).
        bounds: int32 `(B,)`, per-example bounds on the number of generated tokens.
        alpha: float, the length penalty strength.
        form: str, the length penalty's form (`utils.length_penalty`).

    Returns:
        float32 `(B,)`.
    """
    next_length = tf.minimum(step + 2, bounds)  # (B,)
    largest_penalty = tf.maximum(
        utils.length_penalty(next_length, alpha, form), utils.length_penalty(bounds, alpha, form)
    )  # (B,)
    return best_alive_log_prob / largest_penalty


def beam_search(
    next_logits,
    initial_cache,
    batch_size,
    max_length,
    beam_size=4,
    alpha=0.6,
    start_id=1,
    end_id=2,
    pad_id=0,
    max_lengths=None,
    return_all_beams=False,
    unk_id=None,
    sentence_cache=None,
    drop_finished=False,
    cache_rows=None,
    early_stopping=False,
    length_penalty_form="gnmt",
):
    """Beam search with a length penalty (GNMT's by default), keeping alive and finished hypotheses.

    The first step decodes `B` rows, one hypothesis (START) per example, as CTranslate2
    does; then every tensor of the cache is tiled to `B * beam_size` rows (beams of one
    example adjacent) and reordered with `tf.gather` after each step (or as `cache_rows`
    moves its rows). Per example the search keeps `K = beam_size` alive hypotheses and
    `K` finished ones, as GNMT, tensor2tensor and fairseq do:

    1. the alive beams are extended by every token (PAD and START masked, and UNK when
       `unk_id` is given); the `2K` best extensions by log-probability are the candidates
       (at step 0 they all extend START);
    2. a candidate that emits `end_id`, or that reaches the example's bound in
       `max_lengths`, is set aside: it competes for the finished set with score
       `log_prob / length_penalty(length, alpha)`,
       `length_penalty = ((5 + length) / 6) ** alpha` (or CTranslate2's `length ** alpha`,
       `length_penalty_form="power"`; END counts in the length either way);
    3. the `K` best remaining candidates stay alive. Each alive beam has one END
       extension, so at most `K` of the `2K` candidates end and a finished hypothesis
       never takes the place of an alive one;
    4. an example is done when it has no alive hypothesis left, or when its finished set
       is full and the worst finished score is at least the best score an alive
       hypothesis can still reach (its log-probability divided by the largest penalty it
       can still get); the `tf.while_loop` stops when every example is done.

    With `early_stopping=True` the search follows fairseq and CTranslate2 instead: a
    candidate that emits `end_id` finishes only if it ranks among the `K` best of the
    `2K` (a lower-ranked END is dropped), and an example is done as soon as `K` of its
    hypotheses have finished, without the bound of step 4. The result is then not always
    the best hypothesis the exact rule would find (a longer one might still have won under
    a length penalty), but the search stops steps earlier.

    `beam_size=1` takes a single candidate per step, which is exactly greedy search for
    any `alpha` (its candidate is the argmax, and once it emits END no alive hypothesis
    remains); with two candidates an END would let the runner-up continue and, with
    `alpha > 0`, possibly win. Dead slots carry a large finite negative log-probability, so
    no NaN appears.

    Args:
        next_logits: callable `(tokens, cache, index) -> (logits, cache)` as in
            `greedy_search`, called with `N = B` rows at index 0 (the cache as given)
            and `N = B * beam_size` rows after.
        initial_cache: nest of tensors with leading axis `B` (may be empty).
        batch_size: int or int32 scalar tensor, `B`.
        max_length: int, the static number of steps (size of the cache's time axis and of
            the output buffer).
        beam_size: int, `K`, the number of alive and of finished hypotheses. Defaults
            to `4`.
        alpha: float, the length penalty strength; `0` ranks by raw log-probability.
            Defaults to `0.6`.
        start_id: int, the START token. Defaults to `1`.
        end_id: int, the END token. Defaults to `2`.
        pad_id: int, written after END. Defaults to `0`.
        max_lengths: optional int `(B,)` (or one int for all), per-example bounds on the
            number of generated tokens, clipped to `[1, max_length]`. Defaults to `None`.
        return_all_beams: bool, return the `K` finished hypotheses of every example
            (best first) instead of the best one. Defaults to `False`.
        unk_id: int or `None`, the UNK token, never produced when given, as in
            `greedy_search`. Defaults to `None`.
        sentence_cache: optional nest of tensors with leading axis `B` (one row per
            example, not tiled to beams) that the steps read but never change, such as the
            encoder's memory; `next_logits` then receives it as a fourth argument and must
            match an example's row to its `N / B` adjacent rows (1 at index 0, then `K`).
            Defaults to `None`.
        drop_finished: bool, done examples leave the batch, as in `greedy_search`: their
            beam rows stop costing compute. Defaults to `False`.
        cache_rows: how the search tiles and reorders the rows of the cache, as in
            `greedy_search` (`decoding.InPlaceCache(ancestry=True)` reorders a table of
            row ancestries instead of the keys and values). Defaults to `None`: every
            tensor's leading axis, tiled with `tile_beams` and reordered with `tf.gather`.
        early_stopping: bool, the stopping rule above. Defaults to `False` (exact; the
            `Translator` and the exports default to `True`).
        length_penalty_form: str, `"gnmt"` or `"power"` (`utils.length_penalty`): with
            `"power"`, `early_stopping=True` and `alpha != 0` this is CTranslate2's beam
            search, whose `length_penalty` is `alpha` (at `length_penalty=0` CTranslate2
            stops as soon as its best candidate ends, another rule). Defaults to `"gnmt"`.

    Returns:
        A `SearchResult` for the best finished hypothesis of every example: `tokens` int32
        `(B, max_length)`, `scores` float32 `(B,)` (sum of log-probabilities, END
        included, not normalized), `lengths` int32 `(B,)` (END included),
        `normalized_scores` float32 `(B,)` (`scores / length_penalty(lengths, alpha,
        length_penalty_form)`, the ranking score). With `return_all_beams=True` every
        field gains a beam axis after the batch axis, sorted best first; slots that no
        hypothesis filled have `normalized_scores` and `scores` near `NEG_INF` and
        `lengths` 0.

    Example:

    >>> table = tf.math.log(tf.constant([[.1, .1, .1, .7], [.1, .1, .1, .7],
    ...                                  [.1, .1, .1, .7], [.1, .1, .7, .1]]))
    >>> def next_logits(tokens, cache, index):
    ...     return tf.gather(table, tokens[:, 0]), cache
    >>> beam_search(next_logits, {}, 1, 4, beam_size=2).tokens.numpy().tolist()
    [[3, 2, 0, 0]]

    References:
        Wu et al., 2016, "Google's Neural Machine Translation System" (length penalty);
        Vaswani et al., 2017, "Attention Is All You Need" (beam 4, alpha 0.6).
    """
    max_length = utils.check_max_length(max_length)
    utils.check_length_penalty_form(length_penalty_form)
    utils.check_drop_finished(next_logits, drop_finished)
    try:
        whole = (not isinstance(beam_size, (bool, str, bytes)) and math.isfinite(beam_size)
                 and int(beam_size) == beam_size)
    except (TypeError, ValueError, OverflowError):
        whole = False
    if not whole or beam_size < 1:
        raise ValueError(f"`beam_size` must be an int of at least 1, received {beam_size!r}.")
    beam_size = int(beam_size)
    if not isinstance(alpha, (tf.Tensor, tf.Variable)) and not (
            isinstance(alpha, numbers.Real) and math.isfinite(alpha)):
        raise ValueError(f"`alpha` must be a finite number, received {alpha!r}.")
    # 2K candidates so that K stay alive whatever ends; one for beam 1 (greedy).
    num_candidates = 2 * beam_size if beam_size > 1 else 1
    forbidden = utils.forbidden_ids(start_id, end_id, pad_id, unk_id)
    batch_size = tf.convert_to_tensor(batch_size, tf.int32)
    bounds = utils.resolve_max_lengths(max_lengths, batch_size, max_length)  # (B,)
    cache_rows = cache_rows or utils.BatchMajorRows()
    cache = utils.to_tensors(initial_cache)  # B rows: tiled after the first step
    sentences = utils.to_tensors(sentence_cache if sentence_cache is not None else {})
    # The first step extends one hypothesis per example (START), on B rows.
    alive = (
        tf.fill([batch_size, 1], tf.constant(start_id, tf.int32)),  # (B, 1)
        tf.fill([batch_size, 1, max_length], tf.constant(pad_id, tf.int32)),
        tf.zeros([batch_size, 1], tf.float32),  # (B, 1)
    )
    finished = (
        tf.fill([batch_size, beam_size, max_length], tf.constant(pad_id, tf.int32)),
        tf.fill([batch_size, beam_size], tf.constant(utils.NEG_INF, tf.float32)),  # normalized
        tf.fill([batch_size, beam_size], tf.constant(utils.NEG_INF, tf.float32)),  # log-prob
        tf.zeros([batch_size, beam_size], tf.int32),  # lengths
        tf.zeros([batch_size, beam_size], tf.bool),  # filled
    )
    done = tf.zeros([batch_size], tf.bool)

    def cond(step, unused_alive, unused_cache, unused_sentences, unused_finished, done,
             *unused):
        return tf.logical_not(tf.reduce_all(done))

    def step_fn(step, alive, cache, sentences, finished, done, bounds, first=False):
        """One step for the `B` examples still decoded (all of them unless dropping).

        The `first` step has one hypothesis per example (`alive` and `cache` with `B`
        rows) and leaves `K`: its candidates all extend that hypothesis, so the cache
        is tiled, not reordered.
        """
        last_tokens, alive_seq, alive_log_probs = alive
        if sentence_cache is None:
            logits, cache = next_logits(last_tokens, cache, step)
        else:
            logits, cache = next_logits(last_tokens, cache, step, sentences)
        logits = tf.cast(logits, tf.float32)  # (B*K, V); (B, V) at the first step
        vocab_size = logits.shape[-1]
        if first and (vocab_size is None
                      or vocab_size < num_candidates + len(forbidden)):
            # Too few tokens for 2K candidates from one hypothesis: rank the first step's
            # logits as K beams of which only the first is alive.
            logits = tf.repeat(logits, beam_size, axis=0)  # (B*K, V)
            alive_seq = tf.repeat(alive_seq, beam_size, axis=1)  # (B, K, T)
            alive_log_probs = tf.tile(
                tf.constant([[0.0] + [utils.NEG_INF] * (beam_size - 1)], tf.float32),
                [tf.shape(alive_log_probs)[0], 1])  # (B, K)
        # The C best of alive log-prob + log_softmax(logits), over every beam and token
        # (forbidden ones masked); C = 2K (1 for beam 1). Each (B, C).
        top_log_probs, source_beams, new_tokens = utils.top_candidates(
            logits, alive_log_probs, num_candidates, forbidden)
        new_seq = tf.gather(alive_seq, source_beams, batch_dims=1)  # (B, C, T)
        new_seq = utils.write_column(new_seq, step, new_tokens)  # (B, C, T)
        length = step + 1
        possible = top_log_probs > utils.IMPOSSIBLE  # (B, C)
        emits_end = tf.equal(new_tokens, end_id)  # (B, C)
        at_bound = (length >= bounds)[:, None]  # (B, 1)
        finishing_end = emits_end
        if early_stopping:  # an END ranked below the K best candidates is dropped
            finishing_end = emits_end & (tf.range(num_candidates) < beam_size)[None, :]
        ends = possible & (finishing_end | at_bound)  # (B, C)

        # Candidates that ended join the finished set, which keeps the K best.
        penalty = utils.length_penalty(length, alpha, length_penalty_form)
        new_scores = tf.where(ends, top_log_probs / penalty, utils.NEG_INF)  # (B, C)
        fin_seq, fin_scores, fin_log_probs, fin_lengths, fin_filled = finished
        all_scores = tf.concat([fin_scores, new_scores], axis=1)  # (B, K + C)
        # Ties keep the older hypothesis (top_k prefers the lower index).
        fin_scores, keep = tf.math.top_k(all_scores, k=beam_size)  # (B, K)

        def merge(old, new):
            return tf.gather(tf.concat([old, new], axis=1), keep, batch_dims=1)

        # Candidates that did not end may fill empty slots: keep those slots blank.
        finished = (
            merge(fin_seq, tf.where(ends[:, :, None], new_seq, pad_id)),  # (B, K, T)
            fin_scores,
            merge(fin_log_probs, tf.where(ends, top_log_probs, utils.NEG_INF)),
            merge(fin_lengths, tf.where(ends, length, 0)),
            merge(fin_filled, ends),
        )

        # The K best candidates that did not end stay alive (the candidates are sorted, so
        # top_k keeps their order); their cache rows follow them.
        alive_log_probs, alive_indices = tf.math.top_k(
            tf.where(possible & ~emits_end & ~at_bound, top_log_probs, utils.NEG_INF),
            k=beam_size,
        )  # (B, K)
        if num_candidates > beam_size:
            source_beams = tf.gather(source_beams, alive_indices, batch_dims=1)  # (B, K)
            new_tokens = tf.gather(new_tokens, alive_indices, batch_dims=1)  # (B, K)
            new_seq = tf.gather(new_seq, alive_indices, batch_dims=1)  # (B, K, T)
        best_alive = alive_log_probs[:, 0]  # (B,)
        no_alive = best_alive <= utils.IMPOSSIBLE
        if early_stopping:
            cannot_improve = finished[4][:, -1]  # K hypotheses have finished
        else:
            cannot_improve = finished[4][:, -1] & (
                fin_scores[:, -1] >= _upper_bound(best_alive, step, bounds, alpha,
                                                  length_penalty_form)
            )
        done = done | no_alive | cannot_improve  # (B,)
        # A done example keeps no alive hypothesis, so it cannot change any more.
        alive_log_probs = tf.where(done[:, None], utils.NEG_INF, alive_log_probs)
        if first:  # every candidate extends an example's one hypothesis (or beam 0)
            cache = cache_rows.tile(cache, beam_size)  # B*K rows
        else:
            cache = cache_rows.gather(cache, utils.beam_rows(source_beams, beam_size))
        alive = (
            tf.reshape(new_tokens, [-1, 1]),  # (B*K, 1)
            new_seq,
            alive_log_probs,
        )
        return alive, cache, finished, done

    finished_invariants = (
        tf.TensorShape([None, beam_size, max_length]),
        tf.TensorShape([None, beam_size]),
        tf.TensorShape([None, beam_size]),
        tf.TensorShape([None, beam_size]),
        tf.TensorShape([None, beam_size]),
    )
    invariants = (
        tf.TensorShape([]),
        (
            tf.TensorShape([None, 1]),
            tf.TensorShape([None, beam_size, max_length]),
            tf.TensorShape([None, beam_size]),
        ),
        cache_rows.shape_invariants(cache),
        utils.relaxed_batch_shapes(sentences),
        finished_invariants,
        tf.TensorShape([None]),
    )
    alive, cache, finished, done = step_fn(
        tf.constant(0, tf.int32), alive, cache, sentences, finished, done, bounds, first=True)
    loop_vars = (tf.constant(1, tf.int32), alive, cache, sentences, finished, done)
    if not drop_finished:
        def body(step, alive, cache, sentences, finished, done):
            alive, cache, finished, done = step_fn(
                step, alive, cache, sentences, finished, done, bounds)
            return step + 1, alive, cache, sentences, finished, done

        finished = tf.while_loop(cond, body, loop_vars=loop_vars, shape_invariants=invariants,
                                 maximum_iterations=max_length - 1)[4]
    else:
        def drop_done(alive, cache, sentences, finished, done, bounds, rows, output):
            # Per example: the alive sequences and scores, the finished set, `done`; the
            # beam rows: the last tokens and the cache.
            active = ((alive[1], alive[2]), sentences, finished, done, bounds, rows)
            active, last_tokens, cache, output = utils.drop_done_rows(
                active, output, rows, done, finished, beams=alive[0], beam_size=beam_size,
                cache=cache, cache_rows=cache_rows)
            (alive_seq, alive_log_probs), sentences, finished, done, bounds, rows = active
            return ((last_tokens, alive_seq, alive_log_probs), cache, sentences, finished,
                    done, bounds, rows, output)

        def body(step, alive, cache, sentences, finished, done, bounds, rows, output):
            alive, cache, finished, done = step_fn(
                step, alive, cache, sentences, finished, done, bounds)
            return (step + 1,) + drop_done(alive, cache, sentences, finished, done, bounds,
                                           rows, output)

        # Sentences done at the first step leave before the loop.
        loop_vars = (loop_vars[0],) + drop_done(alive, cache, sentences, finished, done,
                                                bounds, tf.range(batch_size), finished)
        loop = tf.while_loop(
            cond, body, loop_vars=loop_vars,
            shape_invariants=invariants + (
                tf.TensorShape([None]), tf.TensorShape([None]), finished_invariants),
            maximum_iterations=max_length - 1,
        )
        finished = utils.scatter_rows(loop[8], loop[7], loop[4])
    fin_seq, fin_scores, fin_log_probs, fin_lengths, _ = finished
    result = utils.SearchResult(
        tokens=fin_seq,
        scores=fin_log_probs,
        lengths=fin_lengths,
        normalized_scores=fin_scores,
    )
    if return_all_beams:
        return result
    # Every example finishes at least one hypothesis (at the latest at its bound), and the
    # finished set is sorted best first.
    return utils.SearchResult(*(field[:, 0] for field in result))

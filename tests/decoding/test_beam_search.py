"""Tests of `beam_search`."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.decoding import beam_search, greedy_search, length_penalty
from tests.decoding import reference
from tests.decoding.fake_models import (
    END_ID,
    PAD_ID,
    START_ID,
    UNK_ID,
    HistoryModel,
    NeverEndModel,
    ReservedPreferringModel,
    TableModel,
)

A, B = 3, 4  # two ordinary tokens of the hand-made tables


def _beam_trap_table():
    """START -> A (0.55) | B (0.45); A -> END 0.3, others 0.7 split; B -> END 0.9."""
    probs = np.zeros([6, 6])
    probs[:, END_ID] = 1.0  # rows that are never used
    probs[1] = [0, 0, 0, 0.55, 0.45, 0]
    probs[A] = [0, 0, 0.3, 0.25, 0.25, 0.2]
    probs[B] = [0, 0, 0.9, 0.05, 0.05, 0]
    probs[5] = [0, 0, 1.0, 0, 0, 0]
    return probs


def test_beam_finds_the_sequence_greedy_misses():
    model = TableModel(_beam_trap_table())
    greedy = greedy_search(model.next_logits, {}, 1, 5)
    beam = beam_search(model.next_logits, {}, 1, 5, beam_size=2, alpha=0.0)
    np.testing.assert_array_equal(greedy.tokens, [[A, END_ID, 0, 0, 0]])
    np.testing.assert_array_equal(beam.tokens, [[B, END_ID, 0, 0, 0]])
    np.testing.assert_allclose(beam.scores, [np.log(0.45 * 0.9)], rtol=1e-5)
    np.testing.assert_allclose(greedy.scores, [np.log(0.55 * 0.3)], rtol=1e-5)
    assert int(beam.lengths[0]) == 2


def _short_or_long_table():
    """Two competitors: [END] (log-prob -1.0) and [A, A, END] (log-prob about -1.2)."""
    probs = np.zeros([4, 6, 6])
    probs[:, :, END_ID] = 1.0  # unused rows
    p_end = np.exp(-1.0)
    probs[0, 1] = [0, 0, p_end, 1 - p_end, 0, 0]
    probs[1, A] = [0, 0, 0.05, 0.9, 0.05, 0]
    probs[2, A] = [0, 0, 0.557, 0.0, 0.443, 0]
    probs[3] = [0, 0, 0.5, 0.25, 0.25, 0]
    return probs


@pytest.mark.parametrize("form", ["gnmt", "power"])
@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_length_penalty_changes_the_ranking_as_the_formula_says(alpha, form):
    probs = _short_or_long_table()
    short_log_prob = np.log(probs[0, 1, END_ID])
    long_log_prob = np.log(probs[0, 1, A] * probs[1, A, A] * probs[2, A, END_ID])
    short_score = short_log_prob / reference.penalty(1, alpha, form)  # END counted
    long_score = long_log_prob / reference.penalty(3, alpha, form)
    # The formula makes the short one win without penalty and the long one with alpha 1.
    assert (short_score > long_score) == (alpha == 0.0)
    result = beam_search(
        TableModel(probs).next_logits, {}, 1, 6, beam_size=3, alpha=alpha,
        return_all_beams=True, length_penalty_form=form,
    )
    expected = [END_ID] if short_score > long_score else [A, A, END_ID]
    length = len(expected)
    np.testing.assert_array_equal(result.tokens[0, 0, :length], expected)
    np.testing.assert_array_equal(result.tokens[0, 0, length:], 0)
    assert int(result.lengths[0, 0]) == length
    np.testing.assert_allclose(
        result.normalized_scores[0, 0], max(short_score, long_score), rtol=1e-5
    )
    # The competitors are among the finished beams, ranked by the formula.
    found = {
        tuple(row[:n]): float(score)
        for row, n, score in zip(
            result.tokens[0].numpy(), result.lengths[0].numpy(),
            result.normalized_scores[0].numpy(),
        )
    }
    np.testing.assert_allclose(found[(A, A, END_ID)], long_score, rtol=1e-5)
    if form == "gnmt" or alpha == 0.0:  # "power" at alpha 1 ranks longer ones above [END]
        np.testing.assert_allclose(found[(END_ID,)], short_score, rtol=1e-5)


def test_length_penalty_values():
    np.testing.assert_allclose(length_penalty(1, 0.6), 1.0)
    np.testing.assert_allclose(length_penalty(7, 1.0), 2.0)
    np.testing.assert_allclose(length_penalty(3, 0.0), 1.0)
    np.testing.assert_allclose(
        length_penalty(tf.constant([4, 10]), 0.6), [1.5**0.6, 2.5**0.6], rtol=1e-6
    )
    np.testing.assert_allclose(length_penalty(tf.constant([4, 9]), 0.5, form="power"), [2, 3])
    with pytest.raises(ValueError, match="form must be one of"):
        length_penalty(3, 1.0, form="wu")


@pytest.mark.parametrize("beam_size", [1, 2, 3, 5])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_beam_matches_reference_with_history_cache(beam_size, alpha):
    # The logits depend on every token fed, read back from the tiled cache: beams whose
    # cache rows were not gathered along with them give other results.
    model = HistoryModel(vocab_size=7, max_length=8, seed=beam_size, end_bias=0.5)
    sources = [0, 3, 7]
    bounds = [8, 4, 6]
    result = beam_search(
        model.next_logits,
        model.initial_cache(sources),
        3,
        8,
        beam_size=beam_size,
        alpha=alpha,
        max_lengths=bounds,
        return_all_beams=True,
    )
    assert result.tokens.shape == (3, beam_size, 8)
    for b in range(3):
        finished, _ = reference.beam(model, bounds[b], beam_size, alpha, sources[b])
        for k, (score, log_prob, tokens) in enumerate(finished):
            n = len(tokens)
            assert int(result.lengths[b, k]) == n
            np.testing.assert_array_equal(result.tokens[b, k, :n], tokens)
            np.testing.assert_array_equal(result.tokens[b, k, n:], 0)
            np.testing.assert_allclose(result.scores[b, k], log_prob, rtol=1e-5)
            np.testing.assert_allclose(
                result.normalized_scores[b, k], score, rtol=1e-5
            )


@pytest.mark.parametrize("early_stopping", [False, True], ids=["exact", "early"])
@pytest.mark.parametrize("alpha", [-0.5, 0.6, 2.0])
def test_beam_with_the_power_penalty_matches_reference(alpha, early_stopping):
    # CTranslate2's penalty, length ** alpha: the same search with another ranking, and
    # with the exact rule another bound on what an alive hypothesis can still reach
    # (a negative alpha favours short hypotheses: the bound comes from the next length).
    model = HistoryModel(vocab_size=7, max_length=8, seed=3, end_bias=0.5)
    sources, bounds = [0, 3, 7], [8, 4, 6]
    result = beam_search(model.next_logits, model.initial_cache(sources), 3, 8, beam_size=3,
                         alpha=alpha, max_lengths=bounds, return_all_beams=True,
                         early_stopping=early_stopping, length_penalty_form="power")
    for b in range(3):
        finished, _ = reference.beam(model, bounds[b], 3, alpha, sources[b],
                                     early_stopping=early_stopping, form="power")
        for k, (score, log_prob, tokens) in enumerate(finished):
            n = len(tokens)
            np.testing.assert_array_equal(result.tokens[b, k, :n], tokens)
            np.testing.assert_allclose(result.scores[b, k], log_prob, rtol=1e-5)
            np.testing.assert_allclose(result.normalized_scores[b, k], score, rtol=1e-5)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_beam_size_one_equals_greedy(alpha, seed):
    model = HistoryModel(vocab_size=8, max_length=10, seed=10 + seed)
    sources = [0, 1, 2, 3, 4, 5]
    bounds = [10, 10, 10, 3, 6, 1]
    greedy = greedy_search(
        model.next_logits, model.initial_cache(sources), 6, 10, max_lengths=bounds
    )
    beam = beam_search(
        model.next_logits,
        model.initial_cache(sources),
        6,
        10,
        beam_size=1,
        alpha=alpha,
        max_lengths=bounds,
    )
    np.testing.assert_array_equal(beam.tokens, greedy.tokens)
    np.testing.assert_array_equal(beam.lengths, greedy.lengths)
    np.testing.assert_allclose(beam.scores, greedy.scores, rtol=1e-6)


def test_beam_is_bounded_for_a_model_that_never_ends():
    model = NeverEndModel()
    result = beam_search(
        model.next_logits, {}, 4, 6, beam_size=3, max_lengths=tf.constant([1, 3, 6, 99])
    )
    np.testing.assert_array_equal(result.lengths, [1, 3, 6, 6])
    for row, length in zip(result.tokens.numpy(), result.lengths.numpy()):
        assert np.all(row[:length] > END_ID) and np.all(row[length:] == 0)
    unbounded = beam_search(model.next_logits, {}, 2, 5, beam_size=2)
    np.testing.assert_array_equal(unbounded.lengths, [5, 5])


def test_beam_batch_equals_one_at_a_time():
    model = HistoryModel(vocab_size=8, max_length=9, seed=7, end_bias=0.5)
    sources = [2, 5, 9, 14]
    bounds = [9, 4, 7, 9]
    kwargs = dict(beam_size=3, alpha=0.6)
    batch = beam_search(
        model.next_logits, model.initial_cache(sources), 4, 9, max_lengths=bounds,
        **kwargs,
    )
    for b in range(4):
        alone = beam_search(
            model.next_logits,
            model.initial_cache(sources[b : b + 1]),
            1,
            9,
            max_lengths=bounds[b : b + 1],
            **kwargs,
        )
        np.testing.assert_array_equal(batch.tokens[b], alone.tokens[0])
        np.testing.assert_array_equal(batch.lengths[b], alone.lengths[0])
        np.testing.assert_allclose(batch.scores[b], alone.scores[0], rtol=1e-6)
        np.testing.assert_allclose(
            batch.normalized_scores[b], alone.normalized_scores[0], rtol=1e-6
        )


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf_function"])
def test_beam_stops_early(compiled):
    counter = tf.Variable(0, dtype=tf.int32)
    model = HistoryModel(
        vocab_size=7, max_length=30, seed=3, end_bias=3.0, counter=counter
    )
    finished, steps = reference.beam(model, 30, 3, 0.6, source=4)
    assert steps < 10  # the setting really stops early

    def run(source):
        return beam_search(
            model.next_logits, model.initial_cache(source), 1, 30, beam_size=3
        )

    if compiled:
        run = tf.function(run)
    result = run(tf.constant([4]))
    assert int(counter.numpy()) == steps
    np.testing.assert_array_equal(result.tokens[0, : len(finished[0][2])], finished[0][2])


def test_finished_beam_with_certain_end_stops_search():
    # START -> A | B, then END for sure: 2 steps, although max_length is 50.
    probs = np.zeros([6, 6])
    probs[:, END_ID] = 1.0
    probs[1] = [0, 0, 0, 0.6, 0.4, 0]
    counter = tf.Variable(0, dtype=tf.int32)
    result = beam_search(
        TableModel(probs, counter=counter).next_logits, {}, 2, 50, beam_size=2,
        return_all_beams=True,
    )
    assert int(counter.numpy()) == 2
    np.testing.assert_array_equal(result.tokens[:, :, :2], [[[A, END_ID], [B, END_ID]]] * 2)
    np.testing.assert_allclose(
        result.scores[0], np.log([0.6, 0.4]), rtol=1e-5
    )


def test_beam_rejects_bad_beam_size():
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(NeverEndModel().next_logits, {}, 1, 3, beam_size=0)
    # A fraction ran as the beam below it.
    for beam_size in (2.7, float("nan"), float("inf"), "4", 10**400):
        with pytest.raises(ValueError, match="beam_size"):
            beam_search(NeverEndModel().next_logits, {}, 1, 3, beam_size=beam_size)


@pytest.mark.parametrize("alpha", [float("nan"), float("inf")])
def test_beam_rejects_an_alpha_that_is_not_a_number(alpha):
    # NaN ranked every hypothesis longer than one token as NaN and returned a result.
    with pytest.raises(ValueError, match="alpha"):
        beam_search(NeverEndModel().next_logits, {}, 1, 3, beam_size=2, alpha=alpha)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_one_bound_for_every_example_as_a_number(search):
    # greedy broadcast a number `max_lengths`; beam search failed in a slice ("Attempting
    # to slice scalar input") that named no argument.
    model = NeverEndModel()
    run = (lambda **kw: greedy_search(model.next_logits, {}, 2, 5, **kw)) if search == "greedy" \
        else (lambda **kw: beam_search(model.next_logits, {}, 2, 5, beam_size=2, **kw))
    for bound in (3, tf.constant(3)):
        np.testing.assert_array_equal(run(max_lengths=bound).lengths, [3, 3])
    with pytest.raises(ValueError, match="max_lengths"):
        run(max_lengths=[3, 3, 3])
    with pytest.raises(ValueError, match="max_lengths"):
        run(max_lengths=[[3], [3]])


@pytest.mark.parametrize("beam_size", [1, 3])
def test_beam_never_produces_pad_or_start_and_forbids_unk_on_request(beam_size):
    model = ReservedPreferringModel(end_step=2)
    for unk_id, forbidden in ((None, [PAD_ID, START_ID]), (UNK_ID, [PAD_ID, START_ID, UNK_ID])):
        result = beam_search(
            model.next_logits, {}, 2, 6, beam_size=beam_size, alpha=0.6, unk_id=unk_id,
            return_all_beams=True,
        )
        tokens, lengths = result.tokens.numpy(), result.lengths.numpy()
        for b in range(2):
            for k in range(beam_size):
                assert not np.isin(tokens[b, k, : lengths[b, k]], forbidden).any(), (
                    unk_id, tokens[b, k])
        best = UNK_ID if unk_id is None else UNK_ID + 1
        np.testing.assert_array_equal(tokens[:, 0], [[best, best, END_ID, 0, 0, 0]] * 2)


def _two_k_trap_table():
    """A Markov table where keeping only the K best candidates loses the best hypothesis.

    With K = 2 and alpha = 1, at step 1 the candidates rank B D (0.36), A END (0.33),
    A C (0.27), B END (0.04). Taking the K best keeps B D alive and finishes A END, so the
    alive set shrinks to one beam and A C is dropped; taking 2K finishes A END and B END and
    keeps both B D and A C alive. A C G END (length 4, log-prob log 0.27) has the best
    normalized score of all hypotheses, -1.309 / 1.5 = -0.873, ahead of B D H END
    (-0.919) and A END (-0.950).
    """
    a, b, c, d, g, h = 3, 4, 5, 6, 7, 8
    probs = np.zeros([9, 9])
    probs[:, END_ID] = 1.0  # rows that are never used
    probs[1] = 0.0
    probs[1, [a, b]] = [0.6, 0.4]
    probs[a] = 0.0
    probs[a, [END_ID, c]] = [0.55, 0.45]
    probs[b] = 0.0
    probs[b, [d, END_ID]] = [0.9, 0.1]
    probs[c] = 0.0
    probs[c, g] = 1.0
    probs[d] = 0.0
    probs[d, [END_ID, h]] = [0.3, 0.7]
    return probs, [a, c, g, END_ID]


def test_beam_keeps_k_alive_hypotheses_when_one_finishes():
    probs, best = _two_k_trap_table()
    model = TableModel(probs)
    result = beam_search(model.next_logits, {}, 1, 6, beam_size=2, alpha=1.0)
    # The exhaustive search over every hypothesis agrees on the best one.
    exhaustive_best = reference.exhaustive_best(model, 6, alpha=1.0)
    assert exhaustive_best[2] == best
    np.testing.assert_array_equal(result.tokens[0, :4], best)
    np.testing.assert_allclose(result.normalized_scores[0], exhaustive_best[0], rtol=1e-5)
    np.testing.assert_allclose(result.scores[0], np.log(0.6 * 0.45), rtol=1e-5)


@pytest.mark.parametrize("beam_size", [1, 3])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf_function"])
def test_beam_drop_finished_matches_reference_and_decodes_fewer_rows(beam_size, compiled):
    rows = tf.Variable(0, dtype=tf.int32)
    model = HistoryModel(vocab_size=7, max_length=9, seed=5, end_bias=0.5, row_counter=rows)
    sources = [0, 3, 7, 11, 2, 5]
    bounds = [9, 2, 8, 3, 9, 1]
    decoded = {}
    for drop in (False, True):
        def run(drop=drop):
            return beam_search(
                model.next_logits_with_sentences,
                {"keys": model.initial_cache(sources)["keys"]}, len(sources), 9,
                beam_size=beam_size, alpha=0.6, max_lengths=bounds, return_all_beams=True,
                sentence_cache={"source": tf.constant(sources, tf.int32)},
                drop_finished=drop,
            )
        rows.assign(0)
        result = (tf.function(run) if compiled else run)()
        steps = []
        for b in range(len(sources)):
            finished, calls = reference.beam(model, bounds[b], beam_size, 0.6, sources[b])
            steps.append(calls)
            for k, (score, log_prob, tokens) in enumerate(finished):
                n = len(tokens)
                assert int(result.lengths[b, k]) == n
                np.testing.assert_array_equal(result.tokens[b, k, :n], tokens)
                np.testing.assert_array_equal(result.tokens[b, k, n:], 0)
                np.testing.assert_allclose(result.normalized_scores[b, k], score, rtol=1e-5)
        decoded[drop] = int(rows.numpy())
    # A sentence decodes one row at its first step and K at the others; dropped, its rows
    # leave the batch at the step it is done.
    assert decoded[True] == sum(1 + beam_size * (n - 1) for n in steps), (decoded, steps)
    assert decoded[True] < decoded[False], decoded


def _early_or_long_table():
    """START -> END (0.4) | A (0.3) | B (0.3); B -> END; A -> A (0.99) | END (0.01).

    With K = 2 and alpha = 2, two hypotheses have finished after two steps ([END] and
    [B, END], which wins them at -1.204 / (7/6)^2 = -0.885), but A repeated up to the
    bound of 6 tokens scores -1.254 / (11/6)^2 = -0.373: the exact rule keeps decoding
    and finds it, early stopping does not.
    """
    probs = np.zeros([6, 6])
    probs[:, END_ID] = 1.0  # rows that are never used
    probs[1] = [0, 0, 0.4, 0.3, 0.3, 0]
    probs[A] = [0, 0, 0.01, 0.99, 0, 0]
    return probs


def test_beam_early_stopping_stops_once_k_hypotheses_finished():
    calls = tf.Variable(0, dtype=tf.int32)
    model = TableModel(_early_or_long_table(), counter=calls)
    results = {}
    for early in (False, True):
        calls.assign(0)
        results[early] = beam_search(model.next_logits, {}, 1, 8, beam_size=2, alpha=2.0,
                                     max_lengths=[6], early_stopping=early)
        results[early, "calls"] = int(calls.numpy())
    np.testing.assert_array_equal(results[False].tokens, [[A] * 6 + [0, 0]])
    assert results[False, "calls"] == 6
    np.testing.assert_array_equal(results[True].tokens, [[B, END_ID] + [0] * 6])
    np.testing.assert_allclose(results[True].normalized_scores,
                               [np.log(0.3) / (7 / 6) ** 2], rtol=1e-5)
    assert results[True, "calls"] == 2


@pytest.mark.parametrize("beam_size", [1, 2, 3])
@pytest.mark.parametrize("alpha", [0.0, 1.4])
@pytest.mark.parametrize("drop", [False, True], ids=["keep", "drop_finished"])
def test_beam_early_stopping_matches_reference(beam_size, alpha, drop):
    rows = tf.Variable(0, dtype=tf.int32)
    model = HistoryModel(vocab_size=7, max_length=9, seed=7, end_bias=0.8, row_counter=rows)
    sources = [0, 3, 7, 11, 2, 5]
    bounds = [9, 2, 8, 3, 9, 1]

    @tf.function
    def run(early_stopping):
        return beam_search(
            model.next_logits_with_sentences,
            {"keys": model.initial_cache(sources)["keys"]}, len(sources), 9,
            beam_size=beam_size, alpha=alpha, max_lengths=bounds, return_all_beams=True,
            sentence_cache={"source": tf.constant(sources, tf.int32)},
            drop_finished=drop, early_stopping=early_stopping,
        )

    result = run(True)
    early_rows = int(rows.numpy())  # counted when the search runs, not when it is traced
    early_steps, exact_steps = [], []
    for b in range(len(sources)):
        finished, steps = reference.beam(model, bounds[b], beam_size, alpha, sources[b],
                                         early_stopping=True)
        early_steps.append(steps)
        exact_steps.append(reference.beam(model, bounds[b], beam_size, alpha, sources[b])[1])
        for k, (score, log_prob, tokens) in enumerate(finished):
            n = len(tokens)
            assert int(result.lengths[b, k]) == n, (b, k)
            np.testing.assert_array_equal(result.tokens[b, k, :n], tokens)
            np.testing.assert_array_equal(result.tokens[b, k, n:], 0)
            np.testing.assert_allclose(result.normalized_scores[b, k], score, rtol=1e-5)
            np.testing.assert_allclose(result.scores[b, k], log_prob, rtol=1e-5)
    # With a length penalty the exact rule must wait for alive hypotheses that a longer
    # length could still lift; early stopping does not (beam 1 is greedy either way).
    if beam_size > 1 and alpha > 0:
        assert sum(early_steps) < sum(exact_steps), (early_steps, exact_steps)
    if drop:  # rows stop costing compute as soon as their sentence is done
        rows.assign(0)
        run(False)
        assert early_rows < int(rows.numpy()) or beam_size == 1 or alpha == 0


@pytest.mark.parametrize("seed", [0, 1])
def test_beam_size_one_with_early_stopping_equals_greedy(seed):
    model = HistoryModel(vocab_size=8, max_length=10, seed=20 + seed)
    sources = [0, 1, 2, 3]
    bounds = [10, 10, 3, 1]
    greedy = greedy_search(
        model.next_logits, model.initial_cache(sources), 4, 10, max_lengths=bounds)
    beam = beam_search(model.next_logits, model.initial_cache(sources), 4, 10, beam_size=1,
                       alpha=1.4, max_lengths=bounds, early_stopping=True)
    np.testing.assert_array_equal(beam.tokens, greedy.tokens)
    np.testing.assert_allclose(beam.scores, greedy.scores, rtol=1e-6)


@pytest.mark.parametrize("vocab_size", [7, 16], ids=["vocab7", "vocab16"])
@pytest.mark.parametrize("beam_size", [2, 3])
def test_beam_first_step_decodes_one_row_per_example(vocab_size, beam_size):
    # As CTranslate2 does: the first step extends START alone, so it decodes B rows, not
    # B * K copies of it; the cache is tiled after it. With fewer tokens than 2K
    # candidates (plus the masked ones) need, its logits are ranked as K beams instead.
    first_rows = tf.Variable(0, dtype=tf.int32)
    model = HistoryModel(vocab_size=vocab_size, max_length=9, seed=11, end_bias=0.5)
    sources = [0, 3, 7, 11, 2]
    bounds = [9, 2, 8, 1, 9]

    def next_logits(tokens, cache, index, sentences):
        first_rows.assign_add(tf.where(tf.equal(index, 0), tf.shape(tokens)[0], 0))
        return model.next_logits_with_sentences(tokens, cache, index, sentences)

    result = tf.function(lambda: beam_search(
        next_logits, {"keys": model.initial_cache(sources)["keys"]}, len(sources), 9,
        beam_size=beam_size, alpha=1.0, max_lengths=bounds, return_all_beams=True,
        sentence_cache={"source": tf.constant(sources, tf.int32)}, drop_finished=True,
        early_stopping=True,
    ))()
    assert int(first_rows.numpy()) == len(sources)
    for b, source in enumerate(sources):
        finished, _ = reference.beam(model, bounds[b], beam_size, 1.0, source,
                                     early_stopping=True)
        for k, (score, _, tokens) in enumerate(finished):
            n = len(tokens)
            np.testing.assert_array_equal(result.tokens[b, k, :n], tokens)
            np.testing.assert_allclose(result.normalized_scores[b, k], score, rtol=1e-5)

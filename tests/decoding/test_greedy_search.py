"""Tests of `greedy_search` and `greedy_search_uncached`."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.decoding import beam_search, greedy_search, greedy_search_uncached
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


def _check_against_reference(result, model, sources, bounds):
    for b, (source, bound) in enumerate(zip(sources, bounds)):
        tokens, log_prob = reference.greedy(model, bound, source)
        length = len(tokens)
        assert result.lengths[b] == length
        np.testing.assert_array_equal(result.tokens[b, :length], tokens)
        np.testing.assert_array_equal(result.tokens[b, length:], 0)
        np.testing.assert_allclose(result.scores[b], log_prob, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_matches_reference_with_history_cache(seed):
    # The logits depend on every token fed, read back from the cache: a cache that is not
    # threaded through the loop gives other tokens.
    model = HistoryModel(vocab_size=7, max_length=8, seed=seed)
    sources = [0, 3, 7, 11]
    bounds = [8, 5, 8, 2]
    result = greedy_search(
        model.next_logits,
        model.initial_cache(sources),
        len(sources),
        8,
        max_lengths=tf.constant(bounds),
    )
    assert result.tokens.shape == (4, 8)
    assert result.tokens.dtype == tf.int32 and result.lengths.dtype == tf.int32
    assert result.scores.dtype == tf.float32
    _check_against_reference(result, model, sources, bounds)
    np.testing.assert_array_equal(result.normalized_scores, result.scores)


def test_greedy_stops_at_end_and_pads_after_it():
    probs = np.zeros([6, 6])
    probs[:, 3] = 0.6
    probs[:, 4] = 0.4
    probs[4] = [0, 0, 0.7, 0.2, 0.1, 0]  # after token 4, END is likely
    probs[3] = [0, 0, 0.1, 0.3, 0.6, 0]  # after token 3, token 4 is likely
    result = greedy_search(TableModel(probs).next_logits, {}, 1, 6)
    np.testing.assert_array_equal(result.tokens, [[3, 4, END_ID, 0, 0, 0]])
    assert int(result.lengths[0]) == 3
    np.testing.assert_allclose(result.scores, [np.log(0.6 * 0.6 * 0.7)], rtol=1e-5)


def test_greedy_is_bounded_by_max_lengths_and_max_length():
    model = NeverEndModel()
    result = greedy_search(
        model.next_logits, {}, 4, 6, max_lengths=tf.constant([1, 3, 6, 100])
    )
    np.testing.assert_array_equal(result.lengths, [1, 3, 6, 6])
    lengths = result.lengths.numpy()
    for row, length in zip(result.tokens.numpy(), lengths):
        assert np.all(row[:length] > END_ID) and np.all(row[length:] == 0)
    unbounded = greedy_search(model.next_logits, {}, 2, 5)
    np.testing.assert_array_equal(unbounded.lengths, [5, 5])


def test_greedy_batch_equals_one_at_a_time():
    model = HistoryModel(vocab_size=8, max_length=9, seed=4, end_bias=0.5)
    sources = [2, 5, 9]
    bounds = [9, 4, 7]
    batch = greedy_search(
        model.next_logits, model.initial_cache(sources), 3, 9, max_lengths=bounds
    )
    for b in range(3):
        alone = greedy_search(
            model.next_logits,
            model.initial_cache(sources[b : b + 1]),
            1,
            9,
            max_lengths=bounds[b : b + 1],
        )
        np.testing.assert_array_equal(batch.tokens[b], alone.tokens[0])
        np.testing.assert_array_equal(batch.lengths[b], alone.lengths[0])
        np.testing.assert_allclose(batch.scores[b], alone.scores[0], rtol=1e-6)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf_function"])
def test_greedy_stops_early_when_all_ended(compiled):
    # Every sequence emits END at output position 3, so 3 steps run out of 20.
    probs = np.zeros([3, 6, 6])
    probs[0, :, 3] = 1.0
    probs[1, :, 4] = 1.0
    probs[2, :, END_ID] = 1.0
    counter = tf.Variable(0, dtype=tf.int32)
    model = TableModel(probs, counter=counter)

    def run(batch_size):
        return greedy_search(model.next_logits, {}, batch_size, 20)

    if compiled:
        run = tf.function(run)
    result = run(tf.constant(3))
    assert int(counter.numpy()) == 3
    np.testing.assert_array_equal(result.lengths, [3, 3, 3])


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf_function"])
def test_uncached_greedy_equals_cached_greedy(compiled):
    model = HistoryModel(vocab_size=9, max_length=10, seed=5, end_bias=0.3)
    sources = tf.constant([1, 4, 6, 8, 13])
    bounds = tf.constant([10, 10, 3, 7, 10])

    def run(sources):
        batch_size = tf.shape(sources)[0]
        cached = greedy_search(
            model.next_logits,
            model.initial_cache(sources),
            batch_size,
            10,
            max_lengths=bounds,
        )
        uncached = greedy_search_uncached(
            model.logits_fn, sources, batch_size, 10, max_lengths=bounds
        )
        return cached, uncached

    if compiled:
        run = tf.function(run, input_signature=[tf.TensorSpec([None], tf.int32)])
    cached, uncached = run(sources)
    np.testing.assert_array_equal(cached.tokens, uncached.tokens)
    np.testing.assert_array_equal(cached.lengths, uncached.lengths)
    np.testing.assert_allclose(cached.scores, uncached.scores, rtol=1e-6)
    _check_against_reference(uncached, model, sources.numpy(), bounds.numpy())


def test_max_length_must_be_a_python_int():
    with pytest.raises(ValueError, match="Python int"):
        greedy_search(NeverEndModel().next_logits, {}, 1, tf.constant(3))
    with pytest.raises(ValueError, match="at least 1"):
        greedy_search(NeverEndModel().next_logits, {}, 1, 0)
    with pytest.raises(ValueError, match="max_length"):  # ran 2 steps
        greedy_search(NeverEndModel().next_logits, {}, 1, 2.5)


def test_a_pad_id_outside_the_vocabulary_pads_as_beam_search_does():
    # Greedy looked up the log-probability of `pad_id` for the finished rows:
    # "indices[0] = -1 is not in [0, 6)", where beam search padded with -1.
    model = NeverEndModel()
    result = greedy_search(model.next_logits, {}, 2, 4, pad_id=-1, max_lengths=[1, 4])
    beam = beam_search(model.next_logits, {}, 2, 4, beam_size=1, pad_id=-1,
                       max_lengths=[1, 4])
    np.testing.assert_array_equal(result.tokens, beam.tokens)
    np.testing.assert_array_equal(result.tokens.numpy()[0, 1:], [-1, -1, -1])
    np.testing.assert_allclose(result.scores, beam.scores, rtol=1e-6)


def _reserved_free(tokens, lengths, forbidden):
    return not any(np.isin(row[:n], forbidden).any() for row, n in zip(tokens, lengths))


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "uncached"])
def test_greedy_never_produces_pad_or_start_and_forbids_unk_on_request(cached):
    model = ReservedPreferringModel(end_step=2)

    def run(**kwargs):
        if cached:
            return greedy_search(model.next_logits, {}, 2, 6, **kwargs)
        return greedy_search_uncached(model.logits_fn, (), 2, 6, **kwargs)

    allowed = run()  # UNK is allowed by default in the library functions
    np.testing.assert_array_equal(allowed.tokens, [[UNK_ID, UNK_ID, END_ID, 0, 0, 0]] * 2)
    forbidden = run(unk_id=UNK_ID)
    np.testing.assert_array_equal(
        forbidden.tokens, [[UNK_ID + 1, UNK_ID + 1, END_ID, 0, 0, 0]] * 2
    )
    for result in (allowed, forbidden):
        assert _reserved_free(result.tokens.numpy(), result.lengths.numpy(), [PAD_ID, START_ID])
        assert np.all(np.isfinite(result.scores.numpy()))
    # The score stays the model's own log-probability of the chosen tokens.
    log_probs = [tf.nn.log_softmax(row).numpy() for row in model.rows]
    expected = log_probs[0][UNK_ID + 1] * 2 + log_probs[1][END_ID]
    np.testing.assert_allclose(forbidden.scores, [expected] * 2, rtol=1e-5)


def _search_with_sentences(search, model, sources, max_length, drop_finished, **kwargs):
    """`search` with the sources as a sentence cache (one row per example)."""
    cache = {"keys": model.initial_cache(sources)["keys"]}
    return search(
        model.next_logits_with_sentences, cache, len(sources), max_length,
        sentence_cache={"source": tf.constant(sources, tf.int32)},
        drop_finished=drop_finished, **kwargs,
    )


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf_function"])
def test_greedy_drop_finished_matches_reference_and_decodes_fewer_rows(compiled):
    rows = tf.Variable(0, dtype=tf.int32)
    model = HistoryModel(vocab_size=7, max_length=10, seed=4, end_bias=0.8, row_counter=rows)
    sources = [0, 3, 7, 11, 2, 5, 9, 4]
    bounds = [10, 2, 9, 3, 10, 1, 6, 10]
    decoded = {}
    for drop in (False, True):
        def run(drop=drop):
            return _search_with_sentences(greedy_search, model, sources, 10, drop,
                                          max_lengths=tf.constant(bounds))
        rows.assign(0)
        result = (tf.function(run) if compiled else run)()
        _check_against_reference(result, model, sources, bounds)
        decoded[drop] = int(rows.numpy())
    lengths = [len(reference.greedy(model, b, s)[0]) for s, b in zip(sources, bounds)]
    # Kept: every row until the longest ends. Dropped: a sentence's row leaves the batch
    # at the step it ends, so the rows decoded are the tokens generated.
    assert decoded[False] == len(sources) * max(lengths)
    assert decoded[True] == sum(lengths), (decoded, lengths)

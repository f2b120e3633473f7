"""Tests of `sample` and its logit filters."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.decoding import greedy_search, sample, top_k_filter, top_p_filter
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

# One step whose distribution is known: tokens 3, 4, 5, END with these probabilities.
_PROBS = np.array([0.0, 0.0, 0.05, 0.5, 0.3, 0.15])
_NUM_SAMPLES = 4000


def _one_step_samples(**kwargs):
    model = TableModel(np.tile(_PROBS, [6, 1]))
    result = sample(model.next_logits, {}, _NUM_SAMPLES, 1, **kwargs)
    return result.tokens.numpy()[:, 0]


def _frequencies(tokens):
    return np.bincount(tokens, minlength=len(_PROBS)) / len(tokens)


def test_samples_follow_the_model_distribution():
    frequencies = _frequencies(_one_step_samples(seed=1))
    np.testing.assert_allclose(frequencies, _PROBS, atol=0.03)


def test_temperature_sharpens_the_distribution():
    tempered = _PROBS**2 / np.sum(_PROBS**2)  # temperature 0.5 squares the probabilities
    frequencies = _frequencies(_one_step_samples(seed=2, temperature=0.5))
    np.testing.assert_allclose(frequencies, tempered, atol=0.03)


@pytest.mark.parametrize(
    "top_p, nucleus", [(0.4, {3}), (0.7, {3, 4}), (0.85, {3, 4, 5})]
)
def test_top_p_never_samples_outside_the_nucleus(top_p, nucleus):
    tokens = _one_step_samples(seed=3, top_p=top_p)
    assert set(np.unique(tokens)) == nucleus
    inside = np.array(sorted(nucleus))
    expected = _PROBS[inside] / _PROBS[inside].sum()
    np.testing.assert_allclose(_frequencies(tokens)[inside], expected, atol=0.03)


def test_top_k_never_samples_outside_the_k_best():
    tokens = _one_step_samples(seed=4, top_k=2)
    assert set(np.unique(tokens)) == {3, 4}


def test_filters_mask_with_a_finite_negative():
    logits = tf.math.log(tf.constant([_PROBS + 1e-9], tf.float32))
    for filtered in (top_k_filter(logits, 2), top_p_filter(logits, 0.7)):
        values = filtered.numpy()[0]
        assert np.all(np.isfinite(values))
        np.testing.assert_array_equal(values[3:5], logits.numpy()[0, 3:5])
        assert np.all(values[[0, 1, 2, 5]] <= -1e8)
    assert top_k_filter(logits, 0) is logits and top_p_filter(logits, 1.0) is logits


def _history_inputs():
    model = HistoryModel(vocab_size=9, max_length=10, seed=21, scale=1.0)
    sources = list(range(16))
    return model, sources


def test_top_k_one_equals_greedy():
    model, sources = _history_inputs()
    greedy = greedy_search(model.next_logits, model.initial_cache(sources), 16, 10)
    sampled = sample(
        model.next_logits, model.initial_cache(sources), 16, 10, top_k=1, seed=5
    )
    np.testing.assert_array_equal(sampled.tokens, greedy.tokens)
    np.testing.assert_array_equal(sampled.lengths, greedy.lengths)
    np.testing.assert_allclose(sampled.scores, greedy.scores, rtol=1e-6)


def test_near_zero_temperature_behaves_like_greedy():
    model, sources = _history_inputs()
    greedy = greedy_search(model.next_logits, model.initial_cache(sources), 16, 10)
    sampled = sample(
        model.next_logits, model.initial_cache(sources), 16, 10, temperature=1e-4, seed=6,
    )
    np.testing.assert_array_equal(sampled.tokens, greedy.tokens)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=-0.5), "top_p"),
        (dict(top_p=1.5), "top_p"),
        # Past float32: a tiny temperature overflowed (PAD sampled on every row), a tiny
        # top_p underflowed (uniform over every token); an infinite temperature is no
        # distribution. The same bounds as `DecodingConfig`.
        (dict(temperature=1e-40), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=1e-40), "top_p"),
        (dict(top_k=2.5), "top_k"),
        # `float()` took a string and a bool: "0.5" failed inside the graph naming nothing,
        # True was a temperature of 1.
        (dict(temperature="0.5"), "temperature"),
        (dict(temperature=True), "temperature"),
        (dict(top_p="0.9"), "top_p"),
        (dict(top_k=True), "top_k"),
    ],
)
def test_invalid_sampling_settings_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        sample(NeverEndModel().next_logits, {}, 2, 3, seed=1, **settings)


def test_a_top_k_past_int32_keeps_every_token():
    # It passed the checks, then failed converting to int32 in the graph (a TypeError the
    # command line did not catch: a traceback after the model had loaded).
    logits = tf.math.log(tf.constant([_PROBS + 1e-9], tf.float32))
    np.testing.assert_array_equal(top_k_filter(logits, 3 * 10**9), logits)


def test_filters_refuse_invalid_values():
    logits = tf.math.log(tf.constant([_PROBS + 1e-9], tf.float32))
    with pytest.raises(ValueError, match="top_p"):
        top_p_filter(logits, 0.0)
    with pytest.raises(ValueError, match="top_k"):
        top_k_filter(logits, -2)


def test_invalid_temperature_tensor_fails_at_run_time():
    run = tf.function(
        lambda temperature: sample(
            NeverEndModel().next_logits, {}, 2, 3, temperature=temperature, seed=1
        ).tokens
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="temperature"):
        run(tf.constant(0.0))
    assert run(tf.constant(0.5)).shape == (2, 3)


def test_sampling_never_produces_pad_or_start_and_forbids_unk_on_request():
    model = ReservedPreferringModel(end_step=3)
    for unk_id, forbidden in ((None, [PAD_ID, START_ID]), (UNK_ID, [PAD_ID, START_ID, UNK_ID])):
        result = sample(model.next_logits, {}, 300, 6, seed=13, unk_id=unk_id)
        tokens, lengths = result.tokens.numpy(), result.lengths.numpy()
        produced = np.concatenate([row[:n] for row, n in zip(tokens, lengths)])
        assert not np.isin(produced, forbidden).any(), unk_id
    # The filters keep the masks: top-k and top-p never reopen a reserved token.
    result = sample(model.next_logits, {}, 300, 6, seed=14, top_k=3, top_p=0.99, unk_id=UNK_ID)
    tokens, lengths = result.tokens.numpy(), result.lengths.numpy()
    produced = np.concatenate([row[:n] for row, n in zip(tokens, lengths)])
    assert not np.isin(produced, [PAD_ID, START_ID, UNK_ID]).any()


@pytest.mark.parametrize("temperature", [1e3, 1e9, 1e30])
def test_a_high_temperature_never_reopens_the_reserved_tokens(temperature):
    # The masks were applied before the division by the temperature, which brought a
    # masked token's -1e9 back within reach: PAD and START sampled at high temperatures.
    model = ReservedPreferringModel(end_step=3)
    result = sample(model.next_logits, {}, 300, 6, seed=15, temperature=temperature,
                    unk_id=UNK_ID)
    tokens, lengths = result.tokens.numpy(), result.lengths.numpy()
    produced = np.concatenate([row[:n] for row, n in zip(tokens, lengths)])
    assert not np.isin(produced, [PAD_ID, START_ID, UNK_ID]).any()
    assert np.all(result.scores.numpy() > -1e8)  # no masked token's log-probability


def test_the_lowest_temperature_never_reopens_the_reserved_tokens():
    # Allowed tokens far below the reserved ones (-2000 against 0): divided by 1e-6 they
    # fell below the masks' -1e9, and PAD and START were sampled.
    logits = tf.constant([[0.0, 0.0] + [-2000.0] * 4])

    def next_logits(tokens, cache, index):
        return tf.repeat(logits, tf.shape(tokens)[0], axis=0), cache

    result = sample(next_logits, {}, 64, 1, seed=17, temperature=1e-6)
    assert set(np.unique(result.tokens.numpy()[:, 0])) <= {2, 3, 4, 5}


def test_a_high_temperature_samples_the_allowed_tokens_uniformly():
    frequencies = _frequencies(_one_step_samples(seed=16, temperature=1e9))
    allowed = _PROBS > 0  # END and tokens 3-5; PAD and START are masked
    np.testing.assert_allclose(frequencies[allowed], 0.25, atol=0.03)
    assert frequencies[~allowed].sum() == 0


def test_invalid_seeds_and_row_keys_are_refused_naming_them():
    model = NeverEndModel()
    for seed in (tf.constant([5, 6, 7]), 2.9, np.float32(3.0), 2**64):
        with pytest.raises(ValueError, match="seed"):
            sample(model.next_logits, {}, 3, 3, seed=seed)
    with pytest.raises(ValueError, match="row_keys"):
        sample(model.next_logits, {}, 3, 3, seed=1, row_keys=[4, 5])
    # Fractional keys were cut to integers: 0.2 and 0.9 were one stream.
    with pytest.raises(ValueError, match="row_keys"):
        sample(model.next_logits, {}, 2, 3, seed=1, row_keys=tf.constant([0.2, 0.9]))
    # What is accepted: ints (NumPy's too), a scalar or (2,) int tensor.
    for seed in (7, np.int64(7), tf.constant(7), tf.constant([7, 0])):
        np.testing.assert_array_equal(
            sample(model.next_logits, {}, 3, 3, seed=seed).tokens,
            sample(model.next_logits, {}, 3, 3, seed=7).tokens)


def test_a_row_sample_depends_on_its_key_not_on_its_batch_neighbours():
    model, sources = _history_inputs()
    keys = [100 + 7 * i for i in range(len(sources))]

    def run(rows):
        return sample(
            model.next_logits, model.initial_cache([sources[i] for i in rows]), len(rows), 10,
            seed=3, row_keys=tf.constant([keys[i] for i in rows], tf.int64),
        )

    batch = run(list(range(16)))
    order = [5, 2, 9]
    reordered = run(order)
    for position, row in enumerate(order):
        np.testing.assert_array_equal(reordered.tokens[position], batch.tokens[row])
        np.testing.assert_allclose(reordered.scores[position], batch.scores[row], rtol=1e-6)
    alone = run([7])
    np.testing.assert_array_equal(alone.tokens[0], batch.tokens[7])
    # Rows with different keys draw different random numbers: the same example under
    # 16 keys gives several different samples.
    same = sample(
        model.next_logits, model.initial_cache([sources[0]] * 16), 16, 10, seed=3,
        row_keys=tf.constant(keys, tf.int64),
    )
    assert len({tuple(row) for row in same.tokens.numpy()}) > 1


def test_seeded_sampling_is_reproducible_and_seed_dependent():
    model, sources = _history_inputs()

    def run(seed):
        return sample(model.next_logits, model.initial_cache(sources), 16, 10, seed=seed)

    first, again, other = run(7), run(7), run(8)
    np.testing.assert_array_equal(first.tokens, again.tokens)
    assert not np.array_equal(first.tokens, other.tokens)
    compiled = tf.function(run)(tf.constant([7, 0]))
    np.testing.assert_array_equal(compiled.tokens, first.tokens)


def test_sample_scores_are_model_log_probs_and_bounds_hold():
    model, sources = _history_inputs()
    bounds = [10, 2] * 8
    result = sample(
        model.next_logits, model.initial_cache(sources), 16, 10, temperature=1.5,
        top_p=0.9, seed=9, max_lengths=bounds,
    )
    for b, source in enumerate(sources):
        length = int(result.lengths[b])
        tokens = result.tokens[b].numpy()
        assert length <= bounds[b] and np.all(tokens[length:] == 0)
        assert length == bounds[b] or tokens[length - 1] == END_ID
        prefix, total = [1], 0.0
        for token in tokens[:length]:
            total += model.log_probs(prefix, source)[token]
            prefix.append(int(token))
        np.testing.assert_allclose(result.scores[b], total, rtol=1e-5)


def test_every_step_draws_fresh_randomness():
    # A model that is uniform over 3 tokens at every step: reusing one seed for all steps
    # would repeat the same token along each row.
    result = sample(NeverEndModel().next_logits, {}, 8, 10, seed=11)
    for row in result.tokens.numpy():
        assert len(set(row)) > 1

"""`Translator` in process: searches agree with each other, batching changes nothing, bounds hold."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.text import PAD_ID
from tests.export.conftest import DECODING

# Sources of every kind for the bound checks: empty, short, long, beyond max_input_length.
BOUND_SOURCES = ["", "ka", "bal dor fen gim hut", " ".join(["kor lam"] * 10), "ka " * 200]


def search_tokens(translator, sentences, search):
    """The token matrix `(B, max_output_length)` of `search`, through the Translator's own
    tokenization and `_search` (the public outputs are detokenized text)."""
    config = translator.config
    text = tf.constant(sentences)
    source = translator.source_tokenizer.tokenize(
        text, max_length=config.max_input_length, add_end=True)
    lengths = tf.cast(source.row_lengths(), tf.int32)
    source_ids = source.to_tensor(PAD_ID)
    max_lengths = tf.minimum(lengths + config.extra_length, config.max_output_length)
    result = translator._search(source_ids, tf.shape(source_ids)[0], max_lengths, search)
    return result.tokens.numpy(), result.lengths.numpy()


def source_token_lengths(tokenizer, sentences):
    """Source lengths as the Translator counts them: END included, truncated."""
    ids = tokenizer.tokenize(tf.constant(sentences), max_length=DECODING["max_input_length"],
                             add_end=True)
    return ids.row_lengths().numpy()


def expected_bounds(tokenizer, sentences):
    return np.minimum(source_token_lengths(tokenizer, sentences) + DECODING["extra_length"],
                      DECODING["max_output_length"])


def outputs(translator, sentences):
    result = translator.translate(tf.constant(sentences, tf.string))
    return (
        [t.decode("utf-8") for t in result["translation"].numpy().tolist()],
        result["score"].numpy(),
        result["length"].numpy(),
    )


@pytest.mark.slow
def test_tiny_model_learned_to_copy(copy_task):
    """The fixture model is trained for real: greedy output is the source, unseen sentences."""
    translations, _, lengths = outputs(copy_task.translator(search="greedy"), copy_task.held_out)
    exact = sum(t == s for t, s in zip(translations, copy_task.held_out))
    assert exact >= 0.8 * len(copy_task.held_out), list(zip(copy_task.held_out, translations))
    assert np.all(lengths > 1)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["trained", "random_weights"])
def test_cached_greedy_equals_uncached_token_for_token(copy_task, random_model, which):
    model = copy_task.model if which == "trained" else random_model
    cached = copy_task.translator(model, search="greedy")
    uncached = copy_task.translator(model, search="greedy_uncached")
    sentences = copy_task.held_out[:12] + BOUND_SOURCES
    tokens_cached, lengths_cached = search_tokens(cached, sentences, "greedy")
    tokens_uncached, lengths_uncached = search_tokens(uncached, sentences, "greedy_uncached")
    np.testing.assert_array_equal(tokens_cached, tokens_uncached)
    np.testing.assert_array_equal(lengths_cached, lengths_uncached)
    # The exported outputs agree as well (text, length, log-probability).
    text_c, score_c, length_c = outputs(cached, sentences)
    text_u, score_u, length_u = outputs(uncached, sentences)
    assert text_c == text_u
    np.testing.assert_array_equal(length_c, length_u)
    np.testing.assert_allclose(score_c, score_u, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_beam_size_one_equals_greedy(copy_task):
    sentences = copy_task.held_out[:16] + BOUND_SOURCES[:3]
    greedy = copy_task.translator(search="greedy")
    beam = copy_task.translator(search="beam", beam_size=1)
    tokens_greedy, _ = search_tokens(greedy, sentences, "greedy")
    tokens_beam, _ = search_tokens(beam, sentences, "beam")
    np.testing.assert_array_equal(tokens_beam, tokens_greedy)
    text_g, score_g, length_g = outputs(greedy, sentences)
    text_b, score_b, length_b = outputs(beam, sentences)
    assert text_b == text_g
    np.testing.assert_array_equal(length_b, length_g)
    np.testing.assert_allclose(score_b, score_g, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_batch_equals_one_at_a_time(copy_task, search):
    """Padding a sentence next to longer ones changes nothing (masks are exact)."""
    translator = copy_task.translator(search=search, beam_size=3)
    sentences = copy_task.held_out[:10] + ["", "ka", "bal dor fen gim hut sel tam vin"]
    batch_text, batch_score, batch_length = outputs(translator, sentences)
    for i, sentence in enumerate(sentences):
        text, score, length = outputs(translator, [sentence])
        assert text[0] == batch_text[i], sentence
        assert length[0] == batch_length[i], sentence
        np.testing.assert_allclose(score[0], batch_score[i], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("search", ["greedy", "beam", "greedy_uncached", "sample"])
def test_random_model_that_never_ends_stops_at_the_bound(copy_task, random_model, search):
    """END is impossible, so every output runs to min(source + extra, max_output_length)."""
    translator = copy_task.translator(random_model, search=search, beam_size=2)
    _, _, lengths = outputs(translator, BOUND_SOURCES)
    bounds = expected_bounds(copy_task.tokenizer, BOUND_SOURCES)
    np.testing.assert_array_equal(lengths, bounds)
    assert bounds.max() == DECODING["max_input_length"] + DECODING["extra_length"]  # truncated


@pytest.mark.slow
@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_trained_model_outputs_are_bounded(copy_task, search):
    sentences = copy_task.held_out[:8] + BOUND_SOURCES
    _, _, lengths = outputs(copy_task.translator(search=search), sentences)
    assert np.all(lengths >= 1)
    assert np.all(lengths <= expected_bounds(copy_task.tokenizer, sentences))

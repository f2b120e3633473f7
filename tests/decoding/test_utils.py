"""Tests of the beam helpers in `keras_transformer.decoding.utils`."""

import numpy as np
import tensorflow as tf

from keras_transformer.decoding import SearchResult, gather_beams, tile_beams


def test_tile_then_gather_beams_moves_whole_rows_of_every_tensor():
    cache = {
        "keys": tf.reshape(tf.range(2 * 3 * 2, dtype=tf.float32), [2, 3, 2]),
        "pair": (tf.constant([10, 20]), tf.constant([[1], [2]])),
    }
    tiled = tile_beams(cache, 3)
    np.testing.assert_array_equal(tiled["pair"][0], [10, 10, 10, 20, 20, 20])
    assert tiled["keys"].shape == (6, 3, 2)
    # Mark each row with its beam, then reorder: example 0 takes beams (2, 0, 0),
    # example 1 takes beams (1, 1, 2).
    tiled["pair"] = (tf.range(6), tiled["pair"][1])
    gathered = gather_beams(tiled, tf.constant([[2, 0, 0], [1, 1, 2]]), 3)
    np.testing.assert_array_equal(gathered["pair"][0], [2, 0, 0, 4, 4, 5])
    np.testing.assert_array_equal(gathered["keys"][3], cache["keys"][1])


def test_search_result_fields():
    assert SearchResult._fields == ("tokens", "scores", "lengths", "normalized_scores")


def test_relaxed_batch_shapes_let_an_empty_axis_grow():
    from keras_transformer.decoding.utils import relaxed_batch_shapes

    shapes = relaxed_batch_shapes({"fixed": tf.zeros([2, 5, 3]), "growing": tf.zeros([2, 4, 0, 3])})
    assert shapes["fixed"].as_list() == [None, 5, 3]
    assert shapes["growing"].as_list() == [None, 4, None, 3]


def _full_top_k(logits, alive_log_probs, num_candidates, forbidden):
    """The plain formula `top_candidates` must equal: a top-k over every beam's every token."""
    from keras_transformer.decoding.utils import mask_tokens

    batch, beams = alive_log_probs.shape
    vocab = logits.shape[-1]
    log_probs = mask_tokens(tf.nn.log_softmax(logits, axis=-1), forbidden)
    scores = alive_log_probs[:, :, None] + tf.reshape(log_probs, [batch, beams, vocab])
    values, indices = tf.math.top_k(tf.reshape(scores, [batch, -1]), k=num_candidates)
    return values.numpy(), (indices // vocab).numpy(), (indices % vocab).numpy()


def test_top_candidates_equal_a_top_k_over_the_whole_vocabulary():
    from keras_transformer.decoding.utils import NEG_INF, top_candidates

    rng = np.random.RandomState(0)
    # (examples, beams, vocabulary, candidates): vocabularies that are and are not a
    # multiple of the chunk size, one smaller than a chunk, greedy's single candidate.
    for batch, beams, vocab, candidates in [(3, 4, 8000, 8), (2, 4, 37, 8), (2, 2, 5, 4),
                                            (4, 1, 300, 1), (1, 3, 64, 6)]:
        for trial in range(3):
            logits = tf.constant(rng.randn(batch * beams, vocab).astype("float32") * 4)
            alive = rng.randn(batch, beams).astype("float32") - 3
            if trial == 1:
                alive[:, 1:] = NEG_INF  # the first step: only the first beam is alive
            if trial == 2:  # many equal logits: ties go to the lower (beam, token)
                logits = tf.round(logits / 4)
                alive[:] = -1.0
            forbidden = (0, 1, 3) if vocab > 3 else (0, 1)
            alive = tf.constant(alive)
            expected = _full_top_k(logits, alive, candidates, forbidden)
            actual = top_candidates(logits, alive, candidates, forbidden)
            np.testing.assert_array_equal(actual.beams, expected[1])
            np.testing.assert_array_equal(actual.tokens, expected[2])
            np.testing.assert_allclose(actual.log_probs, expected[0], rtol=1e-6)


def test_top_candidates_when_forbidden_tokens_lead_a_chunk_in_every_beam():
    """A forbidden token tops its chunk once per beam, not once per example: with UNK the
    likeliest token of all 4 beams, the chunks of the 8 best allowed tokens had not all
    been kept (the 8th candidate came out at -30.0 instead of -5.3)."""
    from keras_transformer.decoding.utils import CANDIDATE_CHUNK, top_candidates

    beams, chunk = 4, CANDIDATE_CHUNK
    logits = np.full((beams, 4 * chunk), -20.0, "float32")
    logits[:, 3] = 10.0  # UNK (forbidden) leads chunk 0 of every beam
    for beam in range(beams):  # one good allowed token in each other chunk of every beam
        for c in (1, 2, 3):
            logits[beam, chunk * c + beam] = 5.0 - 0.1 * c - 0.01 * beam
    alive = tf.zeros([1, beams])
    for forbidden in [(0, 1, 3), (3,)]:
        expected = _full_top_k(tf.constant(logits), alive, 2 * beams, forbidden)
        actual = top_candidates(tf.constant(logits), alive, 2 * beams, forbidden)
        np.testing.assert_allclose(actual.log_probs, expected[0], rtol=1e-6)
        np.testing.assert_array_equal(actual.beams, expected[1])
        np.testing.assert_array_equal(actual.tokens, expected[2])


def test_top_candidates_never_propose_a_token_outside_the_vocabulary():
    from keras_transformer.decoding.utils import NEG_INF, top_candidates

    # Every token but END forbidden and every beam but one dead: the impossible candidates
    # that fill the slots still name real tokens (a dead beam is fed its token next step).
    logits = tf.zeros([2, 5])
    alive = tf.constant([[0.0, NEG_INF]])
    result = top_candidates(logits, alive, 4, forbidden=(0, 1, 3, 4))
    assert result.tokens.numpy().max() < 5 and result.tokens.numpy().min() >= 0
    assert result.tokens.numpy()[0, 0] == 2 and result.beams.numpy()[0, 0] == 0


def test_top_candidates_without_a_static_vocabulary_size():
    from keras_transformer.decoding.utils import top_candidates

    logits = np.random.RandomState(1).randn(4, 40).astype("float32")
    alive = tf.constant([[0.0, -2.0], [-1.0, -1.5]])
    expected = _full_top_k(tf.constant(logits), alive, 4, (0, 1))
    unknown = tf.function(lambda x: top_candidates(x, alive, 4, (0, 1)),
                          input_signature=[tf.TensorSpec([None, None], tf.float32)])
    actual = unknown(tf.constant(logits))
    np.testing.assert_array_equal(actual.beams, expected[1])
    np.testing.assert_array_equal(actual.tokens, expected[2])

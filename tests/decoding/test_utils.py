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

"""`InPlaceCache`: time-major buffers written in place read back like a growing cache."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.decoding import InPlaceCache

ANCESTRY = pytest.mark.parametrize("ancestry", [False, True], ids=["rows", "ancestry"])


class _Reference:
    """The growing batch-major cache the layout must behave like: `(N, t, ...)` per buffer,
    extended by concatenation and reordered by gathering rows."""

    def __init__(self, buffers):
        self.buffers = buffers

    def append_all(self, values):
        self.buffers = [np.concatenate([b, v[:, None]], axis=1)
                        for b, v in zip(self.buffers, values)]

    def gather(self, indices):
        self.buffers = [b[indices] for b in self.buffers]


def _run(layout, cache, index, values):
    """One step: append `values` to every buffer, return the reads and the new cache."""
    plan = layout.plan(cache, index, tf.shape(values[0])[0])
    buffers = [layout.append(plan, b, v) for b, v in zip(cache["buffers"], values)]
    reads = [layout.read(plan, b) for b in buffers]
    return reads, layout.finish(plan, cache, buffers)


@ANCESTRY
def test_reads_equal_a_growing_cache_through_reorders_drops_and_tiling(ancestry):
    """Random steps with beam-like reorders (rows repeated), drops (fewer rows) and a
    tiling: each step reads exactly the history a growing, gathered cache holds."""
    rng = np.random.default_rng(0)
    layout = InPlaceCache(ancestry=ancestry)
    rows, max_length = 3, 9
    cache = layout.initial(rows, max_length, [(2, 4), (5,)], tf.float32)
    reference = _Reference([np.zeros((rows, 0, 2, 4), "float32"),
                            np.zeros((rows, 0, 5), "float32")])
    cache = layout.tile(cache, 2)  # before the first write, as beam search does
    reference.gather(np.repeat(np.arange(rows), 2))
    rows *= 2
    for index in range(max_length):
        values = [rng.normal(size=(rows, 2, 4)).astype("float32"),
                  rng.normal(size=(rows, 5)).astype("float32")]
        reads, cache = _run(layout, cache, index, values)
        reference.append_all(values)
        for read, expected in zip(reads, reference.buffers):
            np.testing.assert_array_equal(read.numpy(), np.swapaxes(expected, 0, 1))
        assert int(cache["length"]) == index + 1
        if index == 4:  # a drop: fewer rows
            indices = np.array([0, 2, 3, 5])
        elif index == 6:  # a tiling in the middle of the search
            indices = np.repeat(np.arange(rows), 2)
        else:  # a beam reorder: rows may repeat
            indices = rng.integers(0, rows, size=rows)
        cache = (layout.tile(cache, 2) if index == 6
                 else layout.gather(cache, tf.constant(indices, tf.int32)))
        reference.gather(indices)
        rows = len(indices)


@ANCESTRY
def test_a_beam_reorder_moves_only_the_ancestry_table(ancestry):
    """With ancestry a reorder leaves the buffers as they are (no copy of keys/values);
    without, the rows kept are copied into fresh buffers."""
    layout = InPlaceCache(ancestry=ancestry)
    cache = layout.initial(2, 4, [(3,)], tf.float32)
    _, cache = _run(layout, cache, 0, [tf.constant([[1.0, 1, 1], [2, 2, 2]])])
    moved = layout.gather(cache, tf.constant([1, 1]))
    assert (moved["buffers"][0] is cache["buffers"][0]) == ancestry
    assert ("ancestry" in moved) == ancestry


@ANCESTRY
def test_each_call_of_a_traced_search_starts_from_a_fresh_cache(ancestry):
    """`InplaceUpdate` writes into its input's memory: a `tf.function` (a graph, as a
    SavedModel runs it) called again must not see what an earlier call wrote, even when
    the batch size is static (a constant buffer shape that Grappler could fold)."""
    layout = InPlaceCache(ancestry=ancestry)

    @tf.function(input_signature=[tf.TensorSpec([2, 3], tf.float32)], autograph=False)
    def two_steps(values):
        cache = layout.initial(2, 4, [(3,)], tf.float32)
        _, cache = _run(layout, cache, 0, [values])
        reads, cache = _run(layout, cache, 1, [values * 10.0])
        # Reads one position past the written ones would show the previous call's data.
        return reads[0], cache["buffers"][0]

    first = np.arange(6, dtype="float32").reshape(2, 3)
    second = -first - 1.0
    _, kept = two_steps(tf.constant(first))  # held while the next calls run
    for values in (second, first, second):
        read, _ = two_steps(tf.constant(values))
        np.testing.assert_array_equal(read.numpy(), np.stack([values, values * 10.0]))
    # A buffer shared between calls (a folded constant) would now hold `second`.
    np.testing.assert_array_equal(kept.numpy()[:4].reshape(2, 2, 3),  # (T, R, 3), flat
                                  np.stack([first, first * 10.0]))


def test_initial_shapes_and_invariants_keep_static_sizes():
    layout = InPlaceCache(ancestry=True)
    cache = layout.initial(tf.constant(3), 7, [(2, 4)], tf.float32)
    assert tuple(cache["buffers"][0].shape) == (7 * 3, 2, 4)  # (T_max * R, ...), flat
    invariants = layout.shape_invariants(cache)
    assert invariants["buffers"][0].as_list() == [None, 2, 4]
    assert invariants["ancestry"].as_list() == [7, None]
    assert invariants["length"].as_list() == []


@ANCESTRY
def test_an_empty_batch_tiles_and_reorders_to_empty_buffers(ancestry):
    """A request with no sentences: beam search still tiles and reorders the cache."""
    layout = InPlaceCache(ancestry=ancestry)
    cache = layout.tile(layout.initial(0, 4, [(3,)], tf.float32), 4)
    cache = layout.gather(cache, tf.zeros([0], tf.int32))
    assert tuple(cache["buffers"][0].shape) == (0, 3)
    assert int(cache["rows"]) == 0

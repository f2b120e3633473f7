"""A self-attention key/value cache written in place, time-major, for the searches' loops.

The growing cache (`(N, H, t, d_k)` per block, extended by `concat`) copies every written
position once a step, and beam search's reorder (`gather`) copies them again. Here each
block's keys and values live in a time-major buffer `(T_max, R, ...)` that a step writes in
place at its own position (`InplaceUpdate`, whose kernel writes into its input's memory), so
a step copies only its new position:
- without ancestry (greedy search, sampling): row `n` of the search is row `n` of the buffer
  at every position, a step reads the written positions as they are (a slice along the
  leading axis shares the buffer), and a reorder (finished sentences dropped) copies the
  written positions of the rows kept into a fresh buffer;
- with ancestry (beam search): a beam reorder moves only an `int32 (T_max, N)` table that
  says, for every row and position, which buffer row holds that row's history; a step writes
  its new position at the rows `0 ... N - 1` and reads the written positions of every row
  through the table (one gather, where the growing cache copies twice).

Hazards, and how this module stays clear of them: `InplaceUpdate` changes its input's buffer,
so a buffer is made by `Empty` (a stateful op: Grappler never folds it into a constant that
a later call would see changed) on every call of the search, and nothing but the next write
or read of the same step uses a buffer once it has been written. Positions past the written
ones are never read (`Empty` leaves them uninitialized).

`TransformerParts.search_step(..., cache_layout=InPlaceCache(...))` builds a step on this
cache; pass the same object to the search as `cache_rows`.
"""

import tensorflow as tf


class InPlaceCache:
    """Time-major key/value buffers written in place, and how a search moves their rows.

    A cache is a dict: `"buffers"`, a tuple of tensors `(T_max * R, ...)`, each the
    time-major `(T_max, R, ...)` stored flat so that a step's write and read are one op
    each (position `s` of buffer row `r` is row `s * R + r`); `"rows"`, int32 scalar, `R`
    (the same for all buffers, at least the search's rows `N`); `"length"`, int32 scalar,
    the positions written; and with `ancestry=True` `"ancestry"`, int32 `(T_max, N)`: row
    `n`'s entry at position `s` is in buffer row `ancestry[s, n]`.

    A step calls `plan(cache, index, rows)` once, then for every buffer `append(plan,
    buffer, values)` (values `(N, ...)` of position `index`) and `read(plan, buffer)`
    (`(index + 1, N, ...)`, the written positions of every row), and `finish(plan, cache,
    buffers)` with the appended buffers. The searches call `tile`, `gather` and
    `shape_invariants` (their `cache_rows` argument).

    Args:
        ancestry: bool, reorder rows through an ancestry table (beam search) rather than by
            copying the written positions (a search that reorders rarely). Defaults to
            `False`.

    Example:

    >>> layout = InPlaceCache()
    >>> cache = layout.initial(rows=2, max_length=4, shapes=[(3,)], dtype=tf.float32)
    >>> plan = layout.plan(cache, 0, 2)
    >>> buffer = layout.append(plan, cache["buffers"][0], tf.ones([2, 3]))
    >>> layout.read(plan, buffer).shape.as_list()
    [1, 2, 3]
    """

    def __init__(self, ancestry=False):
        self.ancestry = bool(ancestry)

    def initial(self, rows, max_length, shapes, dtype):
        """An empty cache: one buffer of `max_length` positions x `rows` rows per entry of
        `shapes` (each entry the shape of one row's entry, e.g. `(heads, head_dim)`)."""
        rows = tf.convert_to_tensor(rows, tf.int32)
        cache = {
            "buffers": tuple(_empty(max_length * rows, shape, dtype) for shape in shapes),
            "rows": rows,
            "length": tf.zeros([], tf.int32),
        }
        if self.ancestry:
            cache["ancestry"] = tf.zeros([max_length, rows], tf.int32)
        return cache

    def plan(self, cache, index, rows):
        """What a step at position `index` with `rows` rows writes and reads (see class)."""
        index = tf.cast(index, tf.int32)
        capacity = cache["rows"]  # R
        own = tf.range(rows, dtype=tf.int32)  # (N,)
        plan = {
            "write": index * capacity + own,  # (N,) position `index` of rows 0 .. N - 1
            "shape": tf.stack([index + 1, rows]),  # of a read, before each entry's shape
        }
        if self.ancestry:
            ancestry = cache["ancestry"]  # (T_max, N)
            at_index = tf.equal(tf.range(tf.shape(ancestry)[0])[:, None], index)
            ancestry = tf.where(at_index, own[None, :], ancestry)  # (T_max, N)
            positions = tf.range(index + 1)[:, None]  # (t + 1, 1)
            plan["ancestry"] = ancestry
            plan["read"] = tf.reshape(positions * capacity + ancestry[: index + 1], [-1])
        else:
            # Without ancestry R == N: the written positions are the first (t + 1) * N rows.
            plan["read"] = tf.reshape((index + 1) * capacity, [1])  # the slice's end
        return plan

    def append(self, plan, buffer, values):
        """`buffer` with `values` `(N, ...)` written at the plan's position, in place."""
        return tf.raw_ops.InplaceUpdate(x=buffer, i=plan["write"], v=tf.cast(values, buffer.dtype))

    def read(self, plan, buffer):
        """The written positions of every row, `(index + 1, N, ...)`."""
        if self.ancestry:
            rows = tf.gather(buffer, plan["read"])  # ((t + 1) * N, ...)
        else:
            # A slice along the leading axis shares the buffer's memory.
            rows = tf.strided_slice(buffer, [0], plan["read"])  # ((t + 1) * N, ...)
        entry = tuple(buffer.shape.as_list()[1:])
        shapes = plan.setdefault("shapes", {})  # one shape op per step and entry shape
        if entry not in shapes:
            shapes[entry] = tf.concat([plan["shape"], tf.constant(entry, tf.int32)], 0)
        return tf.reshape(rows, shapes[entry])

    def finish(self, plan, cache, buffers):
        """The cache after the step: its appended `buffers`, one more position written."""
        result = dict(cache, buffers=tuple(buffers), length=plan["shape"][0])
        if self.ancestry:
            result["ancestry"] = plan["ancestry"]
        return result

    def tile(self, cache, beam_size):
        """Every row repeated `beam_size` times, copies adjacent (as `utils.tile_beams`)."""
        rows = tf.shape(cache["ancestry"])[1] if self.ancestry else cache["rows"]
        return self._copy_rows(cache, tf.repeat(tf.range(rows), beam_size))

    def gather(self, cache, indices):
        """The cache whose row `i` is row `indices[i]` of `cache`."""
        if not self.ancestry:
            return self._copy_rows(cache, indices)
        # Only the table moves: the buffers keep every row written so far.
        return dict(cache, ancestry=tf.gather(cache["ancestry"], indices, axis=1))

    def shape_invariants(self, cache):
        """`tf.while_loop` shape invariants: the row axes unknown."""
        invariants = {
            "buffers": tuple(tf.TensorShape([None] + b.shape.as_list()[1:])
                             for b in cache["buffers"]),
            "rows": tf.TensorShape([]),
            "length": tf.TensorShape([]),
        }
        if self.ancestry:
            invariants["ancestry"] = tf.TensorShape([cache["ancestry"].shape[0], None])
        return invariants

    def _copy_rows(self, cache, indices):
        """Fresh buffers holding the written positions of rows `indices` (any count)."""
        length, capacity = cache["length"], cache["rows"]
        count = tf.size(indices)
        written = tf.range(length)
        if self.ancestry:
            # Row i's history: buffer row ancestry[s, indices[i]] at each position s.
            sources = tf.gather(cache["ancestry"][:length], indices, axis=1)  # (t, N')
        else:
            sources = tf.broadcast_to(indices[None, :], [length, count])  # (t, N')
        flat_rows = tf.reshape(written[:, None] * capacity + sources, [-1])  # (t * N',)
        fresh_rows = tf.range(length * count)
        buffers = []
        for buffer in cache["buffers"]:
            # T_max (an empty batch has no rows to divide by, and keeps none).
            positions = tf.shape(buffer)[0] // tf.maximum(capacity, 1)
            fresh = _empty(positions * count, buffer.shape.as_list()[1:], buffer.dtype)
            buffers.append(tf.raw_ops.InplaceUpdate(
                x=fresh, i=fresh_rows, v=tf.gather(buffer, flat_rows)))
        result = {"buffers": tuple(buffers), "rows": count, "length": length}
        if self.ancestry:
            identity = tf.range(count)[None, :]  # each row now holds its own history
            result["ancestry"] = tf.tile(identity, [tf.shape(cache["ancestry"])[0], 1])
            result["ancestry"].set_shape([cache["ancestry"].shape[0], None])
        return result


def _empty(rows, entry, dtype):
    """A new uninitialized `(rows, *entry)` buffer on every run (`Empty` is stateful: never
    constant-folded into a tensor that a later run would find changed)."""
    shape = tf.concat([tf.reshape(tf.cast(rows, tf.int32), [1]),
                       tf.constant(list(entry), tf.int32)], 0)
    buffer = tf.raw_ops.Empty(shape=shape, dtype=dtype, init=False)
    buffer.set_shape([None] + list(entry))
    return buffer

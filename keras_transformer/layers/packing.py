"""The real positions of a padded batch, packed into rows (the stacks' `skip_padding`)."""

from keras import ops


class PackedRows:
    """The real (non-padding) positions of a `(B, T)` padding mask, as a flat row index.

    Per-token work (projections, feed-forward layers, norms, residuals, dropout) gives the
    same result at a real position whether padding is there or not, so it can run on the
    real positions alone, packed into `(N, ...)` rows: `pack` gathers them out of a
    `(B, T, ...)` tensor, `unpack` scatters rows back into `(B, T, ...)` with zeros at the
    padding (for the attention, which needs the `(B, T)` layout). Shapes depend on the data,
    so this does not run under XLA.

    Args:
        padding_mask: bool or int `(B, T)`, true (non-zero) for real positions: token ids
            with 0 as padding will do.

    Example:

    >>> from keras import ops
    >>> layout = PackedRows(ops.array([[1, 1, 0], [1, 0, 0]]))
    >>> x = ops.reshape(ops.arange(6, dtype="float32"), (2, 3, 1))
    >>> ops.convert_to_numpy(layout.pack(x)).ravel().tolist()
    [0.0, 1.0, 3.0]
    >>> ops.convert_to_numpy(layout.unpack(layout.pack(x)))[..., 0].tolist()
    [[0.0, 1.0, 0.0], [3.0, 0.0, 0.0]]
    """

    def __init__(self, padding_mask):
        self.mask = ops.cast(padding_mask, "bool")
        self.batch, self.length = ops.shape(self.mask)[0], ops.shape(self.mask)[1]
        self.rows = ops.where(ops.reshape(self.mask, (-1,)))[0]  # (N,)

    def pack(self, values):
        """`(B, T, ...)` -> `(N, ...)`: the real positions' rows, in batch-major order."""
        tail = tuple(values.shape[2:])
        return ops.take(ops.reshape(values, (self.batch * self.length,) + tail), self.rows,
                        axis=0)

    def unpack(self, rows):
        """`(N, ...)` rows -> `(B, T, ...)`, zeros at the padding."""
        tail = tuple(rows.shape[1:])
        flat = ops.scatter(self.rows[:, None], rows, (self.batch * self.length,) + tail)
        return ops.reshape(flat, (self.batch, self.length) + tail)

"""Mask helpers shared by every attention layer: one place that merges masks.

Keras' convention holds throughout: a boolean mask is `True` where a position may be attended
to (kept) and `False` where it is hidden.
"""

import keras
from keras import ops

try:  # Keras keeps this accessor private; keras-hub imports it the same way.
    from keras.src.backend import get_keras_mask as _get_keras_mask
except ImportError:  # pragma: no cover - older or newer Keras layouts
    def _get_keras_mask(x):
        return getattr(x, "_keras_mask", None)

# Masked logits get this value instead of `-inf`: softmax then gives exactly 0 to masked keys,
# and a row whose keys are all masked (an all-padding sequence) gives uniform weights instead of
# NaN. Attention logits are computed in float32 (see `MultiHeadAttention`), where it is finite.
_LARGE_NEGATIVE = {"float16": -3.0e4, "bfloat16": -1.0e9, "float32": -1.0e9, "float64": -1.0e9}


def large_negative(dtype="float32"):
    """The large finite negative used for masked logits of `dtype`."""
    return _LARGE_NEGATIVE.get(str(dtype).split(".")[-1], -1.0e9)


def causal_mask(query_length, key_length, offset=0):
    """Look-ahead mask: query `i` (at absolute position `offset + i`) sees keys `j <= offset + i`.

    Args:
        query_length: int or scalar tensor, T.
        key_length: int or scalar tensor, S.
        offset: int or scalar tensor, absolute position of the first query. Used when decoding
            with a cache: the query at step `t` sits at position `t` of a key axis of length S.

    Returns:
        bool tensor `(1, T, S)`.
    """
    rows = ops.expand_dims(ops.arange(query_length, dtype="int32"), 1) + ops.cast(offset, "int32")
    cols = ops.expand_dims(ops.arange(key_length, dtype="int32"), 0)
    return ops.expand_dims(ops.greater_equal(rows, cols), 0)


def check_rank(name, shape, form):
    """Refuses an argument `name` whose `shape` (a tuple, or `None` when not given) has
    another rank than `form` (a rank-2 query failed in a reshape that named no argument)."""
    if shape is not None and len(shape) != len(form.split(",")):
        raise ValueError(f"`{name}` must be {form}, got shape {tuple(shape)}.")


def check_mask_rank(name, value, form="(B, S)"):
    """Refuses a mask `value` (or `None`) of another rank than `form`, naming argument `name`
    (a `(B, S)` mask given as `(B, 1, S)` would broadcast into a wrong mask, or fail deep in
    a graph)."""
    check_rank(name, None if value is None else value.shape, form)


def _check_mask_sizes(name, mask, sizes):
    """Refuses a mask whose known sizes differ from the known `sizes` (`(B, S)` or
    `(B, T, S)`; a batch of 1, and an attention mask's single query row, broadcast). A
    `(B, 1)` padding mask broadcast over every key hid all of them or none; a mask one
    position longer failed in a LogicalAnd naming no argument."""
    if mask is None:
        return
    shape = tuple(mask.shape)
    known = [s if isinstance(s, int) else None for s in sizes]
    wrong = [
        axis for axis, (size, want) in enumerate(zip(shape, known))
        if size is not None and want is not None and size != want
        and not (size == 1 and (axis == 0 or (axis == 1 and len(sizes) == 3)))
    ]
    if wrong:
        form = "(B, S)" if len(sizes) == 2 else "(B, T, S)"
        expected = tuple("?" if want is None else want for want in known)
        raise ValueError(f"`{name}` must be {form} = {expected} for these inputs, got shape "
                         f"{shape}.".replace("'?'", "?"))


def merge_masks(
    padding_mask=None,
    attention_mask=None,
    use_causal_mask=False,
    query_length=None,
    key_length=None,
    causal_offset=0,
    batch_size=None,
):
    """Combines the mask arguments of an attention call into one `(B or 1, T or 1, S)` bool
    mask.

    Args:
        padding_mask: bool or int `(B, S)`, `True`/non-zero for real key positions.
        attention_mask: bool or int `(B, T, S)`, `True`/non-zero where query `t` may see key `s`.
        use_causal_mask: bool, adds the look-ahead mask.
        query_length: T, needed for the causal mask.
        key_length: S, needed for the causal mask.
        causal_offset: absolute position of the first query (cached decoding).
        batch_size: int or `None`, B where known, to check the masks' batch against.

    Returns:
        bool tensor `(B, T, S)`, `(B, 1, S)` with only a padding mask, `(1, T, S)` with only
        a causal mask, or `None` when there is nothing to mask.

    Raises:
        ValueError: a mask of another rank, or of another size than B (or 1), T and S where
            both are known before running.
    """
    check_mask_rank("padding_mask", padding_mask)
    check_mask_rank("attention_mask", attention_mask, "(B, T, S)")
    _check_mask_sizes("padding_mask", padding_mask, (batch_size, key_length))
    _check_mask_sizes("attention_mask", attention_mask, (batch_size, query_length, key_length))
    mask = None
    if padding_mask is not None:
        mask = ops.expand_dims(ops.cast(padding_mask, "bool"), 1)  # (B, 1, S)
    if attention_mask is not None:
        attention_mask = ops.cast(attention_mask, "bool")  # (B, T, S)
        mask = attention_mask if mask is None else ops.logical_and(mask, attention_mask)
    if use_causal_mask:
        causal = causal_mask(query_length, key_length, causal_offset)  # (1, T, S)
        mask = causal if mask is None else ops.logical_and(mask, causal)
    return mask


def padding_mask_from_ids(token_ids, pad_id=0):
    """`(B, T)` bool mask, `True` where `token_ids != pad_id`."""
    return ops.not_equal(token_ids, pad_id)


def memory_padding_mask(memory, padding_mask=None):
    """The padding mask of a memory `(B, S, d)` as a bool `(B, S)` tensor, never `None`.

    Args:
        memory: `(B, S, d)`, such as the encoder's output.
        padding_mask: bool or int `(B, S)` or `None`, `True`/non-zero for real positions.

    Returns:
        `padding_mask` if given, else the Keras mask of `memory`, else all `True`: a tensor in
        every case, so a cache that holds it has the same structure whatever the source.
    """
    if padding_mask is None:
        padding_mask = keras_mask(memory)
    if padding_mask is None:
        return ops.ones(ops.shape(memory)[:2], dtype="bool")
    return ops.cast(padding_mask, "bool")


def check_integer_position(name, value):
    """Refuses a position that is not an integer: a Python or NumPy float or bool, or a
    tensor of a float or bool dtype.

    Positions are whole: `int(1.7)` would silently use position 1, and a sinusoid of 1.7 a
    position between two; `True` would be position 1.

    Args:
        name: the argument's name, for the message.
        value: the position (int, NumPy scalar, scalar tensor).

    Raises:
        TypeError: when `value` is a float or a bool, or of such a dtype.
    """
    dtype = str(getattr(value, "dtype", ""))
    if isinstance(value, (float, bool)) or "float" in dtype or "bool" in dtype:
        raise TypeError(f"`{name}` must be an integer position, got {value!r} "
                        f"({type(value).__name__}).")


def static_int(value):
    """`value` as a Python int when it is known before a graph runs (a Python, NumPy or eager
    integer, or a constant of a graph), else None (a graph tensor known only when the graph
    runs, or a Keras symbolic tensor)."""
    if isinstance(value, int):
        return int(value)
    if keras.backend.backend() != "tensorflow" or isinstance(value, keras.KerasTensor):
        try:
            return int(value)
        except (TypeError, ValueError):
            return None
    import tensorflow as tf

    try:
        known = tf.get_static_value(value)
    except TypeError:
        return None
    return None if known is None else int(known)


def checked_position(position, fits, describe):
    """`position`, refused unless `fits(position)` holds: at once when the position is known
    before running, when the graph runs otherwise.

    The one shape of the package's position checks (a cache index, a learned position table,
    a decoding step): a value known before running (a Python, NumPy or eager integer, or a
    constant of a graph) raises `ValueError` here; a graph tensor gets a
    `tf.debugging.Assert` (which XLA, having no assertions, compiles away). A Keras symbolic
    tensor, or a position on another backend known only when running, passes unchecked.

    Args:
        position: the integer position (int, NumPy scalar, scalar tensor).
        fits: maps the position (an int, or an int32 tensor) to whether it is valid: a bool,
            or a boolean tensor where a bound is known only when the graph runs.
        describe: maps the position (an int, or an int32 tensor for the assertion) to the
            message's parts (strings and positions), joined for the `ValueError` and printed
            by the assertion.

    Returns:
        `position`, or where the check runs with the graph, `position` as int32 after it.

    Raises:
        ValueError: when the position is known before running and does not fit.
    """
    known = static_int(position)
    if known is not None:
        holds = fits(known)
        if isinstance(holds, bool) or not hasattr(holds, "dtype"):
            if not holds:
                raise ValueError("".join(str(part) for part in describe(known)))
            return position
    if keras.backend.backend() != "tensorflow" or isinstance(position, keras.KerasTensor):
        return position
    import tensorflow as tf

    index = tf.cast(position, tf.int32) if known is None else tf.constant(known, tf.int32)
    holds = fits(index)
    if tf.get_static_value(holds) is not None:  # eager, or fixed when the graph is built
        if not bool(tf.get_static_value(holds)):
            raise ValueError("".join(str(tf.get_static_value(part)) if tf.is_tensor(part)
                                     else str(part) for part in describe(index)))
        return position
    check = tf.debugging.Assert(holds, list(describe(index)))
    with tf.control_dependencies([check]):
        return tf.identity(index)


def keras_mask(x):
    """The Keras mask carried by `x` (set by a masking layer such as `PositionalEmbedding`)."""
    return None if x is None else _get_keras_mask(x)

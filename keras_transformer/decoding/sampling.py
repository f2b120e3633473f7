"""Ancestral sampling with temperature, top-k and top-p (nucleus) filtering."""

import numpy as np
import tensorflow as tf

from keras_transformer.decoding.greedy_search import decode_single_path
from keras_transformer.decoding import utils

# Bits of a hashed random number turned into a uniform float32: its mantissa holds 24.
_UNIFORM_BITS = 24


def _check_top_k(top_k):
    if (isinstance(top_k, (tf.Tensor, str, bytes, bool, np.bool_))
            or int(top_k) != top_k or top_k < 0):
        raise ValueError(
            f"`top_k` must be a Python int >= 0 (0 keeps every token), got top_k={top_k!r}."
        )
    return int(top_k)


# Smallest `temperature` and `top_p`: below, float32 overflowed (log-probabilities divided
# by the temperature: PAD and START sampled) or underflowed (the nucleus comparison: every
# token masked, so uniformly random pieces).
MIN_SAMPLING_SETTING = 1e-6
# Largest `temperature`: float32's largest finite number (infinity is no distribution).
MAX_TEMPERATURE = float(tf.float32.max)


def _check_in_range(value, name, low, high, rule):
    """Checks `low <= value <= high` now for a number, or when the graph runs for a tensor.

    Returns:
        `value` (as a float32 tensor behind its run-time check when it was a tensor).
    """
    if not isinstance(value, (tf.Tensor, tf.Variable)):
        # A string or a bool passed `float()`: "0.5" failed inside the graph, True was 1.
        # The comparison also refuses NaN.
        if isinstance(value, (str, bytes, bool, np.bool_)) or not low <= float(value) <= high:
            raise ValueError(f"`{name}` must be {rule}, got {name}={value!r}.")
        return value
    value = tf.cast(value, tf.float32)
    check = tf.debugging.Assert(
        (value >= low) & (value <= high), [f"`{name}` must be {rule}, got", value]
    )
    with tf.control_dependencies([check]):
        return tf.identity(value)


def _check_temperature(temperature):
    return _check_in_range(
        temperature, "temperature", MIN_SAMPLING_SETTING, MAX_TEMPERATURE,
        f"a finite number of at least {MIN_SAMPLING_SETTING:g} (lower is greedier; use "
        "greedy search for the argmax)",
    )


def _check_top_p(top_p):
    return _check_in_range(
        top_p, "top_p", MIN_SAMPLING_SETTING, 1.0,
        f"in [{MIN_SAMPLING_SETTING:g}, 1] (1 keeps every token; use greedy search for the "
        "most likely token)",
    )


def top_k_filter(logits, top_k):
    """Masks every logit below the `top_k`-th largest of its row.

    Args:
        logits: float32 `(B, V)`.
        top_k: int `>= 0`, the number of tokens kept per row; `0` keeps all.

    Returns:
        float32 `(B, V)` with the masked logits set to `NEG_INF` (ties with the `top_k`-th
        value are kept).

    Raises:
        ValueError: when `top_k` is negative or not an int.
    """
    if _check_top_k(top_k) == 0:
        return logits
    # Past int32 (the vocabulary's dtype) it keeps every token, as at the vocabulary size.
    top_k = tf.minimum(min(top_k, tf.int32.max), tf.shape(logits)[-1])
    kth_largest = tf.math.top_k(logits, k=top_k).values[:, -1:]  # (B, 1)
    return tf.where(logits < kth_largest, utils.NEG_INF, logits)


def top_p_filter(logits, top_p):
    """Keeps the smallest set of most likely tokens whose probability reaches `top_p`.

    A token is kept when the probability of the tokens ranked strictly before it is below
    `top_p`, so the most likely token is always kept (Holtzman et al., 2020).

    Args:
        logits: float32 `(B, V)`.
        top_p: float in `[1e-6, 1]`, the nucleus mass; `1` keeps all.

    Returns:
        float32 `(B, V)` with the tokens outside the nucleus set to `NEG_INF`.

    Raises:
        ValueError: when a number `top_p` is outside `[1e-6, 1]` (a tensor one fails when
            the graph runs): a smaller `top_p` would mask every token and sample uniformly.

    References:
        Holtzman et al., 2020, "The Curious Case of Neural Text Degeneration".
    """
    top_p = _check_top_p(top_p)
    if isinstance(top_p, (int, float)) and top_p >= 1.0:
        return logits
    sorted_logits = tf.sort(logits, axis=-1, direction="DESCENDING")  # (B, V)
    mass_before = tf.math.cumsum(
        tf.nn.softmax(sorted_logits, axis=-1), axis=-1, exclusive=True
    )  # (B, V)
    in_nucleus = mass_before < tf.cast(top_p, tf.float32)  # (B, V), first always True
    smallest_kept = tf.reduce_min(
        tf.where(in_nucleus, sorted_logits, tf.float32.max), axis=-1, keepdims=True
    )  # (B, 1)
    return tf.where(logits < smallest_kept, utils.NEG_INF, logits)


def _is_int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _seed_tensor(seed):
    """A `(2,)` int64 seed; a random one when `seed` is `None`.

    Raises:
        ValueError: for a seed that is not an int64 integer, nor an integer tensor of
            shape `()` or `(2,)` (a fraction was truncated, other shapes failed in a
            reshape that named no argument).
    """
    if seed is None:
        return tf.random.uniform([2], maxval=tf.int64.max, dtype=tf.int64)
    if _is_int(seed):
        if not -(2**63) <= int(seed) < 2**63:
            raise ValueError(f"`seed` must fit in int64, got seed={seed}.")
        return tf.constant([int(seed), 0], tf.int64)
    rule = ("`seed` must be None, an int, or an integer tensor of shape () or (2,); got "
            f"seed={seed!r}.")
    if isinstance(seed, (float, np.floating, bool, np.bool_, str, bytes)):
        raise ValueError(rule)
    try:
        seed = tf.convert_to_tensor(seed)
    except (TypeError, ValueError) as error:
        raise ValueError(rule) from error
    if not seed.dtype.is_integer or seed.shape.rank not in (0, 1, None) or (
            seed.shape.rank == 1 and seed.shape[0] not in (2, None)):
        raise ValueError(rule)
    seed = tf.cast(seed, tf.int64)
    if seed.shape.rank == 0:
        return tf.stack([seed, tf.zeros([], tf.int64)])
    return tf.reshape(seed, [2])


def _row_streams(seed, row_keys, batch_size):
    """`(B, 3)` int64: the random stream of each row, `(seed[0], seed[1], row key)`."""
    if row_keys is None:
        row_keys = tf.range(batch_size, dtype=tf.int64)
    row_keys = tf.convert_to_tensor(row_keys)
    if not row_keys.dtype.is_integer:  # fractions were cut: 0.2 and 0.9 one stream
        raise ValueError(f"`row_keys` must be integers, got dtype {row_keys.dtype.name}.")
    row_keys = tf.cast(row_keys, tf.int64)
    static_batch = tf.get_static_value(batch_size)
    if row_keys.shape.rank not in (1, None) or (
            static_batch is not None and row_keys.shape.rank == 1
            and row_keys.shape[0] not in (None, int(static_batch))):
        raise ValueError(f"`row_keys` must hold one key per example, shape ({static_batch},); "
                         f"got shape {tuple(row_keys.shape)}.")
    row_keys = tf.reshape(row_keys, [-1])  # (B,)
    seeds = tf.broadcast_to(seed[None], [tf.shape(row_keys)[0], 2])  # (B, 2)
    return tf.concat([seeds, row_keys[:, None]], axis=1)


def _uniforms(streams, step):
    """One float32 in `[0, 1)` per row: the FarmHash fingerprint of `(stream, step)`.

    A counter-based generator: the number depends only on the row's stream and the step,
    not on the other rows (the stateless `tf.random` ops take one seed for a whole
    tensor). `tf.fingerprint` is a core op, so the export runs on stock TF Serving.
    """
    steps = tf.fill([tf.shape(streams)[0], 1], tf.cast(step, tf.int64))  # (B, 1)
    digest = tf.fingerprint(tf.concat([streams, steps], axis=1))  # (B, 8) uint8
    num_bytes = _UNIFORM_BITS // 8
    weights = tf.constant([256 ** (num_bytes - 1 - i) for i in range(num_bytes)], tf.int32)
    bits = tf.reduce_sum(tf.cast(digest[:, :num_bytes], tf.int32) * weights, axis=1)  # (B,)
    return tf.cast(bits, tf.float32) / float(2**_UNIFORM_BITS)


def _inverse_cdf_sample(logits, uniforms):
    """Draws one token per row of `softmax(logits)` with the given uniform numbers.

    Token `i` is drawn when `cdf[i - 1] <= u * cdf[-1] < cdf[i]`, so a token of probability
    0 (a masked logit) is never drawn.

    Args:
        logits: float32 `(B, V)`.
        uniforms: float32 `(B,)` in `[0, 1)`.

    Returns:
        int32 `(B,)`.
    """
    cdf = tf.math.cumsum(tf.nn.softmax(logits, axis=-1), axis=-1)  # (B, V)
    total = cdf[:, -1:]  # (B, 1), 1 up to rounding
    # Strictly below the total, so the count below always names a token of the row.
    threshold = tf.minimum(uniforms[:, None] * total, tf.math.nextafter(total, 0.0))
    return tf.reduce_sum(tf.cast(cdf <= threshold, tf.int32), axis=-1)


def sample(
    next_logits,
    initial_cache,
    batch_size,
    max_length,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    seed=None,
    start_id=1,
    end_id=2,
    pad_id=0,
    max_lengths=None,
    unk_id=None,
    row_keys=None,
):
    """Samples one continuation per example, token by token, with a cached decoder step.

    At every step PAD and START (and UNK when `unk_id` is given) are masked, the
    log-probabilities are divided by `temperature`, restricted to the `top_k` most likely
    tokens and to the top-p nucleus, and a token is drawn by inverse-CDF sampling with one
    uniform number per row. That number is a hash (`tf.fingerprint`) of `seed`, the row's
    key in `row_keys` and the step, so a row's sample depends only on its seed, its key and
    its own logits, never on the other rows, and a given seed gives the same samples
    eagerly, in a `tf.function` and in a SavedModel. Stopping, bounds and outputs are as
    in `greedy_search`.

    Args:
        next_logits: callable `(tokens, cache, index) -> (logits, cache)` as in
            `greedy_search`.
        initial_cache: nest of tensors with leading axis `B`.
        batch_size: int or int32 scalar tensor, `B`.
        max_length: int, the static number of steps.
        temperature: float or float32 scalar tensor, finite and `>= 1e-6`; lower is
            greedier, higher nears uniform over the allowed tokens. Defaults to `1.0`.
        top_k: int `>= 0`, sample among the `top_k` most likely tokens; `0` disables.
            Defaults to `0`.
        top_p: float or float32 scalar tensor in `[1e-6, 1]`, sample inside the nucleus of
            this mass; `1.0` disables. Defaults to `1.0`.
        seed: `None`, an int, or an integer scalar or `(2,)` tensor. `None` draws a
            fresh seed on every call. Defaults to `None`.
        start_id: int, the START token. Defaults to `1`.
        end_id: int, the END token. Defaults to `2`.
        pad_id: int, written after END. Defaults to `0`.
        max_lengths: optional int `(B,)` (or one int for all), per-example bounds clipped to
            `[1, max_length]`. Defaults to `None`.
        unk_id: int or `None`, the UNK token, never produced when given, as in
            `greedy_search`. Defaults to `None`.
        row_keys: optional int `(B,)`, each row's key into the random stream of `seed`:
            rows with the same seed and key draw the same random numbers, wherever they
            sit in the batch. Defaults to `None`, the row's index, which gives the rows of
            one call different numbers but makes a row's sample depend on its position;
            pass keys (the exported `translate_seeded` signature passes the request's
            per-sentence seeds) to make it independent of the batch.

    Returns:
        A `SearchResult` as returned by `greedy_search`; `scores` sums the model's own
        log-probabilities (temperature 1, unfiltered) of the sampled tokens.

    Raises:
        ValueError: when `temperature` is not finite or below 1e-6, `top_k` is not an
            int `>= 0`, `top_p` is outside `[1e-6, 1]` (tensors are checked when the graph
            runs and raise `tf.errors.InvalidArgumentError`), `seed` is not an integer of
            one of the shapes above, or `row_keys` does not hold one key per example.

    Example:

    >>> def next_logits(tokens, cache, index):
    ...     return tf.constant([[0., 0., 5., 0.]]), cache
    >>> sample(next_logits, {}, 1, 3, top_k=1, seed=7).tokens.numpy().tolist()
    [[2, 0, 0]]
    """
    temperature = _check_temperature(temperature)
    top_k = _check_top_k(top_k)
    top_p = _check_top_p(top_p)
    batch_size = tf.convert_to_tensor(batch_size, tf.int32)
    streams = _row_streams(_seed_tensor(seed), row_keys, batch_size)  # (B, 3)

    def select_token(log_probs, step):
        # Log-probabilities differ from the logits by a constant per row, so they give the
        # same tempered, filtered distribution. The forbidden tokens (masked already) stay
        # masked at any temperature: a high one would bring their NEG_INF back within
        # reach, a low one push the allowed tokens below it, so the allowed ones are
        # tempered from their row's best, which stays at 0.
        allowed = log_probs > utils.IMPOSSIBLE  # (B, V)
        best = tf.reduce_max(log_probs, axis=-1, keepdims=True)  # (B, 1), an allowed one
        logits = tf.where(allowed, (log_probs - best) / temperature, utils.NEG_INF)
        logits = top_k_filter(logits, top_k)
        logits = top_p_filter(logits, top_p)
        return _inverse_cdf_sample(logits, _uniforms(streams, step))  # (B,)

    return decode_single_path(
        next_logits,
        initial_cache,
        batch_size,
        max_length,
        select_token,
        start_id=start_id,
        end_id=end_id,
        pad_id=pad_id,
        max_lengths=max_lengths,
        unk_id=unk_id,
    )

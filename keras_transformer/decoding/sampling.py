"""Ancestral sampling with temperature, top-k and top-p (nucleus) filtering."""

import tensorflow as tf

from keras_transformer.decoding.greedy_search import decode_single_path
from keras_transformer.decoding import utils

# Temperatures are floored at this value so that `temperature=0` means argmax, not NaN.
_MIN_TEMPERATURE = 1e-6


def top_k_filter(logits, top_k):
    """Masks every logit below the `top_k`-th largest of its row.

    Args:
        logits: float32 `(B, V)`.
        top_k: int, the number of tokens kept per row; `0` keeps all.

    Returns:
        float32 `(B, V)` with the masked logits set to `NEG_INF` (ties with the `top_k`-th
        value are kept).
    """
    if top_k <= 0:
        return logits
    top_k = tf.minimum(top_k, tf.shape(logits)[-1])
    kth_largest = tf.math.top_k(logits, k=top_k).values[:, -1:]  # (B, 1)
    return tf.where(logits < kth_largest, utils.NEG_INF, logits)


def top_p_filter(logits, top_p):
    """Keeps the smallest set of most likely tokens whose probability reaches `top_p`.

    A token is kept when the probability of the tokens ranked strictly before it is below
    `top_p`, so the most likely token is always kept (Holtzman et al., 2020).

    Args:
        logits: float32 `(B, V)`.
        top_p: float in `(0, 1]`, the nucleus mass; `1` keeps all.

    Returns:
        float32 `(B, V)` with the tokens outside the nucleus set to `NEG_INF`.

    References:
        Holtzman et al., 2020, "The Curious Case of Neural Text Degeneration".
    """
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


def _seed_tensor(seed):
    """A `(2,)` int32 seed for the stateless RNG; a random one when `seed` is `None`."""
    if seed is None:
        return tf.random.uniform([2], maxval=tf.int32.max, dtype=tf.int32)
    if isinstance(seed, int):
        return tf.constant([seed, 0], tf.int32)
    return tf.reshape(tf.cast(seed, tf.int32), [2])


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
):
    """Samples one continuation per example, token by token, with a cached decoder step.

    At every step the logits are divided by `temperature`, then restricted to the `top_k`
    most likely tokens and to the top-p nucleus, and a token is drawn with
    `tf.random.stateless_categorical` seeded by `fold_in(seed, step)`, so a given seed
    gives the same samples eagerly, in a `tf.function` and in a SavedModel. Stopping,
    bounds and outputs are as in `greedy_search`.

    Args:
        next_logits: callable `(tokens, cache, index) -> (logits, cache)` as in
            `greedy_search`.
        initial_cache: nest of tensors with leading axis `B`.
        batch_size: int or int32 scalar tensor, `B`.
        max_length: int, the static number of steps.
        temperature: float or float32 scalar tensor, `> 0`; lower is greedier, `0`
            means argmax. Defaults to `1.0`.
        top_k: int, sample among the `top_k` most likely tokens; `0` disables.
            Defaults to `0`.
        top_p: float in `(0, 1]`, sample inside the nucleus of this mass; `1.0`
            disables. Defaults to `1.0`.
        seed: `None`, an int, or an int `(2,)` tensor for the stateless RNG. `None`
            draws a fresh seed on every call. Defaults to `None`.
        start_id: int, the START token. Defaults to `1`.
        end_id: int, the END token. Defaults to `2`.
        pad_id: int, written after END. Defaults to `0`.
        max_lengths: optional int `(B,)`, per-example bounds clipped to
            `[1, max_length]`. Defaults to `None`.

    Returns:
        A `SearchResult` as returned by `greedy_search`; `scores` sums the model's own
        log-probabilities (temperature 1, unfiltered) of the sampled tokens.

    Example:

    >>> def next_logits(tokens, cache, index):
    ...     return tf.constant([[0., 0., 5., 0.]]), cache
    >>> sample(next_logits, {}, 1, 3, top_k=1, seed=7).tokens.numpy().tolist()
    [[2, 0, 0]]
    """
    seed = _seed_tensor(seed)
    temperature = tf.maximum(tf.cast(temperature, tf.float32), _MIN_TEMPERATURE)

    def select_token(logits, unused_log_probs, step):
        logits = logits / temperature  # (B, V)
        logits = top_k_filter(logits, top_k)
        logits = top_p_filter(logits, top_p)
        step_seed = tf.random.experimental.stateless_fold_in(seed, step)
        return tf.random.stateless_categorical(
            logits, 1, seed=step_seed, dtype=tf.int32
        )[:, 0]  # (B,)

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
    )

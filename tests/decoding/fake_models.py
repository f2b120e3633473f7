"""Fake decoders for the search tests: fixed tables, no trained model.

Each model offers the cached view `next_logits(tokens, cache, index)` used by the searches,
and a NumPy view `log_probs(prefix)` (prefix = START + generated tokens) that the reference
searches of `reference.py` use. `HistoryModel` also has the uncached view
`logits_fn(prefix_tokens, encoder_state)` of `greedy_search_uncached`.
"""

import numpy as np
import tensorflow as tf

PAD_ID, START_ID, END_ID, UNK_ID = 0, 1, 2, 3

# Logit of a token a model can never produce (finite, like the searches' own masks).
IMPOSSIBLE_LOGIT = -1e9


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def _logits_from_probs(probs):
    probs = np.asarray(probs, np.float64)
    safe = np.where(probs > 0, probs, 1.0)
    return np.where(probs > 0, np.log(safe), IMPOSSIBLE_LOGIT).astype(np.float32)


class TableModel:
    """Next-token probabilities from a table keyed by (position, previous token).

    Args:
        probs: array `(P, V, V)`: `probs[p, prev]` is the distribution of the token at
            output position `p + 1` (positions past `P - 1` reuse the last table), or
            `(V, V)` for a position-free Markov chain. Zeros become impossible tokens.
        counter: optional `tf.Variable` incremented on every call of `next_logits`.
    """

    def __init__(self, probs, counter=None):
        probs = np.asarray(probs, np.float64)
        if probs.ndim == 2:
            probs = probs[None]
        self.logits = _logits_from_probs(probs)  # (P, V, V)
        self.vocab_size = probs.shape[-1]
        self.counter = counter

    def next_logits(self, tokens, cache, index):
        if self.counter is not None:
            self.counter.assign_add(1)
        position = tf.minimum(index, self.logits.shape[0] - 1)
        table = tf.gather(tf.constant(self.logits), position)  # (V, V)
        return tf.gather(table, tokens[:, 0]), cache  # (N, V)

    def log_probs(self, prefix, source=0):
        del source
        position = min(len(prefix) - 1, self.logits.shape[0] - 1)
        return _log_softmax(self.logits[position, prefix[-1]])


class HistoryModel:
    """Logits that depend on the whole prefix, read back from a fixed-size cache.

    The cache holds `keys` float32 `(N, T, 2)`: at position `j` the fed token and a
    "written" flag, updated in place by index like a self-attention key cache, and
    `source` int32 `(N,)`, a per-example input. The logits are a row of a random table
    chosen by a hash of `source` and every token fed so far, so a cache that is not threaded
    through the steps, or whose rows are not reordered with their beams, gives other logits.

    Args:
        vocab_size: int, `V`.
        max_length: int, `T`, the cache's time axis.
        seed: int, for the random table.
        num_states: int, the size of the hash space.
        end_bias: float, added to the END logit (higher gives shorter outputs).
        scale: float, the standard deviation of the random logits.
        counter: optional `tf.Variable` incremented on every call of `next_logits`.
        row_counter: optional `tf.Variable` that `next_logits_with_sentences` increases by
            the number of rows it decodes.
    """

    def __init__(
        self,
        vocab_size=7,
        max_length=8,
        seed=0,
        num_states=31,
        end_bias=0.0,
        scale=2.0,
        counter=None,
        row_counter=None,
    ):
        rng = np.random.default_rng(seed)
        table = rng.normal(size=(num_states, vocab_size)) * scale
        table[:, END_ID] += end_bias
        table[:, PAD_ID] = IMPOSSIBLE_LOGIT
        table[:, START_ID] = IMPOSSIBLE_LOGIT
        self.table = table.astype(np.float32)  # (M, V)
        self.num_states = num_states
        self.max_length = max_length
        self.weights = (3 + 7 * np.arange(max_length + 1)) % num_states  # (T + 1,)
        self.counter = counter
        self.row_counter = row_counter

    def initial_cache(self, source):
        source = tf.convert_to_tensor(source, tf.int32)  # (B,)
        batch_size = tf.shape(source)[0]
        return {
            "keys": tf.zeros([batch_size, self.max_length, 2], tf.float32),
            "source": source,
        }

    def _row(self, state):
        return tf.gather(tf.constant(self.table), state % self.num_states)

    def next_logits(self, tokens, cache, index):
        if self.counter is not None:
            self.counter.assign_add(1)
        keys = cache["keys"]  # (N, T, 2)
        entry = tf.stack(
            [tf.cast(tokens[:, 0], tf.float32), tf.ones_like(tokens[:, 0], tf.float32)],
            axis=-1,
        )  # (N, 2)
        at_index = tf.equal(tf.range(self.max_length), index)[None, :, None]  # (1, T, 1)
        keys = tf.where(at_index, entry[:, None, :], keys)  # (N, T, 2)
        weights = tf.constant(self.weights[: self.max_length], tf.float32)  # (T,)
        contributions = keys[..., 1] * (keys[..., 0] + 1.0) * weights  # (N, T)
        state = tf.cast(tf.reduce_sum(contributions, axis=1), tf.int32)  # (N,)
        state = state + 5 * cache["source"]
        return self._row(state), {"keys": keys, "source": cache["source"]}

    def next_logits_with_sentences(self, tokens, cache, index, sentences):
        """`next_logits` with the sources as a sentence cache: `sentences["source"]` has one
        row per example, the `N` rows of `tokens` and `cache["keys"]` are its adjacent beams
        (`N / B` each); `cache` holds the keys only. Counts decoded rows in `row_counter`."""
        if self.row_counter is not None:
            self.row_counter.assign_add(tf.shape(tokens)[0])
        source = sentences["source"]  # (B,)
        beams = tf.shape(tokens)[0] // tf.shape(source)[0]
        logits, cache = self.next_logits(
            tokens, {"keys": cache["keys"], "source": tf.repeat(source, beams)}, index)
        return logits, {"keys": cache["keys"]}

    def logits_fn(self, prefix, source):
        """Uncached view: `prefix` int32 `(B, t)` -> logits `(B, t, V)`."""
        length = tf.shape(prefix)[1]
        weights = tf.constant(self.weights, tf.int32)[:length]  # (t,)
        state = tf.math.cumsum((prefix + 1) * weights, axis=1)  # (B, t)
        state = state + 5 * source[:, None]
        return self._row(state)  # (B, t, V)

    def log_probs(self, prefix, source=0):
        state = sum((tok + 1) * int(self.weights[j]) for j, tok in enumerate(prefix))
        state = (state + 5 * source) % self.num_states
        return _log_softmax(self.table[state])


class NeverEndModel:
    """A model that never emits END (uniform over the other real tokens)."""

    def __init__(self, vocab_size=6):
        logits = np.zeros([vocab_size], np.float32)
        logits[[PAD_ID, START_ID, END_ID]] = IMPOSSIBLE_LOGIT
        self.row = logits

    def next_logits(self, tokens, cache, index):
        batch_size = tf.shape(tokens)[0]
        return tf.tile(tf.constant(self.row)[None], [batch_size, 1]), cache


class ReservedPreferringModel:
    """A model that prefers the reserved tokens: PAD, then START, then UNK.

    Its logits ignore the history: before step `end_step` they rank PAD > START > UNK >
    `UNK_ID + 1` > the other real tokens > END; from `end_step` on, END moves between
    START and UNK. A search that masks PAD and START therefore outputs `end_step` UNKs and
    END, and with UNK forbidden `end_step` tokens `UNK_ID + 1` and END; a search that masks
    nothing outputs PAD forever.

    Args:
        vocab_size: int, at least `UNK_ID + 3`.
        end_step: int, the first step at which END beats UNK.
    """

    def __init__(self, vocab_size=7, end_step=2):
        before = np.zeros([vocab_size], np.float32)
        before[[PAD_ID, START_ID, UNK_ID, UNK_ID + 1]] = [9.0, 8.0, 7.0, 6.0]
        before[END_ID] = -1.0
        after = before.copy()
        after[END_ID] = 7.5
        self.rows = np.stack([before, after])  # (2, V)
        self.end_step = end_step
        self.vocab_size = vocab_size

    def next_logits(self, tokens, cache, index):
        row = tf.gather(tf.constant(self.rows), tf.cast(index >= self.end_step, tf.int32))
        return tf.tile(row[None], [tf.shape(tokens)[0], 1]), cache  # (N, V)

    def logits_fn(self, prefix, unused_state):
        """Uncached view: the same logits at every position of `prefix` `(B, t)`."""
        steps = tf.range(tf.shape(prefix)[1])  # (t,)
        rows = tf.gather(tf.constant(self.rows), tf.cast(steps >= self.end_step, tf.int32))
        return tf.tile(rows[None], [tf.shape(prefix)[0], 1, 1])  # (B, t, V)

"""Plain-Python reference searches over a model's `log_probs(prefix, source)`.

Written from the algorithm's description, one hypothesis list at a time, to check the
vectorized TensorFlow searches (gather indices, cache reordering, bookkeeping).
"""

import numpy as np

from tests.decoding.fake_models import END_ID, START_ID


def penalty(length, alpha):
    return ((5.0 + length) / 6.0) ** alpha


def greedy(model, bound, source=0):
    """Returns `(tokens, log_prob)`; stops at END or after `bound` tokens."""
    prefix, total = [START_ID], 0.0
    for _ in range(bound):
        log_probs = model.log_probs(prefix, source)
        token = int(np.argmax(log_probs))
        total += log_probs[token]
        prefix.append(token)
        if token == END_ID:
            break
    return prefix[1:], total


def beam(model, bound, beam_size, alpha, source=0):
    """The beam search `beam_search` documents.

    Returns:
        `(finished, steps)`: `finished` a list of `(score, log_prob, tokens)` best first,
        `steps` the number of model calls made per hypothesis.
    """
    alive = [([START_ID], 0.0)]
    finished = []
    steps = 0
    for step in range(bound):
        steps += 1
        candidates = []
        for prefix, log_prob in alive:
            log_probs = model.log_probs(prefix, source)
            for token, token_log_prob in enumerate(log_probs):
                if token_log_prob > -1e8:
                    candidates.append((log_prob + token_log_prob, prefix + [token]))
        candidates.sort(key=lambda c: -c[0])  # stable: earlier beam, lower token first
        length = step + 1
        alive = []
        new = []
        for log_prob, prefix in candidates[:beam_size]:
            if prefix[-1] == END_ID or length >= bound:
                new.append((log_prob / penalty(length, alpha), log_prob, prefix[1:]))
            else:
                alive.append((prefix, log_prob))
        finished = sorted(finished + new, key=lambda f: -f[0])[:beam_size]
        if not alive:
            break
        best_alive = max(log_prob for _, log_prob in alive)
        largest = max(penalty(min(step + 2, bound), alpha), penalty(bound, alpha))
        if len(finished) == beam_size and finished[-1][0] >= best_alive / largest:
            break
    return finished, steps

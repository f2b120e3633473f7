"""Plain-Python reference searches over a model's `log_probs(prefix, source)`.

Written from the algorithm's description, one hypothesis list at a time, to check the
vectorized TensorFlow searches (gather indices, cache reordering, bookkeeping).
"""

import numpy as np

from tests.decoding.fake_models import END_ID, PAD_ID, START_ID


def penalty(length, alpha, form="gnmt"):
    """GNMT's length penalty, or CTranslate2's (`form="power"`); END counts in `length`."""
    return float(length) ** alpha if form == "power" else ((5.0 + length) / 6.0) ** alpha


def greedy(model, bound, source=0):
    """Returns `(tokens, log_prob)`; stops at END or after `bound` tokens."""
    prefix, total = [START_ID], 0.0
    for _ in range(bound):
        log_probs = model.log_probs(prefix, source)
        token = int(np.argmax(np.where(np.isin(np.arange(len(log_probs)), [PAD_ID, START_ID]),
                                       -np.inf, log_probs)))
        total += log_probs[token]
        prefix.append(token)
        if token == END_ID:
            break
    return prefix[1:], total


def beam(model, bound, beam_size, alpha, source=0, early_stopping=False, form="gnmt"):
    """The beam search `beam_search` documents: 2K candidates per step (1 for beam 1), the
    finished ones set aside, the K best others kept alive. With `early_stopping`, an END
    finishes only among the K best candidates (others are dropped) and the search stops
    once K hypotheses have finished. `form`: the length penalty's (`penalty`).

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
                if token_log_prob > -1e8 and token not in (PAD_ID, START_ID):
                    candidates.append((log_prob + token_log_prob, prefix + [token]))
        candidates.sort(key=lambda c: -c[0])  # stable: earlier beam, lower token first
        length = step + 1
        alive = []
        new = []
        # 2K candidates, so K stay alive however many of them finish; one for beam 1.
        num_candidates = 2 * beam_size if beam_size > 1 else 1
        for rank, (log_prob, prefix) in enumerate(candidates[:num_candidates]):
            if length >= bound or (prefix[-1] == END_ID
                                   and (rank < beam_size or not early_stopping)):
                new.append((log_prob / penalty(length, alpha, form), log_prob, prefix[1:]))
            elif prefix[-1] != END_ID and len(alive) < beam_size:
                alive.append((prefix, log_prob))
        finished = sorted(finished + new, key=lambda f: -f[0])[:beam_size]
        if not alive or (early_stopping and len(finished) == beam_size):
            break
        best_alive = max(log_prob for _, log_prob in alive)
        largest = max(penalty(min(step + 2, bound), alpha, form), penalty(bound, alpha, form))
        if len(finished) == beam_size and finished[-1][0] >= best_alive / largest:
            break
    return finished, steps


def exhaustive_best(model, bound, alpha, source=0):
    """The best hypothesis over all of them, `(score, log_prob, tokens)`, by enumeration.

    Only for models with few possible tokens per step (tokens below -1e8 are skipped).
    """
    best = (-np.inf, None, None)
    stack = [([START_ID], 0.0)]
    while stack:
        prefix, log_prob = stack.pop()
        for token, token_log_prob in enumerate(model.log_probs(prefix, source)):
            if token_log_prob <= -1e8 or token in (PAD_ID, START_ID):
                continue
            total, tokens = log_prob + token_log_prob, prefix[1:] + [token]
            if token == END_ID or len(tokens) >= bound:
                best = max(best, (total / penalty(len(tokens), alpha), total, tokens))
            else:
                stack.append((prefix + [token], total))
    return best

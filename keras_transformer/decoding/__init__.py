"""Searches over a cached decoder step: greedy, beam and sampling.

The searches see a model only through `next_logits(tokens, cache, index) -> (logits, cache)`
(see `docs/CONTRACTS.md`); they are pure TensorFlow `tf.while_loop`s with static output
shapes, so each traces once inside a `tf.function` with an unknown batch size and saves into
a SavedModel. This package imports no layers, model, training or text code.
"""

from keras_transformer.decoding.beam_search import beam_search
from keras_transformer.decoding.greedy_search import greedy_search
from keras_transformer.decoding.greedy_search import greedy_search_uncached
from keras_transformer.decoding.in_place_cache import InPlaceCache
from keras_transformer.decoding.sampling import sample
from keras_transformer.decoding.sampling import top_k_filter
from keras_transformer.decoding.sampling import top_p_filter
from keras_transformer.decoding.utils import LENGTH_PENALTY_FORMS
from keras_transformer.decoding.utils import NEG_INF
from keras_transformer.decoding.utils import SearchResult
from keras_transformer.decoding.utils import forbidden_ids
from keras_transformer.decoding.utils import gather_beams
from keras_transformer.decoding.utils import length_penalty
from keras_transformer.decoding.utils import mask_tokens
from keras_transformer.decoding.utils import tile_beams

__all__ = [
    "InPlaceCache",
    "LENGTH_PENALTY_FORMS",
    "NEG_INF",
    "SearchResult",
    "beam_search",
    "forbidden_ids",
    "gather_beams",
    "greedy_search",
    "greedy_search_uncached",
    "length_penalty",
    "mask_tokens",
    "sample",
    "tile_beams",
    "top_k_filter",
    "top_p_filter",
]

"""Data: the Multi30K TFDS builder and the translation input pipeline."""

from keras_transformer.data.multi30k import (
    ENV_VAR,
    Multi30k,
    Multi30kNotFoundError,
    find_local_multi30k,
    load_multi30k,
)
from keras_transformer.data.pipeline import (
    PaddingReport,
    compare_padding,
    default_bucket_boundaries,
    make_translation_dataset,
    padding_fraction,
)

__all__ = [
    "ENV_VAR",
    "Multi30k",
    "Multi30kNotFoundError",
    "PaddingReport",
    "compare_padding",
    "default_bucket_boundaries",
    "find_local_multi30k",
    "load_multi30k",
    "make_translation_dataset",
    "padding_fraction",
]

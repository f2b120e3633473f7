"""Data: sources of sentence pairs (files, TSV, TFDS, Multi30K), the data report, and the
translation input pipeline."""

from keras_transformer.data.multi30k import (
    ENV_VAR,
    Multi30k,
    Multi30kNotFoundError,
    find_local_multi30k,
    load_multi30k,
    multi30k_lines,
    multi30k_split_files,
)
from keras_transformer.data.pipeline import (
    PaddingReport,
    batch_plan,
    compare_padding,
    count_batches,
    default_bucket_boundaries,
    make_translation_dataset,
    padding_fraction,
)
from keras_transformer.data.preparation import (
    DataReport,
    open_run_source,
    prepare_data_report,
)
from keras_transformer.data.readers import DataError, SplitReport, count_lines
from keras_transformer.data.sources import (
    FileSource,
    Multi30kSource,
    ParallelSource,
    TfdsSource,
    TsvSource,
    open_source,
)

__all__ = [
    "DataError",
    "DataReport",
    "ENV_VAR",
    "FileSource",
    "Multi30k",
    "Multi30kNotFoundError",
    "Multi30kSource",
    "PaddingReport",
    "ParallelSource",
    "SplitReport",
    "TfdsSource",
    "TsvSource",
    "batch_plan",
    "compare_padding",
    "count_batches",
    "count_lines",
    "default_bucket_boundaries",
    "find_local_multi30k",
    "load_multi30k",
    "make_translation_dataset",
    "multi30k_lines",
    "multi30k_split_files",
    "open_run_source",
    "open_source",
    "padding_fraction",
    "prepare_data_report",
]

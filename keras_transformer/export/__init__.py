"""Export: the string-to-string `Translator` and the versioned SavedModel writer."""

from keras_transformer.export.inference import (
    ExportedTranslator,
    evaluate_export,
    evaluate_translations,
    read_lines,
    translate_by_length,
)
from keras_transformer.export.saved_model import export_translator, latest_version_dir, next_version
from keras_transformer.export.run import export_run, load_run, model_path
from keras_transformer.export.translator import SEARCHES, DecodingConfig, Translator

__all__ = [
    "DecodingConfig",
    "ExportedTranslator",
    "SEARCHES",
    "Translator",
    "evaluate_export",
    "evaluate_translations",
    "export_run",
    "export_translator",
    "load_run",
    "model_path",
    "latest_version_dir",
    "next_version",
    "read_lines",
    "translate_by_length",
]

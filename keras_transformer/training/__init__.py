"""Training: loss, metrics, learning-rate schedule, optimizer, strategy, callbacks, presets.

Nothing here imports decoding or export code when it is imported: validation BLEU gets its
translation function injected (see `BleuCallback`), by default `validation_translator`'s,
which imports the export's `Translator` when a run builds it.
"""

import importlib

# Each name's module, imported when the name is first used: `keras_transformer` imports
# the modules of the objects a saved training model holds (loss, metric, schedule,
# optimizer) so that its `.keras` files load, without pulling in the callbacks (and with
# them the data pipeline and TensorFlow Datasets).
_MODULES = {
    "BleuCallback": "callbacks",
    "make_callbacks": "callbacks",
    "MaskedSparseCategoricalCrossentropy": "losses",
    "MaskedAccuracy": "metrics",
    "make_optimizer": "optimizers",
    "PRESETS": "presets",
    "TrainingConfig": "presets",
    "get_preset": "presets",
    "parse_overrides": "presets",
    "TransformerSchedule": "schedules",
    "select_strategy": "strategy",
    "TrainingRun": "trainer",
    "train": "trainer",
    "validation_translator": "trainer",
}


def __getattr__(name):
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)


def __dir__():
    return sorted([*globals(), *_MODULES])


__all__ = sorted(_MODULES)

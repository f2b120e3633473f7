"""Training: loss, metrics, learning-rate schedule, optimizer, strategy, callbacks, presets.

Nothing here imports decoding or export code; validation BLEU gets its translation
function injected (see `BleuCallback`).
"""

from keras_transformer.training.callbacks import BleuCallback, make_callbacks
from keras_transformer.training.losses import MaskedSparseCategoricalCrossentropy
from keras_transformer.training.metrics import MaskedAccuracy
from keras_transformer.training.optimizers import make_optimizer
from keras_transformer.training.presets import (
    PRESETS, TrainingConfig, get_preset, parse_overrides,
)
from keras_transformer.training.schedules import TransformerSchedule
from keras_transformer.training.strategy import select_strategy

__all__ = [
    "BleuCallback",
    "MaskedAccuracy",
    "MaskedSparseCategoricalCrossentropy",
    "PRESETS",
    "TrainingConfig",
    "TransformerSchedule",
    "get_preset",
    "make_callbacks",
    "make_optimizer",
    "parse_overrides",
    "select_strategy",
]

"""keras_transformer: the encoder-decoder Transformer of "Attention Is All You Need" in Keras 3.

Public API: `build_transformer`, the layers in `keras_transformer.layers`, and (in their own
modules, imported on demand because they pull in tensorflow-text and tf.data) the tokenizers
(`keras_transformer.text`), data pipeline (`keras_transformer.data`), training
(`keras_transformer.training`; its losses, metrics, optimizers and schedules load with the
package, since a run's `.keras` file names them), decoding (`keras_transformer.decoding`) and
export (`keras_transformer.export`).
"""

import os

# TensorFlow's CPU allocator: a pooling (BFC) one unless the user chose (`=false` keeps the
# system allocator). TensorFlow reads this at its first op, so it works even when TensorFlow
# was imported first, as long as no op has run. With the system allocator, once any Python
# code has run inside tf.data (`Dataset.from_generator`, used by every file-reading source),
# training steps ran up to 1.8x slower here, the time going to page faults on freshly mapped
# memory (benchmarks/RESULTS.md, "CPU allocator").
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

# Before anything imports TensorFlow: the command line hides its C++ start-up lines.
from keras_transformer.cli_startup import quiet_tensorflow_startup  # noqa: E402

quiet_tensorflow_startup()

from keras_transformer import layers  # noqa: E402
from keras_transformer.layers import (
    Decoder,
    DecoderBlock,
    Encoder,
    EncoderBlock,
    FeedForward,
    MultiHeadAttention,
    PositionalEmbedding,
)
from keras_transformer.model import TransformerParts, build_transformer

# Registered for loading: a run's model.keras holds its loss, metric and optimizer (with its
# schedule). Light modules (Keras and TensorFlow only); the rest of training stays unloaded.
import importlib  # noqa: E402

for _module in ("losses", "metrics", "optimizers", "schedules"):
    importlib.import_module(f"keras_transformer.training.{_module}")
del _module, importlib

__version__ = "0.1.0"

__all__ = [
    "build_transformer",
    "TransformerParts",
    "layers",
    "MultiHeadAttention",
    "PositionalEmbedding",
    "FeedForward",
    "EncoderBlock",
    "DecoderBlock",
    "Encoder",
    "Decoder",
]

"""keras_transformer: the encoder-decoder Transformer of "Attention Is All You Need" in Keras 3.

Public API: `build_transformer`, the layers in `keras_transformer.layers`, and (in their own
modules, imported on demand because they pull in tensorflow-text and tf.data) the tokenizers
(`keras_transformer.text`), data pipeline (`keras_transformer.data`), training
(`keras_transformer.training`), decoding (`keras_transformer.decoding`) and export
(`keras_transformer.export`).
"""

# Before anything imports TensorFlow: the command line hides its C++ start-up lines.
from keras_transformer.cli_startup import quiet_tensorflow_startup

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

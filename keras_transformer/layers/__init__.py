"""Keras layers of the Transformer, bottom-up as in the paper."""

from keras_transformer.layers.masking import causal_mask, merge_masks
from keras_transformer.layers.packing import PackedRows
from keras_transformer.layers.multi_head_attention import MultiHeadAttention
from keras_transformer.layers.positional_embedding import PositionalEmbedding, sinusoidal_encoding
from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.encoder_block import EncoderBlock
from keras_transformer.layers.decoder_block import DecoderBlock
from keras_transformer.layers.encoder import Encoder
from keras_transformer.layers.decoder import Decoder

__all__ = [
    "MultiHeadAttention",
    "PositionalEmbedding",
    "sinusoidal_encoding",
    "FeedForward",
    "EncoderBlock",
    "DecoderBlock",
    "Encoder",
    "Decoder",
    "causal_mask",
    "merge_masks",
    "PackedRows",
]

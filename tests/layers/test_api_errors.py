"""Mistakes a user of the layers makes get a clear error naming the argument, not a shape
error deep in a graph nor a silently wrong result."""

import keras
import numpy as np
import pytest

from keras_transformer.layers import (
    Decoder,
    DecoderBlock,
    Encoder,
    MultiHeadAttention,
    PositionalEmbedding,
)
from keras_transformer.model import TransformerParts, build_transformer


def test_token_ids_must_be_integers():
    # keras.Input's default dtype is float32: the embedding would then compute no padding
    # mask, and every later layer would attend to the padding.
    embedding = PositionalEmbedding(100, 8)
    ids = np.zeros((2, 6))
    ids[0, :3] = [5, 6, 2]
    with pytest.raises(TypeError, match="integer token ids"):
        embedding(ids)
    with pytest.raises(TypeError, match="dtype=\"int32\""):
        embedding(keras.Input(shape=(None,)))
    assert embedding(ids.astype("int32")).shape == (2, 6, 8)
    hidden = keras.random.normal((2, 6, 8))
    assert embedding(hidden, reverse=True).shape == (2, 6, 100)  # floats are right there


def test_masks_of_the_wrong_rank_are_refused():
    attention = MultiHeadAttention(num_heads=4)
    x = keras.random.normal((4, 5, 8))  # batch == heads: a wrong mask would broadcast
    with pytest.raises(ValueError, match=r"attention_mask.*\(B, T, S\).*\(4, 5\)"):
        attention(x, x, attention_mask=np.ones((4, 5), "bool"))
    with pytest.raises(ValueError, match=r"padding_mask.*\(B, S\).*\(4, 5, 5\)"):
        attention(x, x, padding_mask=np.ones((4, 5, 5), "bool"))
    assert attention(x, x, padding_mask=np.ones((4, 5), "bool")).shape == (4, 5, 8)


def test_decoding_past_the_cache_is_refused():
    decoder = Decoder(num_layers=1, num_heads=2, ff_dim=16)
    memory = keras.random.normal((2, 5, 8))
    decoder(keras.random.normal((2, 3, 8)), memory)
    cache = decoder.initialize_cache(memory, max_length=3)
    step = keras.random.normal((2, 1, 8))
    _, cache = decoder(step, None, cache=cache, cache_index=2)  # the last position
    with pytest.raises(ValueError, match="cache_index=3.*3 positions"):
        decoder(step, None, cache=cache, cache_index=3)
    with pytest.raises(ValueError, match="cache_index=2.*3 positions"):
        decoder(keras.random.normal((2, 2, 8)), None, cache=cache, cache_index=2)


@pytest.mark.parametrize("layer", [Decoder(num_layers=1, num_heads=2, ff_dim=16),
                                   DecoderBlock(num_heads=2, ff_dim=16)],
                         ids=["Decoder", "DecoderBlock"])
def test_a_cache_before_the_layer_is_built_says_so(layer):
    with pytest.raises(ValueError, match="build"):
        layer.initialize_cache(keras.random.normal((2, 5, 8)), max_length=4)


def test_learned_positions_past_the_table_are_refused():
    embedding = PositionalEmbedding(100, 8, learned_positions=True, max_length=6)
    with pytest.raises(ValueError, match="max_length=6"):
        embedding(np.ones((2, 7), "int32"))
    with pytest.raises(ValueError, match="max_length=6"):
        embedding(np.ones((2, 2), "int32"), start_index=5)
    assert embedding(np.ones((2, 6), "int32")).shape == (2, 6, 8)
    # A NumPy integer start (from an array of offsets) is checked the same way.
    with pytest.raises(ValueError, match="max_length=6"):
        embedding(np.ones((2, 2), "int32"), start_index=np.int64(5))


def test_searches_past_a_learned_position_table_are_refused():
    # The searches' step read positions past the table: under XLA an out-of-range gather
    # is clamped (8 tokens from a model of 4 positions, silently); otherwise a Slice error
    # in the loop, only when a hypothesis got that long.
    model = build_transformer(20, d_model=16, num_heads=2, ff_dim=32, num_layers=1,
                              learned_positions=True, max_length=4)
    parts = TransformerParts(model)
    memory, memory_mask = parts.encode(np.array([[5, 6, 7]]))
    for fixed_length in (False, True):
        with pytest.raises(ValueError, match=r"max_length=8.*learned position table.*4"):
            parts.step_function(memory, memory_mask, 8, fixed_length=fixed_length)
    parts.step_function(memory, memory_mask, 4)  # within the table


@pytest.mark.parametrize("skip_padding", [False, True])
def test_stack_masks_of_the_wrong_rank_are_refused(skip_padding):
    # With skip_padding the masks went to the packing (a Reshape or Gather error) without
    # the rank check of the attention.
    x, memory = keras.random.normal((2, 4, 16)), keras.random.normal((2, 5, 16))
    encoder = Encoder(1, 2, 32, skip_padding=skip_padding)
    with pytest.raises(ValueError, match=r"`padding_mask` must be \(B, S\)"):
        encoder(x, padding_mask=np.ones((2, 1, 4), "bool"))
    decoder = Decoder(1, 2, 32, skip_padding=skip_padding)
    with pytest.raises(ValueError, match=r"`encoder_padding_mask` must be \(B, S\)"):
        decoder(x, memory, padding_mask=np.ones((2, 4), "bool"),
                encoder_padding_mask=np.ones((2, 1, 5), "bool"))
    with pytest.raises(ValueError, match=r"`padding_mask` must be \(B, S\)"):
        decoder(x, memory, padding_mask=np.ones((2, 4, 4), "bool"))
    assert decoder(x, memory, padding_mask=np.ones((2, 4), "bool")).shape == (2, 4, 16)


def test_build_transformer_takes_numpy_integers():
    ids = np.array([[5, 99, 2]])
    model = build_transformer(vocab_size=ids.max() + 1, d_model=16, num_heads=2, ff_dim=32,
                              num_layers=1)
    assert model.get_layer("embedding").vocab_size == 100

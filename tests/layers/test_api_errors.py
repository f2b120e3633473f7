"""Mistakes a user of the layers makes get a clear error naming the argument, not a shape
error deep in a graph nor a silently wrong result."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.layers import (
    Decoder,
    DecoderBlock,
    Encoder,
    EncoderBlock,
    MultiHeadAttention,
    PositionalEmbedding,
    masking,
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


@pytest.mark.parametrize("layer", [Decoder(num_layers=1, num_heads=2, ff_dim=16),
                                   DecoderBlock(num_heads=2, ff_dim=16)],
                         ids=["Decoder", "DecoderBlock"])
def test_a_cache_of_a_symbolic_memory_is_refused_with_what_to_do(layer):
    # It had failed deep in TensorFlow: "Attempt to convert a value (None) ... to a Tensor".
    memory = keras.Input((None, 8))
    layer(keras.Input((None, 8)), memory)
    with pytest.raises(ValueError, match=r"initialize_cache.*symbolic.*decoding time"):
        layer.initialize_cache(memory, max_length=4)


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


def test_learned_positions_past_the_table_in_a_graph_name_the_table():
    # Inside a `tf.function` of unknown length the check saw nothing and TensorFlow failed
    # with "Expected size[0] in [0, 6], but got 7 [[node positional_embedding/Slice]]".
    embedding = PositionalEmbedding(100, 8, learned_positions=True, max_length=6)
    embed = tf.function(lambda ids, start: embedding(ids, start_index=start),
                        input_signature=[tf.TensorSpec([None, None], tf.int32),
                                         tf.TensorSpec([], tf.int32)])
    assert embed(tf.ones((2, 6), tf.int32), tf.constant(0)).shape == (2, 6, 8)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"past the learned position "
                       r"table of positional_embedding\w*.*max_length=6"):
        embed(tf.ones((2, 7), tf.int32), tf.constant(0))
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_length=6"):
        embed(tf.ones((2, 2), tf.int32), tf.constant(5))
    # A start fixed in the graph, of a known length: refused when the function is traced.
    fixed = tf.function(lambda ids: embedding(ids, start_index=tf.constant(5)))
    with pytest.raises(ValueError, match=r"Positions 5 \.\. 6 are past.*max_length=6"):
        fixed(tf.ones((2, 2), tf.int32))


@pytest.mark.parametrize("value", [1.7, np.float32(1.0), tf.constant(1.0), True],
                         ids=["python", "numpy", "tensor", "bool"])
def test_fractional_positions_are_refused_naming_the_argument(value):
    # `cache_index=1.7` was cut to 1 by `int()`, `start_index=1.7` embedded the sinusoids
    # of a position between two.
    decoder = Decoder(num_layers=1, num_heads=2, ff_dim=16)
    embedding = PositionalEmbedding(50, 8)
    memory = keras.random.normal((2, 4, 8))
    tokens = np.array([[1, 8], [1, 9]])
    decoder(embedding(tokens), memory)
    cache = decoder.initialize_cache(memory, max_length=3)
    with pytest.raises(TypeError, match=r"`start_index` must be an integer position"):
        embedding(tokens[:, 1:], start_index=value)
    with pytest.raises(TypeError, match=r"`cache_index` must be an integer position"):
        decoder(embedding(tokens[:, :1]), None, cache=cache, cache_index=value)
    _, cache = decoder(embedding(tokens[:, :1]), None, cache=cache, cache_index=np.int64(0))


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


def test_decoding_past_the_cache_is_refused_in_a_graph_too():
    # In a tf.function the index is a tensor: the write was clamped into the last slot and
    # the step attended a half-overwritten cache, silently.
    import tensorflow as tf

    decoder = Decoder(num_layers=1, num_heads=2, ff_dim=16)
    memory = keras.random.normal((2, 5, 8))
    decoder(keras.random.normal((2, 3, 8)), memory)
    step = tf.function(lambda x, c, i: decoder(x, None, cache=c, cache_index=i))
    cache = decoder.initialize_cache(memory, max_length=3)
    x = keras.random.normal((2, 1, 8))
    for index in range(3):
        _, cache = step(x, cache, tf.constant(index))
    with pytest.raises(tf.errors.InvalidArgumentError, match="cache_index.*3 positions"):
        step(x, cache, tf.constant(3))


def test_caches_of_the_wrong_form_are_refused_naming_them():
    decoder = Decoder(num_layers=1, num_heads=4, ff_dim=32)
    x, memory = keras.random.normal((2, 1, 16)), keras.random.normal((2, 6, 16))
    decoder(x, memory)
    block = decoder.blocks[0]
    stack_cache = decoder.initialize_cache(memory, max_length=5)
    block_cache = block.initialize_cache(memory, max_length=5)
    with pytest.raises(ValueError, match=r"`cache_index` must be one integer.*\(2,\)"):
        decoder(x, None, cache=stack_cache, cache_index=np.array([0, 3]))
    with pytest.raises(ValueError, match=r"cache.*batch of 3.*2"):
        block(x, None, cache=(np.zeros((3, 2, 5, 4, 4), "float32"),) + block_cache[1:],
              cache_index=0)
    with pytest.raises(ValueError, match=r"cache.*\(B, 2, T_max, 4, 4\).*\(2, 2, 5, 2, 8\)"):
        block(x, None, cache=(np.zeros((2, 2, 5, 2, 8), "float32"),) + block_cache[1:],
              cache_index=0)
    with pytest.raises(ValueError, match=r"DecoderBlock.*Decoder\.initialize_cache"):
        decoder(x, None, cache=block_cache, cache_index=0)
    with pytest.raises(ValueError, match=r"Decoder.*DecoderBlock\.initialize_cache"):
        block(x, None, cache=stack_cache, cache_index=0)
    assert block(x, None, cache=block_cache, cache_index=0)[0].shape == (2, 1, 16)


def test_masks_of_the_wrong_size_are_refused():
    attention = MultiHeadAttention(num_heads=2)
    x = keras.random.normal((2, 5, 8))
    # A (B, 1) mask broadcast over every key: all False gave uniform attention to padding.
    with pytest.raises(ValueError, match=r"`padding_mask`.*\(2, 5\).*\(2, 1\)"):
        attention(x, x, padding_mask=np.zeros((2, 1), "bool"))
    with pytest.raises(ValueError, match=r"`padding_mask`.*\(2, 5\).*\(2, 6\)"):
        attention(x, x, padding_mask=np.ones((2, 6), "bool"))
    with pytest.raises(ValueError, match=r"`padding_mask`.*\(2, 5\).*\(3, 5\)"):
        attention(x, x, padding_mask=np.ones((3, 5), "bool"))
    with pytest.raises(ValueError, match=r"`attention_mask`.*\(2, 5, 5\).*\(2, 5, 6\)"):
        attention(x, x, attention_mask=np.ones((2, 5, 6), "bool"))
    # One query row broadcast over every query, as Keras' own layer allows.
    assert attention(x, x, attention_mask=np.ones((2, 1, 5), "bool")).shape == (2, 5, 8)
    block = DecoderBlock(num_heads=2, ff_dim=16)
    memory = keras.random.normal((2, 6, 8))
    with pytest.raises(ValueError, match=r"`encoder_padding_mask`|`padding_mask`"):
        block(x, memory, padding_mask=np.ones((2, 6), "bool"),  # the two masks swapped
              encoder_padding_mask=np.ones((2, 5), "bool"))
    # Symbolic lengths are not checked here; Keras masks (B, S) of Input(shape=(None,)) pass.
    inputs = keras.Input(shape=(None, 8))
    mask = keras.Input(shape=(None,), dtype="bool")
    assert attention(inputs, inputs, padding_mask=mask).shape[-1] == 8


def test_inputs_of_the_wrong_rank_are_refused_naming_them():
    attention = MultiHeadAttention(num_heads=2)
    x = keras.random.normal((2, 5, 8))
    with pytest.raises(ValueError, match=r"`query` must be \(B, T, d\).*\(2, 8\)"):
        attention(x[:, 0], x)
    with pytest.raises(ValueError, match=r"`value` must be \(B, S, d\).*\(2, 5, 1, 8\)"):
        attention(x, x[:, :, None])
    with pytest.raises(ValueError, match=r"`query` must be \(B, T, d\)"):
        Encoder(1, 2, 16)(x[:, 0])


def test_build_transformer_refuses_a_dropout_of_none():
    with pytest.raises(ValueError, match="dropout.*None"):
        build_transformer(100, d_model=16, num_heads=2, ff_dim=32, num_layers=1, dropout=None)


def test_a_cached_call_takes_an_attention_mask_over_the_whole_cache():
    # keras-hub's cached attention takes (B, T, T_max): it failed in an einsum here.
    block = DecoderBlock(num_heads=2, ff_dim=16)
    x, memory = keras.random.normal((2, 3, 8)), keras.random.normal((2, 4, 8))
    block(x, memory)
    cache = block.initialize_cache(memory, max_length=5)
    _, cache = block(x[:, :1], None, cache=cache, cache_index=0)
    step = x[:, 1:2]
    expected, _ = block(step, None, cache=cache, cache_index=1)
    whole = np.zeros((2, 1, 5), "bool")
    whole[:, :, :2] = True  # the written positions
    got, _ = block(step, None, cache=cache, cache_index=1, attention_mask=whole)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    hide_first = whole.copy()
    hide_first[:, :, 0] = False
    other, _ = block(step, None, cache=cache, cache_index=1, attention_mask=hide_first)
    assert np.abs(np.asarray(other) - np.asarray(expected)).max() > 1e-4


@pytest.mark.parametrize("make, name", [
    (lambda v: MultiHeadAttention(num_heads=v), "num_heads"),
    (lambda v: MultiHeadAttention(num_heads=2, key_dim=v), "key_dim"),
    (lambda v: MultiHeadAttention(num_heads=2, dropout=v), "dropout"),
    (lambda v: EncoderBlock(num_heads=v, ff_dim=32), "num_heads"),
    (lambda v: EncoderBlock(num_heads=2, ff_dim=v), "ff_dim"),
    (lambda v: EncoderBlock(num_heads=2, ff_dim=32, attention_dropout=v), "attention_dropout"),
    (lambda v: Encoder(v, 2, 32), "num_layers"),
    (lambda v: PositionalEmbedding(50, v), "d_model"),
    (lambda v: PositionalEmbedding(v, 16), "vocab_size"),
    (lambda v: PositionalEmbedding(50, 16, dropout=v), "dropout"),
])
@pytest.mark.parametrize("value", [2.5, "2", None, True, 0, -1],
                         ids=["float", "str", "none", "bool", "zero", "negative"])
def test_layer_arguments_of_the_wrong_type_are_refused_naming_them(make, name, value):
    # Floats failed deep in a Dense ("units=16.0") or a shape conversion, None and strings
    # with a TypeError naming nothing, and key_dim=0 silently meant the default.
    valid = (name.endswith("dropout") and value == 0 and not isinstance(value, bool)) or (
        name in ("attention_dropout", "key_dim") and value is None)  # None: the default
    if valid:
        make(value)
        return
    with pytest.raises(ValueError, match=f"`{name}` must be"):
        make(value)


def test_token_ids_must_be_a_batch_of_sequences():
    # The length is the last axis: (B, T, 1) ids all got position 0, 1-D ids a (T,) mask.
    embedding = PositionalEmbedding(50, 16)
    for ids in (np.array([[[5], [6], [7]]]), np.array([5, 6, 7])):
        with pytest.raises(ValueError, match=r"token ids of shape \(B, T\)"):
            embedding(ids)
    assert embedding(np.array([[5, 6, 7]])).shape == (1, 3, 16)


def test_a_sequential_without_an_input_is_told_how_to_declare_integer_ids():
    # keras.Sequential without an Input builds its input in the first layer's float dtype:
    # the error blamed a `keras.Input` the user never wrote.
    model = keras.Sequential([PositionalEmbedding(20, 8), EncoderBlock(2, 16)])
    with pytest.raises(TypeError, match=r"keras\.Sequential.*keras\.Input\(shape=\(None,\), "
                                        r"dtype=\"int32\"\)"):
        model(np.array([[5, 7, 0]], "int32"))
    model = keras.Sequential([keras.Input((None,), dtype="int32"), PositionalEmbedding(20, 8),
                              EncoderBlock(2, 16)])
    assert tuple(model(np.array([[5, 7, 0]], "int32")).shape) == (1, 3, 8)


@pytest.mark.parametrize("layer", [DecoderBlock(2, 16), Decoder(1, 2, 16)],
                         ids=["DecoderBlock", "Decoder"])
def test_a_decoder_without_memory_is_refused_when_the_model_is_built(layer):
    # Accepted symbolically (`keras.Model` built), refused only at the model's first run.
    with pytest.raises(ValueError, match="encoder_outputs"):
        layer(keras.Input((None, 8)))


def test_positional_embedding_computes_its_output_shape():
    # Wrappers (TimeDistributed) and user code call compute_output_shape: it raised
    # NotImplementedError.
    embedding = PositionalEmbedding(20, 8)
    assert embedding.compute_output_shape((None, None)) == (None, None, 8)
    assert embedding.compute_output_shape((2, 5)) == (2, 5, 8)


def test_position_checks_refuse_before_running_or_when_the_graph_runs():
    """The one helper behind the cache, table and step checks: a position known before
    running is refused with the joined message, one known only in a graph by an assertion."""
    def check(position, bound=4):
        return masking.checked_position(position, lambda p: p < bound,
                                        lambda p: ["position ", p, " is past ", bound])

    assert check(3) == 3 and int(check(np.int64(3))) == 3 and int(check(tf.constant(3))) == 3
    for position in (4, np.int32(4), tf.constant(4)):
        with pytest.raises(ValueError, match="^position 4 is past 4$"):
            check(position)

    @tf.function(input_signature=[tf.TensorSpec((), tf.int32)])
    def in_a_graph(position):
        return check(position)

    assert int(in_a_graph(tf.constant(3))) == 3
    with pytest.raises(tf.errors.InvalidArgumentError, match="position.*5.*is past.*4"):
        in_a_graph(tf.constant(5))

    @tf.function
    def fixed_in_the_graph():
        return check(tf.constant(7))

    with pytest.raises(ValueError, match="position 7 is past 4"):  # when traced
        fixed_in_the_graph()

    @tf.function(input_signature=[tf.TensorSpec((), tf.int32)])
    def bound_known_when_running(bound):
        return check(2, bound)  # the position is fixed, the bound is not

    assert int(bound_known_when_running(tf.constant(3))) == 2
    with pytest.raises(tf.errors.InvalidArgumentError, match="position.*2.*is past"):
        bound_known_when_running(tf.constant(2))


def test_learned_positions_past_the_table_are_refused_when_a_functional_model_is_built():
    # The check moved into `call`, which building a functional model does not run: the
    # model was built and failed on its first batch.
    embedding = PositionalEmbedding(10, 8, max_length=4, learned_positions=True)
    with pytest.raises(ValueError, match=r"Positions 0 \.\. 5 are past.*max_length=4"):
        embedding(keras.Input((6,), dtype="int32"))
    assert embedding(keras.Input((4,), dtype="int32")).shape == (None, 4, 8)
    assert embedding(keras.Input((None,), dtype="int32")).shape == (None, None, 8)

"""`skip_padding`: the stacks' per-token work on the real tokens only, the same model."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import build_transformer
from keras_transformer.layers import Decoder, Encoder, PackedRows, PositionalEmbedding
from keras_transformer.model import TransformerParts, with_dtype_policy
from tests.layer_checks import to_numpy

D, FF, H = 16, 32, 2
SOURCE = np.array([[4, 5, 6, 7, 0], [8, 9, 0, 0, 0], [3, 0, 0, 0, 0]], "int32")
TARGET = np.array([[1, 4, 5, 0], [1, 6, 7, 8], [1, 0, 0, 0]], "int32")
# Next-token labels: padding exactly where the decoder input is padding, as in real batches.
LABELS = np.where(TARGET != 0, np.array([[4, 5, 2, 0], [6, 7, 8, 2], [2, 0, 0, 0]]), 0)
NORMS = pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])


def _pair(layer_class, norm_first, **kwargs):
    """Two stacks with the same weights, one of them skipping the padding."""
    return [layer_class(num_layers=2, num_heads=H, ff_dim=FF, dropout=0.1,
                        norm_first=norm_first, skip_padding=skip, **kwargs)
            for skip in (False, True)]


def _record_dense_rows(block_layer, seen):
    """Records the rows of every input the feed-forward's first Dense gets."""
    dense = block_layer._feed_forward._inner_dense
    call = dense.call

    def recording(inputs, *args, **kwargs):
        seen.append(tuple(inputs.shape))
        return call(inputs, *args, **kwargs)

    dense.call = recording


@NORMS
def test_encoder_skipping_padding_equals_the_encoder_at_real_positions(norm_first):
    embedded = PositionalEmbedding(20, D)(SOURCE)
    every, skipping = _pair(Encoder, norm_first)
    expected = every(embedded)
    skipping.build(embedded.shape)
    skipping.set_weights(every.get_weights())
    seen = []
    _record_dense_rows(skipping.blocks[0], seen)
    outputs = to_numpy(skipping(embedded))
    real = SOURCE != 0
    np.testing.assert_allclose(outputs[real], to_numpy(expected)[real], rtol=1e-5, atol=1e-5)
    assert np.all(outputs[~real] == 0.0)
    # The feed-forward layer saw the 7 real tokens, not the 15 positions.
    assert seen == [(int(real.sum()), D)]
    # The Keras mask still travels with the output.
    np.testing.assert_array_equal(to_numpy(skipping(embedded)._keras_mask), real)
    # Training: dropout acts on the packed rows (other values), the padding stays zero.
    trained = to_numpy(skipping(embedded, training=True))
    assert not np.allclose(trained[real], outputs[real]) and np.all(trained[~real] == 0.0)


@NORMS
def test_decoder_skipping_padding_equals_the_decoder_at_real_positions(norm_first):
    memory = keras.random.normal((3, 5, D), seed=1)
    source_mask = SOURCE != 0
    target = PositionalEmbedding(20, D)(TARGET)
    every, skipping = _pair(Decoder, norm_first)
    expected = every(target, memory, encoder_padding_mask=source_mask)
    skipping.build(target.shape, memory.shape)
    skipping.set_weights(every.get_weights())
    outputs = to_numpy(skipping(target, memory, encoder_padding_mask=source_mask))
    real = TARGET != 0
    np.testing.assert_allclose(outputs[real], to_numpy(expected)[real], rtol=1e-5, atol=1e-5)
    assert np.all(outputs[~real] == 0.0)
    # Without a memory mask every memory position is real.
    np.testing.assert_allclose(
        to_numpy(skipping(target, memory))[real], to_numpy(every(target, memory))[real],
        rtol=1e-5, atol=1e-5)
    # Scores and caches take the path over every position, with the same results.
    hidden, scores = skipping(target, memory, encoder_padding_mask=source_mask,
                              return_attention_scores=True)
    np.testing.assert_allclose(to_numpy(hidden)[real], outputs[real], rtol=1e-5, atol=1e-5)
    assert len(scores) == 2
    step = target[:, :1]
    cached = [layer(step, None, cache=layer.initialize_cache(memory, 4, source_mask),
                    cache_index=0)[0] for layer in (every, skipping)]
    np.testing.assert_allclose(to_numpy(cached[1]), to_numpy(cached[0]), rtol=1e-5, atol=1e-5)


def _model_pair(**kwargs):
    settings = dict(vocab_size=30, d_model=D, num_heads=H, ff_dim=FF, num_layers=2,
                    dropout=0.0, **kwargs)
    every = build_transformer(**settings)
    skipping = build_transformer(skip_padding=True, **settings)
    skipping.set_weights(every.get_weights())
    return every, skipping


def _loss_and_gradients(model):
    inputs = {"encoder_tokens": SOURCE, "decoder_tokens": TARGET}
    labels = LABELS
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0)
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(inputs, training=True))
    return float(loss), tape.gradient(loss, model.trainable_variables)


@NORMS
def test_a_model_skipping_padding_learns_as_the_model_does(norm_first):
    every, skipping = _model_pair(norm_first=norm_first)
    loss, gradients = _loss_and_gradients(every)
    skipping_loss, skipping_gradients = _loss_and_gradients(skipping)
    assert skipping_loss == pytest.approx(loss, rel=1e-5)
    for gradient, skipping_gradient in zip(gradients, skipping_gradients):
        np.testing.assert_allclose(to_numpy(tf.convert_to_tensor(skipping_gradient)),
                                   to_numpy(tf.convert_to_tensor(gradient)),
                                   rtol=1e-4, atol=1e-6)


def test_a_tied_model_skipping_padding_projects_the_real_positions_only():
    every, skipping = _model_pair()
    inputs = {"encoder_tokens": SOURCE, "decoder_tokens": TARGET}
    real = TARGET != 0
    logits = to_numpy(skipping(inputs))
    np.testing.assert_allclose(logits[real], to_numpy(every(inputs))[real], rtol=1e-5,
                               atol=1e-5)
    assert np.all(logits[~real] == 0.0)
    # Untied, the Dense projection computes every position; the stacks still skip.
    untied_every, untied = _model_pair(tie_embeddings=False)
    np.testing.assert_allclose(to_numpy(untied(inputs))[real],
                               to_numpy(untied_every(inputs))[real], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="reverse=True"):
        PositionalEmbedding(20, D)(SOURCE, padding_mask=SOURCE != 0)


def test_skipping_padding_under_bfloat16_and_after_saving(tmp_path):
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        every, skipping = _model_pair()
        inputs = {"encoder_tokens": SOURCE, "decoder_tokens": TARGET}
        real = TARGET != 0
        np.testing.assert_allclose(to_numpy(skipping(inputs))[real], to_numpy(every(inputs))[real],
                                   rtol=0.05, atol=0.05)
        skipping.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, ignore_class=0))
        skipping.train_on_batch(inputs, LABELS)
    finally:
        keras.config.set_dtype_policy(previous)
    path = tmp_path / "model.keras"
    skipping.save(path)
    loaded = keras.saving.load_model(path, compile=False)
    assert loaded.get_layer("encoder").skip_padding and loaded.get_layer("decoder").skip_padding
    np.testing.assert_array_equal(to_numpy(loaded(inputs)), to_numpy(skipping(inputs)))
    # As `load_run` decodes it: the same model in float32 (every layer is a layer).
    float32 = with_dtype_policy(loaded, "float32")
    assert float32.get_layer("decoder").skip_padding
    np.testing.assert_allclose(to_numpy(float32(inputs))[real], to_numpy(loaded(inputs))[real],
                               rtol=0.05, atol=0.05)


def test_skipping_padding_stays_out_of_xla():
    # Its shapes depend on the data: Keras compiles the model without XLA (with a warning
    # when asked for it), and the decoding code's XLA path encodes every position.
    every, skipping = _model_pair()
    assert not every.get_layer("encoder").skip_padding
    with pytest.warns(UserWarning, match="jit_compile"):
        skipping.compile(optimizer="adam", loss="mse", jit_compile=True)
    assert not skipping.jit_compile
    parts = TransformerParts(skipping)
    memory, mask = tf.function(parts.encode, jit_compile=True)(tf.constant(SOURCE))
    expected, _ = TransformerParts(every).encode(tf.constant(SOURCE))
    real = to_numpy(mask)
    np.testing.assert_allclose(to_numpy(memory)[real], to_numpy(expected)[real], rtol=1e-5,
                               atol=1e-5)
    # Every position computed (the packed path leaves zeros at the padding).
    assert np.all(np.any(to_numpy(memory)[~real] != 0.0, axis=-1))
    logits = tf.function(parts.full_logits, jit_compile=True)(tf.constant(TARGET), memory,
                                                              mask)
    assert np.all(np.any(to_numpy(logits)[TARGET == 0] != 0.0, axis=-1))


def test_packed_rows_of_an_all_padding_batch_row():
    layout = PackedRows(np.array([[0, 0], [1, 0]]))
    rows = layout.pack(np.arange(4, dtype="float32").reshape(2, 2, 1))
    assert to_numpy(rows).ravel().tolist() == [2.0]
    assert to_numpy(layout.unpack(rows))[..., 0].tolist() == [[0.0, 0.0], [2.0, 0.0]]

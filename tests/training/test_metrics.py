"""MaskedAccuracy: ignores padding, accumulates token counts, serializes."""

import keras
import numpy as np
import pytest

from keras_transformer.training.metrics import MaskedAccuracy


def _one_hot_logits(predicted_ids, vocab_size=5):
    return np.eye(vocab_size, dtype="float32")[np.array(predicted_ids)]


def test_ignores_padding_positions():
    labels = np.array([[1, 2, 0, 0], [3, 4, 4, 0]])
    # Wrong predictions at every padding position, 4 of 5 real tokens right.
    logits = _one_hot_logits([[1, 2, 3, 3], [3, 4, 1, 2]])
    metric = MaskedAccuracy()
    metric.update_state(labels, logits)
    np.testing.assert_allclose(float(metric.result()), 4 / 5)


def test_accumulates_tokens_not_batch_means():
    metric = MaskedAccuracy()
    metric.update_state(np.array([[1, 0, 0, 0]]), _one_hot_logits([[1, 0, 0, 0]]))  # 1/1
    metric.update_state(np.array([[1, 2, 3, 4]]), _one_hot_logits([[0, 0, 0, 0]]))  # 0/4
    np.testing.assert_allclose(float(metric.result()), 1 / 5)
    metric.reset_state()
    assert float(metric.result()) == 0.0


def test_serialization_round_trip():
    metric = MaskedAccuracy(pad_id=1, name="acc")
    restored = keras.metrics.deserialize(keras.metrics.serialize(metric))
    assert isinstance(restored, MaskedAccuracy)
    assert restored.get_config() == metric.get_config()


def test_reads_the_logits_once():
    # The logits are the largest tensor of a training step, (B, T, V): the metric takes
    # their argmax in one pass (Keras' `ops.argmax` adds half a dozen passes over a float
    # input to order -0.0 below 0.0, which an accuracy does not need).
    import tensorflow as tf

    metric = MaskedAccuracy()
    logits_spec = tf.TensorSpec((2, 3, 7), tf.bfloat16)

    @tf.function
    def update(labels, logits):
        metric.update_state(labels, logits)

    graph = update.get_concrete_function(tf.TensorSpec((2, 3), tf.int32), logits_spec).graph
    logits = graph.inputs[1]
    readers = [op.type for op in graph.get_operations()
               if logits.name in [tensor.name for tensor in op.inputs]]
    assert readers == ["ArgMax"]


def test_bfloat16_logits_give_the_float32_result():
    labels = np.array([[1, 2, 3, 0]])
    logits = _one_hot_logits([[1, 2, 4, 3]]) * 3.0
    results = []
    for dtype in ("float32", "bfloat16"):
        metric = MaskedAccuracy()
        metric.update_state(labels, keras.ops.cast(logits, dtype))
        results.append(float(metric.result()))
    np.testing.assert_allclose(results, [2 / 3, 2 / 3], rtol=1e-6)


def test_pad_id_none_counts_every_token_as_the_loss_does():
    # The loss takes `pad_id=None` (no padding); the metric failed at the first batch.
    metric = MaskedAccuracy(pad_id=None)
    logits = np.eye(4, dtype="float32")[[[1, 2, 3]]]  # predicts 1, 2, 3
    metric.update_state(np.array([[1, 3, 0]]), logits)
    assert float(metric.result()) == pytest.approx(1 / 3)
    assert MaskedAccuracy.from_config(metric.get_config()).pad_id is None


def test_per_timestep_sample_weights_of_shape_b_t_1_weigh_tokens():
    metric = MaskedAccuracy()
    logits = np.eye(4, dtype="float32")[[[1, 2, 3]]]
    metric.update_state(np.array([[1, 3, 3]]), logits, sample_weight=np.array([[[1], [0], [0]]]))
    assert float(metric.count) == 1.0 and float(metric.result()) == 1.0

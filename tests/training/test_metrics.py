"""MaskedAccuracy: ignores padding, accumulates token counts, serializes."""

import keras
import numpy as np

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

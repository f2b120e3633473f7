"""Token accuracy that ignores padding, summed exactly across replicas."""

import keras
import tensorflow as tf
from keras import ops

from keras_transformer.training.losses import (
    check_pad_id, global_sum, token_sample_weight)


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedAccuracy(keras.metrics.Metric):
    """Fraction of non-padding target tokens whose arg-max prediction is correct.

    Keeps two counters, correct tokens and real tokens, so the result is a token mean over
    everything seen since the last reset (not a mean of batch means). Positions whose label
    is `pad_id` are ignored entirely.

    Distribution: the counters are Keras metric variables, synchronized on read with
    `SUM` aggregation, so the value read at the end of an epoch (cross-replica context)
    covers all replicas. `result()` called inside a replica (the per-batch value `fit`
    logs) all-reduces the two counters first, so it is the global token accuracy too,
    rather than a mean of per-replica accuracies.

    Args:
        pad_id: int or `None`, the label id of padding (`None`: every token counts).
            Defaults to `0`.
        name: string, the metric name. Defaults to `"masked_accuracy"`.
        dtype: the dtype of the counters. Defaults to `"float32"`.

    Call arguments (`update_state`):
        y_true: int tensor `(B, T)`, target ids.
        y_pred: float tensor `(B, T, V)`, logits or probabilities.
        sample_weight: optional float tensor `(B,)`, `(B, T)` or `(B, T, 1)` weighting
            tokens.

    Returns:
        `result()`: a float scalar in `[0, 1]` (0 when no real token was seen).

    Example:

    >>> metric = MaskedAccuracy()
    >>> logits = np.eye(4, dtype="float32")[[[1, 2, 3]]]  # predicts 1, 2, 3
    >>> metric.update_state(np.array([[1, 3, 0]]), logits)
    >>> float(metric.result())
    0.5
    """

    def __init__(self, pad_id=0, name="masked_accuracy", dtype="float32"):
        super().__init__(name=name, dtype=dtype)
        check_pad_id(pad_id)
        self.pad_id = pad_id
        self.correct = self.add_variable(
            shape=(), initializer="zeros", dtype=self.dtype, name="correct"
        )
        self.count = self.add_variable(
            shape=(), initializer="zeros", dtype=self.dtype, name="count"
        )

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.cast(ops.convert_to_tensor(y_true), "int32")
        if len(y_true.shape) == len(y_pred.shape):
            y_true = ops.squeeze(y_true, axis=-1)  # (B, T, 1) -> (B, T)
        # One pass over the (B, T, V) logits, in their own dtype: Keras' `ops.argmax` casts
        # a float input to float32 and adds half a dozen passes to order -0.0 below 0.0,
        # which an accuracy does not need.
        predictions = tf.argmax(y_pred, axis=-1, output_type=tf.int32)  # (B, T)
        if self.pad_id is None:
            weights = ops.ones_like(y_true, dtype=self.dtype)
        else:
            weights = ops.cast(ops.not_equal(y_true, self.pad_id), self.dtype)
        if sample_weight is not None:
            weights = weights * token_sample_weight(sample_weight, self.dtype)
        hits = ops.cast(ops.equal(predictions, y_true), self.dtype) * weights
        self.correct.assign_add(ops.sum(hits))
        self.count.assign_add(ops.sum(weights))

    def result(self):
        correct = global_sum(ops.convert_to_tensor(self.correct))
        count = global_sum(ops.convert_to_tensor(self.count))
        return ops.divide_no_nan(correct, count)

    def reset_state(self):
        self.correct.assign(0.0)
        self.count.assign(0.0)

    def get_config(self):
        return {"name": self.name, "dtype": self.dtype, "pad_id": self.pad_id}

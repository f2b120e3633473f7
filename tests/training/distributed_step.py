"""Child script of `test_distribution.py`: one step, default vs. Mirrored strategy.

Splits the CPU into two logical devices (this must happen before TensorFlow initializes,
hence a separate process), trains the stand-in model for one step on the same global
batch under the default strategy and under `MirroredStrategy(["/cpu:0", "/cpu:1"])`, and
prints a JSON line with the reported losses, accuracies and final weights. The two halves
of the batch hold very different numbers of real tokens, so a mean of per-replica means
differs from the global token mean; a deliberately naive loss shows that difference.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration()] * 2
)

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras.src.losses.loss import scale_loss_for_distribution  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
from keras_transformer.training.losses import (  # noqa: E402
    MaskedSparseCategoricalCrossentropy,
)
from keras_transformer.training.metrics import MaskedAccuracy  # noqa: E402
from keras_transformer.training.optimizers import FusedAdam  # noqa: E402
from keras_transformer import build_transformer  # noqa: E402
from tests.training.stand_in import build_stand_in_model  # noqa: E402

VOCAB_SIZE = 11


class NaiveMeanOfMeans(MaskedSparseCategoricalCrossentropy):
    """What a per-replica token mean gives: each replica divides by its own count."""

    def __call__(self, y_true, y_pred, sample_weight=None):
        losses = self.call(y_true, y_pred)
        count = tf.reduce_sum(tf.cast(tf.not_equal(y_true, 0), "float32"))
        return scale_loss_for_distribution(tf.math.divide_no_nan(tf.reduce_sum(losses), count))


def global_batch():
    """4 rows: replica 0 gets rows 0-1 (full), replica 1 rows 2-3 (mostly padding)."""
    rng = np.random.default_rng(0)
    encoder = rng.integers(1, VOCAB_SIZE, size=(4, 5)).astype("int32")
    decoder = rng.integers(1, VOCAB_SIZE, size=(4, 7)).astype("int32")
    labels = rng.integers(1, VOCAB_SIZE, size=(4, 7)).astype("int32")
    encoder[2:, 2:] = 0
    decoder[2, 1:] = 0
    decoder[3, 2:] = 0
    labels[2, 1:] = 0
    labels[3, 2:] = 0  # real tokens: 14 on replica 0, 3 on replica 1
    x = {"encoder_tokens": encoder, "decoder_tokens": decoder}
    return tf.data.Dataset.from_tensors((x, labels))


def build_model(kind):
    """The stand-in, or the real Transformer (tiny, dropout 0, same seed -> same weights)."""
    if kind == "transformer":
        keras.utils.set_random_seed(3)
        return build_transformer(vocab_size=VOCAB_SIZE, d_model=16, num_heads=2, ff_dim=32,
                                 num_layers=1, dropout=0.0)
    return build_stand_in_model(VOCAB_SIZE, seed=3)


def replicas_agree(model):
    """Whether every variable holds the same value on every replica (True without any)."""
    for variable in model.variables:
        values = getattr(variable.value, "values", None) or ()
        if any(not np.array_equal(values[0].numpy(), other.numpy()) for other in values[1:]):
            return False
    return True


def make_optimizer(name):
    """SGD, whose update is the gradient itself, or the package's `FusedAdam` (its fused
    kernel updating each replica's copy of a variable inside `Strategy.update`)."""
    if name == "fused_adam":
        # Adam divides each gradient by its own size: gradients that are 0 in exact
        # arithmetic (the attention keys' biases) but rounding noise in float32 would move
        # their weights by up to the learning rate, differently in each strategy. An
        # epsilon far above that noise keeps them still.
        return FusedAdam(learning_rate=0.01, epsilon=1e-3)
    return keras.optimizers.SGD(learning_rate=1.0)


def run(strategy, loss, kind, optimizer="sgd"):
    with strategy.scope():
        model = build_model(kind)
        model.compile(
            optimizer=make_optimizer(optimizer),
            loss=loss,
            metrics=[MaskedAccuracy()],
        )
    batch_logs = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: batch_logs.append(dict(logs))
    )
    history = model.fit(global_batch(), epochs=1, verbose=0, callbacks=[record])
    return {
        "replicas_agree": replicas_agree(model),
        "loss": history.history["loss"][0],
        "accuracy": history.history["masked_accuracy"][0],
        "batch_loss": float(batch_logs[0]["loss"]),
        "batch_accuracy": float(batch_logs[0]["masked_accuracy"]),
        "weights": [w.tolist() for w in model.get_weights()],
    }


def main():
    kind = sys.argv[1] if len(sys.argv) > 1 else "stand_in"
    optimizer = sys.argv[2] if len(sys.argv) > 2 else "sgd"
    keras.utils.set_random_seed(0)
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert mirrored.num_replicas_in_sync == 2
    loss = MaskedSparseCategoricalCrossentropy
    results = {
        "default": run(tf.distribute.get_strategy(), loss(), kind, optimizer),
        "mirrored": run(mirrored, loss(), kind, optimizer),
        "optimizer": optimizer,
    }
    if optimizer == "sgd":  # SGD's update shows a wrongly scaled gradient one to one
        results["naive_mirrored"] = run(mirrored, NaiveMeanOfMeans(), kind, optimizer)
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()

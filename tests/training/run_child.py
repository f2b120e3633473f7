"""Child script of the run-life tests: one `train` call of the real model, that can die.

Usage: `python run_child.py OUTPUT_DIR RESULT_NPZ --tfds-dir DIR [--epochs N]
[--kill-after-epoch E] [--kill-at-batch B] [--time-budget MINUTES]`.

Trains the tiny preset (on a small training subset, full shuffled epochs) through
`keras_transformer.training.trainer.train`, the code path of `keras-transformer train`.
With `--kill-after-epoch E` the process SIGKILLs itself once epoch E (1-based) is backed
up, or, with `--kill-at-batch B` as well, after batch B of epoch E + 1 (mid-epoch), like
a preempted job. At the end it writes the weights, every optimizer variable and the
epochs this process ran to RESULT_NPZ.
"""

import argparse
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_transformer.training import get_preset  # noqa: E402
from keras_transformer.training.trainer import train  # noqa: E402

# Training pairs of the tiny runs: 20 batches of 8 per epoch, a second or two on CPU.
TRAIN_SUBSET = 160


class Killer(keras.callbacks.Callback):
    """SIGKILLs this process after epoch `epoch` or at batch `batch` of the next one."""

    def __init__(self, epoch, batch=None):
        super().__init__()
        self.epoch, self.batch = epoch, batch

    def _die(self):
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def on_epoch_end(self, epoch, logs=None):
        if self.batch is None and epoch + 1 == self.epoch:
            self._die()

    def on_train_batch_end(self, batch, logs=None):
        if self.batch is not None and self._epoch == self.epoch and batch + 1 == self.batch:
            self._die()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("result")
    parser.add_argument("--tfds-dir", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--kill-after-epoch", type=int)
    parser.add_argument("--kill-at-batch", type=int)
    parser.add_argument("--time-budget", type=float, help="time_budget_minutes")
    args = parser.parse_args()

    config = get_preset("tiny").replace(
        epochs=args.epochs, steps_per_epoch=None, train_subset=TRAIN_SUBSET, bleu_sentences=0,
        time_budget_minutes=args.time_budget,
    )
    epochs_run = []
    callbacks = [keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: epochs_run.append(epoch))]
    if args.kill_after_epoch:
        callbacks.append(Killer(args.kill_after_epoch, args.kill_at_batch))
    run = train(config, args.output_dir, data_dir=args.tfds_dir, strategy="default",
                report_padding=False, verbose=0, callbacks=callbacks)
    optimizer = getattr(run.model, "optimizer", None)
    np.savez(
        args.result,
        epochs_run=np.array(epochs_run, dtype="int64"),
        **{f"weight_{i}": w for i, w in enumerate(run.model.get_weights())},
        **({f"optimizer_{i}": v.numpy() for i, v in enumerate(optimizer.variables)}
           if optimizer is not None else {}),
    )


if __name__ == "__main__":
    main()

"""Child script of the run-life tests: one `train` call of the real model, that can die.

Usage: `python run_child.py OUTPUT_DIR RESULT_NPZ --tfds-dir DIR [--epochs N]
[--kill-after-epoch E] [--kill-at-batch B] [--time-budget MINUTES]
[--die-writing backup:E | final]`.

Trains the tiny preset (on a small training subset, full shuffled epochs) through
`keras_transformer.training.trainer.train`, the code path of `keras-transformer train`.
With `--kill-after-epoch E` the process SIGKILLs itself once epoch E (1-based) is backed
up, or, with `--kill-at-batch B` as well, after batch B of epoch E + 1 (mid-epoch), like
a preempted job. With `--die-writing backup:E` it SIGKILLs itself halfway through writing
the backup of epoch E (the file it writes holds garbage), with `--die-writing final`
halfway through writing the final `model.keras`. At the end it writes the weights, every
optimizer variable and the epochs this process ran to RESULT_NPZ.
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


def die_writing(what):
    """Patches Keras' savers to SIGKILL this process in the middle of writing `what`."""
    kind, _, epoch = what.partition(":")
    saves = {"count": 0}

    def half_written(path):
        with open(path, "wb") as f:
            f.write(b"\x89HDF half a file")
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    save_weights, save = keras.Model.save_weights, keras.Model.save

    def patched_save_weights(self, filepath, *args, **kwargs):
        if kind == "backup" and os.sep + "backup" + os.sep in os.fspath(filepath):
            saves["count"] += 1
            if saves["count"] == int(epoch):
                half_written(filepath)
        return save_weights(self, filepath, *args, **kwargs)

    def patched_save(self, filepath, *args, **kwargs):
        path = os.fspath(filepath)
        if kind == "final" and os.sep + "checkpoints" + os.sep not in path and (
                path.endswith("model.keras")):
            half_written(filepath)
        return save(self, filepath, *args, **kwargs)

    keras.Model.save_weights, keras.Model.save = patched_save_weights, patched_save


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("result")
    parser.add_argument("--tfds-dir", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--kill-after-epoch", type=int)
    parser.add_argument("--kill-at-batch", type=int)
    parser.add_argument("--time-budget", type=float, help="time_budget_minutes")
    parser.add_argument("--die-writing", help="backup:E or final")
    parser.add_argument("--keep-checkpoints", type=int, default=0)
    args = parser.parse_args()
    if args.die_writing:
        die_writing(args.die_writing)

    config = get_preset("tiny").replace(
        epochs=args.epochs, steps_per_epoch=None, train_subset=TRAIN_SUBSET, bleu_sentences=0,
        time_budget_minutes=args.time_budget,
        dropout=0.1,  # as the real presets: resuming must replay dropout's random draws too
        keep_checkpoints=args.keep_checkpoints,
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

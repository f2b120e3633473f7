"""Child script of `test_backup_and_restore.py`: a deterministic 4-epoch `fit` that can die.

Usage: `python resumable_fit.py OUTPUT_DIR RESULT_NPZ [--kill-after-epoch N]`.

Trains the stand-in model (dropout 0, fixed data, no shuffling, fixed seed) with the
paper's Adam + schedule and the run's `BackupAndRestore` callback. With
`--kill-after-epoch N` the process SIGKILLs itself once epoch N has been backed up,
like a preempted job. At the end it writes the model weights and every optimizer
variable (iterations, Adam moments) to RESULT_NPZ, with the epochs this process ran.
"""

import argparse
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
from keras_transformer.training.callbacks import make_callbacks  # noqa: E402
from keras_transformer.training.losses import (  # noqa: E402
    MaskedSparseCategoricalCrossentropy,
)
from keras_transformer.training.optimizers import make_optimizer  # noqa: E402
from tests.training.stand_in import build_stand_in_model  # noqa: E402

EPOCHS = 4
VOCAB_SIZE = 11


class KillAfterEpoch(keras.callbacks.Callback):
    """SIGKILLs this process at the end of epoch `epoch` (1-based): no cleanup at all."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.epoch:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("result")
    parser.add_argument("--kill-after-epoch", type=int)
    args = parser.parse_args()

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = {
        "encoder_tokens": rng.integers(0, VOCAB_SIZE, (32, 5)).astype("int32"),
        "decoder_tokens": rng.integers(0, VOCAB_SIZE, (32, 6)).astype("int32"),
    }
    y = rng.integers(0, VOCAB_SIZE, (32, 6)).astype("int32")

    model = build_stand_in_model(VOCAB_SIZE, dropout=0.0)
    model.compile(
        optimizer=make_optimizer(d_model=8, warmup_steps=5),
        loss=MaskedSparseCategoricalCrossentropy(),
    )
    # The run's callbacks, BackupAndRestore last; the killer comes after it, so the
    # backup of the epoch it kills at is complete.
    callbacks = make_callbacks(args.output_dir, tensorboard=False)
    epochs_run = []
    callbacks.append(
        keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: epochs_run.append(epoch))
    )
    if args.kill_after_epoch:
        callbacks.append(KillAfterEpoch(args.kill_after_epoch))
    model.fit(x, y, batch_size=8, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=callbacks)

    np.savez(
        args.result,
        epochs_run=np.array(epochs_run),
        iterations=int(model.optimizer.iterations.numpy()),
        **{f"weight_{i}": w for i, w in enumerate(model.get_weights())},
        **{
            f"optimizer_{i}": v.numpy()
            for i, v in enumerate(model.optimizer.variables)
        },
    )


if __name__ == "__main__":
    main()

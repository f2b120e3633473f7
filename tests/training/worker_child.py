"""Child script of the multi-worker tests: `keras-transformer ...` that can die mid-epoch.

Usage: `python worker_child.py [--kill-at EPOCH:BATCH] [--slow-epoch EPOCH:SECONDS]
[--die-saving-final] [--stop-after-epoch E] -- CLI ARGS...`.

Runs the command line (`keras_transformer.cli.main`) unchanged, except that with
`--kill-at E:B` the process SIGKILLs itself after batch B (1-based) of epoch E (1-based),
like a preempted machine: no cleanup, no exception, no backup of the epoch; with
`--slow-epoch E:S` epoch E (1-based) ends S seconds later, as this worker's clock sees it
(a sleep just before the run's `RunHistory` times the epoch), like a slower machine; with
`--die-saving-final` it SIGKILLs itself as it starts writing the run's final `model.keras`
(a preemption at the very end); with `--stop-after-epoch E` a callback of this worker
alone stops training after epoch E (1-based), as an `EarlyStopping` on the chief's
validation BLEU (logged by the chief only) would.
"""

import argparse
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras  # noqa: E402

from keras_transformer import cli  # noqa: E402
from keras_transformer.training import trainer  # noqa: E402


class KillAt(keras.callbacks.Callback):
    """SIGKILLs this process after batch `batch` of epoch `epoch` (both 1-based)."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.epoch, self.batch, self._epoch = epoch, batch, None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch + 1

    def on_train_batch_end(self, batch, logs=None):
        if (self._epoch, batch + 1) == (self.epoch, self.batch):
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def slow_epoch_history(epoch, seconds):
    """The trainer's `RunHistory`, with epoch `epoch` (1-based) `seconds` longer."""

    class SlowEpoch(trainer.RunHistory):
        def on_epoch_end(self, index, logs=None):
            if index + 1 == epoch:
                time.sleep(seconds)
            super().on_epoch_end(index, logs)

    return SlowEpoch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill-at")
    parser.add_argument("--slow-epoch")
    parser.add_argument("--die-saving-final", action="store_true")
    parser.add_argument("--stop-after-epoch", type=int)
    parser.add_argument("cli_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    cli_args = args.cli_args[1:] if args.cli_args[:1] == ["--"] else args.cli_args
    extra = []
    if args.kill_at:
        epoch, batch = (int(v) for v in args.kill_at.split(":"))
        extra.append(KillAt(epoch, batch))
    if args.slow_epoch:
        epoch, seconds = args.slow_epoch.split(":")
        trainer.RunHistory = slow_epoch_history(int(epoch), float(seconds))
    if args.stop_after_epoch:
        stop_after = args.stop_after_epoch

        class StopHere(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                if epoch + 1 == stop_after:
                    self.model.stop_training = True

        extra.append(StopHere())
    if args.die_saving_final:
        save = keras.Model.save

        def die_saving(self, filepath, *positional, **keywords):
            if os.fspath(filepath).endswith("model.keras") and (
                    os.sep + "checkpoints" + os.sep not in os.fspath(filepath)):
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            return save(self, filepath, *positional, **keywords)

        keras.Model.save = die_saving
    if extra:
        original = trainer.train

        def train_with_extra(*positional, **keywords):
            keywords["callbacks"] = [*(keywords.get("callbacks") or []), *extra]
            return original(*positional, **keywords)

        trainer.train = train_with_extra
    return cli.main(cli_args)


if __name__ == "__main__":
    sys.exit(main())

"""Child script of the multi-worker tests: `keras-transformer ...` that can die mid-epoch.

Usage: `python worker_child.py [--kill-at EPOCH:BATCH] -- CLI ARGS...`.

Runs the command line (`keras_transformer.cli.main`) unchanged, except that with
`--kill-at E:B` the process SIGKILLs itself after batch B (1-based) of epoch E (1-based),
like a preempted machine: no cleanup, no exception, no backup of the epoch.
"""

import argparse
import os
import signal
import sys

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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill-at")
    parser.add_argument("cli_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    cli_args = args.cli_args[1:] if args.cli_args[:1] == ["--"] else args.cli_args
    if args.kill_at:
        epoch, batch = (int(v) for v in args.kill_at.split(":"))
        original = trainer.train

        def train_then_die(*positional, **keywords):
            keywords["callbacks"] = [*(keywords.get("callbacks") or []), KillAt(epoch, batch)]
            return original(*positional, **keywords)

        trainer.train = train_then_die
    return cli.main(cli_args)


if __name__ == "__main__":
    sys.exit(main())

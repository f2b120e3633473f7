"""The files of a run's `checkpoints/` directory that training writes and export reads.

A module without TensorFlow or Keras, so that reading a run directory (`export`,
`evaluate`) loads nothing of training's:
- `epoch-NNN.weights.npz`, the weights after epoch NNN (`EpochCheckpoints`, with
  `keep_checkpoints`);
- `averaged.keras`, their mean (`keras-transformer average`), and `averaged.keras.json`, the
  record of the epoch checkpoints it averages (epoch, file name and BLAKE2b digest of each),
  from which `check_average_is_current` tells an average of the run's last epochs from one
  the run has trained past.
"""

import glob
import json
import os
import re

from keras_transformer.textfiles import file_digest

# `EpochCheckpoints` file names: `epoch-007.weights.npz` holds the weights after epoch 7.
EPOCH_CHECKPOINT_PATTERN = "epoch-{epoch:03d}.weights.npz"
EPOCH_CHECKPOINT_RE = re.compile(r"epoch-(\d+)\.weights\.npz$")
# The averaged model of a run directory, next to its other checkpoints.
AVERAGED_NAME = "averaged.keras"


def numbered_epoch_checkpoints(directory):
    """`(epoch, path)` of the `EpochCheckpoints` files in `directory`, oldest epoch first."""
    found = []
    for path in glob.glob(os.path.join(str(directory), "epoch-*.weights.npz")):
        match = EPOCH_CHECKPOINT_RE.search(os.path.basename(path))
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def epoch_checkpoints(directory):
    """The `EpochCheckpoints` files in `directory`, oldest epoch first."""
    return [path for _, path in numbered_epoch_checkpoints(directory)]


def average_record_path(averaged):
    """The record of what an averaged model averages: its path plus `.json` (as
    `best.keras.json` records the best model's score)."""
    return os.fspath(averaged) + ".json"


def average_record(checkpoints):
    """The record of an average of `checkpoints` (`(epoch, path)` pairs), to be written
    *before* averaging them: it names the content that was read."""
    return {"averaged": [
        {"epoch": epoch, "name": os.path.basename(path), "blake2b": file_digest(path)}
        for epoch, path in checkpoints]}


def _read_average_record(path):
    """`[(epoch, name, digest)]` of a record; `ValueError` for any other content."""
    with open(path, encoding="utf-8") as file:
        entries = json.load(file)["averaged"]
    parsed = []
    for entry in entries:
        epoch, name, digest = entry["epoch"], entry["name"], entry["blake2b"]
        match = EPOCH_CHECKPOINT_RE.fullmatch(name) if isinstance(name, str) else None
        if (not isinstance(epoch, int) or not match or int(match.group(1)) != epoch
                or not isinstance(digest, str)):
            raise ValueError(f"not an epoch checkpoint entry: {entry!r}")
        parsed.append((epoch, name, digest))
    if not parsed:
        raise ValueError("no checkpoints")
    return parsed


def final_model_record_path(filepath):
    """The record of the epochs a final model holds (`FinalModelSaver`): its path plus
    `.json`, as `best.keras.json` records the best model's."""
    return os.fspath(filepath) + ".json"


def read_final_model_epochs(filepath):
    """The epochs the final model at `filepath` has trained, as its record says, or `None`
    without a readable record (a model saved before records were written)."""
    try:
        with open(final_model_record_path(filepath), encoding="utf-8") as f:
            return int(json.load(f)["epoch"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_run_directory(run_dir):
    """Refuses a run directory that does not exist or is a file, saying which."""
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(
            f"{run_dir}: no such run directory (train one with `keras-transformer train "
            f"--output {run_dir}`)." if not os.path.exists(run_dir) else
            f"{run_dir} is a file, not a run directory from `keras-transformer train`.")


def check_trained_past(newest_epoch, run_dir, what):
    """Refuses `what` (an average, or its checkpoints) whose newest epoch is older than the
    epochs the run's final model holds (`model.keras.json`): the run trained on without
    keeping epoch checkpoints (a continuation with `keep_checkpoints=0`)."""
    epochs = read_final_model_epochs(os.path.join(os.fspath(run_dir), "model.keras"))
    if epochs is not None and newest_epoch < epochs:
        raise ValueError(
            f"{what} epoch-{newest_epoch:03d}, but the run's final model holds {epochs} "
            "epochs: it trained on without keeping epoch checkpoints (keep_checkpoints), so "
            "an average would hold older weights than the run. Export --checkpoint best or "
            "final, or train on with --set keep_checkpoints=N for at least N more epochs and "
            "average those.")


def consecutive_tail(epochs):
    """The longest run of consecutive epochs at the end of sorted `epochs`."""
    start = len(epochs) - 1
    while start > 0 and epochs[start - 1] == epochs[start] - 1:
        start -= 1
    return epochs[start:]


def consecutive_advice(epochs):
    """What to do about an average of the sorted, not consecutive `epochs`."""
    tail = consecutive_tail(epochs)
    return (f"Average the last {len(tail)} (`keras-transformer average --model RUN --last "
            f"{len(tail)}`), or train on with --set keep_checkpoints=N for at least N more "
            "epochs and average those.")


def check_average_is_current(path):
    """Refuses an averaged model that is not the mean of its run's last epochs.

    With its record (`average_record_path`), the average is refused when the run has an
    epoch checkpoint later than the ones averaged (it trained on after `average`) or its
    final model holds later epochs (it trained on without keeping checkpoints), when an
    averaged checkpoint has other content now (the run was shortened and trained that
    epoch again), or when an averaged checkpoint is gone while an earlier epoch's is still
    there (a resumed run dropped the epochs past its backup). Averaged checkpoints deleted
    oldest first (the run's own pruning) or all of them are not a reason: the average holds
    their weights. An average of epochs that are not consecutive (written before `average`
    refused them) is refused too. Without a record (averages written before it existed),
    the average is refused when an epoch checkpoint is newer than it by file time, which a
    copy that does not keep file times can also cause.

    Args:
        path: path-like, an averaged model in a run's `checkpoints/` directory.

    Raises:
        ValueError: saying which checkpoints, and to average again.
    """
    path = os.fspath(path)
    directory = os.path.dirname(path)
    checkpoints = numbered_epoch_checkpoints(directory)
    record = average_record_path(path)
    if not os.path.exists(record):
        newer = [os.path.basename(p) for _, p in checkpoints
                 if os.stat(p).st_mtime_ns > os.stat(path).st_mtime_ns]
        if newer:
            raise ValueError(
                f"{path} is older than the run's epoch checkpoints {', '.join(newer)}: the "
                "run trained on after it was averaged. Run `keras-transformer average "
                "--model RUN --last N` again."
            )
        return
    try:
        averaged = _read_average_record(record)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"{record} cannot be read ({error}). Run `keras-transformer average --model RUN "
            "--last N` again.") from None
    again = (f"Run `keras-transformer average --model RUN --last {len(averaged)}` again.")
    names = ", ".join(name for _, name, _ in averaged)
    newest = max(epoch for epoch, _, _ in averaged)
    check_trained_past(newest, os.path.dirname(directory), f"{path} averages {names}, up to")
    existing = dict(checkpoints)
    later = [os.path.basename(p) for epoch, p in checkpoints if epoch > newest]
    if later:
        raise ValueError(
            f"{path} averages {names}, but the run has later epoch checkpoints "
            f"({', '.join(later)}): it trained on after it was averaged. {again}")
    dropped = [name for epoch, name, _ in averaged
               if epoch not in existing and any(e < epoch for e in existing)]
    if dropped:
        raise ValueError(
            f"{path} averages {', '.join(dropped)}, which the run no longer has while it "
            f"keeps earlier epochs: it resumed from before them. {again}")
    epochs = sorted(epoch for epoch, _, _ in averaged)
    if epochs != list(range(epochs[0], epochs[-1] + 1)):
        raise ValueError(
            f"{path} averages {names}, which are not consecutive epochs: the run did not "
            f"keep the epochs between them, and the average mixes weights from far apart in "
            f"the run. {consecutive_advice(epochs)}")
    changed = [name for epoch, name, digest in averaged
               if epoch in existing and file_digest(existing[epoch]) != digest]
    if changed:
        raise ValueError(
            f"{path} averages {', '.join(changed)}, whose content changed since (the run "
            f"trained those epochs again). {again}")

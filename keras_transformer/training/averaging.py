"""Checkpoint averaging: the mean of the last epochs' weights, as one model.

Vaswani et al. (2017, section 6.1) average the last 5 checkpoints of their base models
(the last 20 of the big ones): the mean of weights from the flat end of training sits
nearer the middle of the basin than any one of them and usually translates a little
better. A run keeps its last `keep_checkpoints` epochs' weights in
`checkpoints/epoch-NNN.weights.npz` (`EpochCheckpoints`); `average_run` writes their mean
as `checkpoints/averaged.keras`, which `keras-transformer export --checkpoint averaged`
exports, and beside it `checkpoints/averaged.keras.json`, the record of the checkpoints it
averages (`keras_transformer.checkpoint_files`), from which export tells an average of the
run's last epochs from one the run trained past.
"""

import pathlib
import re

import keras
import numpy as np

from keras_transformer.checkpoint_files import (
    AVERAGED_NAME, average_record, average_record_path, check_run_directory,
    check_trained_past, consecutive_advice, consecutive_tail, numbered_epoch_checkpoints,
)
from keras_transformer.data.readers import write_json_atomically
from keras_transformer.textfiles import remove_stale_partials


def average_checkpoints(paths):
    """The element-wise mean of the weights stored in `EpochCheckpoints` files.

    Args:
        paths: list of paths to `.weights.npz` files of the same model.

    Returns:
        A list of NumPy arrays in `model.get_weights()` order. Integer arrays (none in a
        Transformer, but e.g. counters) are taken from the last file instead.

    Raises:
        ValueError: if `paths` is empty or the files hold different shapes.

    Example:

    >>> from keras_transformer.checkpoint_files import epoch_checkpoints
    >>> from keras_transformer.training.callbacks import EpochCheckpoints
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> _ = model.fit(np.ones((8, 2)), np.ones((8, 1)), epochs=3, verbose=0,
    ...               callbacks=[EpochCheckpoints("run/checkpoints", keep=3)])
    >>> paths = epoch_checkpoints("run/checkpoints")
    >>> weights = average_checkpoints(paths[-2:])  # the last two epochs
    >>> last_two = [np.load(p) for p in paths[-2:]]
    >>> bool(np.allclose(weights[0], (last_two[0]["arr_0"] + last_two[1]["arr_0"]) / 2))
    True
    >>> model.set_weights(weights)
    """
    paths = list(paths)
    if not paths:
        raise ValueError("`paths` must name at least one checkpoint file.")
    total = None
    for path in paths:
        with np.load(path) as stored:
            weights = [stored[f"arr_{i}"] for i in range(len(stored.files))]
        if total is None:
            total = [w.astype("float64") if w.dtype.kind == "f" else w for w in weights]
            continue
        if [w.shape for w in weights] != [t.shape for t in total]:
            raise ValueError(f"{path} holds weights of other shapes than {paths[0]}.")
        total = [t + w if w.dtype.kind == "f" else w for t, w in zip(total, weights)]
    return [
        (t / len(paths)).astype(w.dtype) if w.dtype.kind == "f" else t
        for t, w in zip(total, weights)
    ]


def averaging_base(run_dir):
    """The model whose weights an average replaces (its architecture): the run's final
    model, or an unfinished run's last epoch (`checkpoints/last.keras`).

    Raises:
        FileNotFoundError: when the run has neither.
    """
    run_dir = pathlib.Path(run_dir)
    architecture = next((path for path in (run_dir / "model.keras",
                                           run_dir / "checkpoints" / "last.keras")
                         if path.is_file()), None)
    if architecture is None:
        raise FileNotFoundError(
            f"Neither model.keras nor checkpoints/last.keras in {run_dir}: not a run directory "
            "that trained an epoch.")
    return architecture


def _own_models(run_dir):
    """The models training writes in `run_dir` (final, best and last)."""
    run_dir = pathlib.Path(run_dir)
    return [run_dir / "model.keras", run_dir / "checkpoints" / "best.keras",
            run_dir / "checkpoints" / "last.keras"]


def _is_a_runs_own_model(path):
    """Whether `path` is one of the models training writes in a run directory (one holding
    `config.json` and a `tokenizer/` or `history.json`), this run's or another's."""
    path = pathlib.Path(path).resolve()
    run_dir = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    is_run = (run_dir / "config.json").is_file() and (
        (run_dir / "tokenizer").is_dir() or (run_dir / "history.json").is_file())
    return is_run and path in [p.resolve() for p in _own_models(run_dir)]


def average_run(run_dir, last=5, output=None):
    """Writes the average of a run's last `last` epoch checkpoints as a `.keras` model.

    Args:
        run_dir: path-like, a run directory with `model.keras` (or, unfinished,
            `checkpoints/last.keras`) and `checkpoints/epoch-NNN.weights.npz` files (train
            with `keep_checkpoints`).
        last: int, how many of the latest epoch checkpoints to average. Defaults to `5`.
        output: path-like or `None`, where to write; `None` writes
            `<run_dir>/checkpoints/averaged.keras`. Defaults to `None`.

    Returns:
        `(path, averaged_paths)`: the written model and the checkpoints it averages.

    Raises:
        FileNotFoundError: when `run_dir` is not a directory, the run has neither a final
            model nor a last checkpoint, or no epoch checkpoints.
        ValueError: when `last` is not positive, `output` is not a `.keras` file in an
            existing directory or is one of a run's own models (final, best, last), the
            last `last` epoch checkpoints are not consecutive epochs, or the run trained
            past its newest checkpoint.

    Example:

    >>> from keras_transformer.training.callbacks import EpochCheckpoints
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> _ = model.fit(np.ones((8, 2)), np.ones((8, 1)), epochs=4, verbose=0,
    ...               callbacks=[EpochCheckpoints("run/checkpoints", keep=3)])
    >>> model.save("run/model.keras")
    >>> path, used = average_run("run", last=2)
    >>> path.as_posix(), [pathlib.Path(p).name for p in used]
    ('run/checkpoints/averaged.keras', ['epoch-003.weights.npz', 'epoch-004.weights.npz'])
    """
    run_dir = pathlib.Path(run_dir)
    if last < 1:
        raise ValueError(f"`last` must be >= 1. Received: last={last}")
    if output is not None:
        output = pathlib.Path(output)
        if output.is_dir():
            raise ValueError(f"{str(output)!r} is a directory: the average is a Keras model "
                             "file, give a path ending in .keras.")
        if output.suffix != ".keras":
            raise ValueError(f"The average is a Keras model file: give a path ending in "
                             f".keras, not {str(output)!r}.")
        if not output.parent.is_dir():
            raise ValueError(f"The directory of {str(output)!r} does not exist.")
        if _is_a_runs_own_model(output) or any(
                output.resolve() == path.resolve() for path in _own_models(run_dir)):
            raise ValueError(
                f"{str(output)!r} is one of a run's own models (its final, best or last): "
                "an average written there would replace it and its record, and a "
                "continuation of the run would restart its optimizer. Give another path "
                "(without --out: the run's checkpoints/averaged.keras).")
    check_run_directory(run_dir)
    found = numbered_epoch_checkpoints(run_dir / "checkpoints")  # (epoch, path)
    if not found:
        raise FileNotFoundError(
            f"No epoch checkpoints in {run_dir / 'checkpoints'}: train with "
            "--set keep_checkpoints=N to keep the last N epochs' weights."
        )
    check_trained_past(found[-1][0], run_dir, "The run's newest epoch checkpoint is")
    chosen = found[-last:]
    epochs = [epoch for epoch, _ in chosen]
    if len(consecutive_tail(epochs)) < len(epochs):
        names = ", ".join(pathlib.Path(path).name for _, path in chosen)
        raise ValueError(
            f"The run's last {len(chosen)} epoch checkpoints ({names}) are not consecutive "
            "epochs: the run did not keep the epochs between them (keep_checkpoints changed "
            "between continuations), and their average would mix weights from far apart in "
            f"the run. {consecutive_advice(epochs)}")
    architecture = averaging_base(run_dir)
    # Recorded before averaging: the record names the content the average reads.
    record = average_record(chosen)
    chosen = [path for _, path in chosen]
    import keras_transformer.layers  # noqa: F401  (registers the layer classes)
    from keras_transformer.training.callbacks import save_atomically

    model = keras.saving.load_model(architecture, compile=False, safe_mode=True)
    model.set_weights(average_checkpoints(chosen))
    output = pathlib.Path(output) if output else run_dir / "checkpoints" / AVERAGED_NAME
    # An average killed while saving left its partial files (`.partial-PID-averaged.keras`
    # and its record's). Only those: a training on another machine may be writing its own
    # beside them (a shared volume), and its process id means nothing here.
    remove_stale_partials(output.parent, pattern=re.compile(
        rf"\.partial-(?P<pid>\d+)-{re.escape(output.name)}(\.json)?$"))
    # The old record goes first: a kill before the new one is written leaves a new model
    # without a record (checked by its age), never one described by the old record.
    pathlib.Path(average_record_path(output)).unlink(missing_ok=True)
    save_atomically(model, output)
    write_json_atomically(average_record_path(output), record, indent=1)
    return output, chosen


__all__ = ["AVERAGED_NAME", "average_checkpoints", "average_run", "averaging_base"]

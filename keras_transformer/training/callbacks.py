"""Callbacks of a training run: TensorBoard, checkpoints, fault tolerance, validation BLEU."""

import glob
import importlib.util
import json
import logging
import math
import numbers
import os
import time

import keras
import numpy as np
import sacrebleu

from keras_transformer.checkpoint_files import (  # noqa: F401  (re-exported for callers)
    EPOCH_CHECKPOINT_PATTERN, epoch_checkpoints, final_model_record_path,
    numbered_epoch_checkpoints, read_final_model_epochs,
)
from keras_transformer.data.readers import write_json_atomically
from keras_transformer.languages import bleu_tokenizer
from keras_transformer.textfiles import flush_to_disk, replace_atomically
from keras_transformer.training.schedules import cooldown_steps

logger = logging.getLogger(__name__)

# Extensions `BleuCallback` knows how to save the best model to.
_MODEL_SUFFIX = ".keras"
_WEIGHTS_SUFFIX = ".weights.h5"


class BleuCallback(keras.callbacks.Callback):
    """Computes corpus BLEU on a validation sample and keeps the best model.

    Every `every_n_epochs` epochs it translates `sources` with the injected `translate_fn`
    and scores the output against `references` with sacrebleu's default (cased,
    `13a`-tokenized, or as `target_lang` is written) corpus BLEU on detokenized text, the
    number papers report as "sacreBLEU". The score goes into the epoch `logs` as `val_bleu`,
    so callbacks after this one in the list (`ModelSaver(monitor="val_bleu")`, `TensorBoard`, the
    progress bar, `History`) see it. When the score beats the best so far and `best_path`
    is set, the model is saved there. The best score is kept next to it in
    `<best_path>.json`, so a run resumed by `BackupAndRestore` does not overwrite a better
    model with a worse one.

    The callback never imports decoding code: the caller builds `translate_fn` (e.g.
    greedy or beam search over `self.model`'s current weights; `train`'s default is
    `trainer.validation_translator`'s) and passes it in.

    Args:
        translate_fn: callable `list[str] -> list[str]`, detokenized translations of
            detokenized source sentences, in order.
        sources: list of strings, validation source sentences.
        references: list of strings, their reference translations (same length).
        every_n_epochs: int, compute BLEU after every this many epochs, and after the
            run's last (`fit`'s `epochs`, or one `ends_after` names), which at the end of
            a learning-rate cooldown is often the best. Defaults to `1`.
        best_path: string or `None`, where to save the best model: a `.keras` path saves
            the whole model, a `.weights.h5` path its weights; `None` saves nothing.
            Defaults to `None`.
        batch_size: int or `None`, translate this many sentences per call of
            `translate_fn`; `None` passes all at once. Defaults to `None`.
        verbose: int, `1` shows a progress bar over the sentences while translating
            and prints each score with the best so far and the time it took (decoding
            hundreds of sentences can take minutes); `2` the same lines without the bar
            (as `fit`'s one line per epoch: no `\r` or ANSI codes in a log file); `0` is
            silent. Defaults to `1`.
        target_lang: str or None, the references' language: BLEU is tokenized as it is
            written (`keras_transformer.languages.bleu_tokenizer`; `13a` for None and most
            languages, `zh` for Chinese). Defaults to `None`.
        initial_epoch: int or None, the epoch a resumed run resumes after (`fit`'s
            `initial_epoch`). A best model recorded for a later epoch (saved before a kill
            that the backup of its epoch did not see) holds weights the run no longer has:
            it and its record are deleted, and the epoch trained again decides. `None`
            keeps any record. Defaults to `None`.
        ends_after: callable `(epoch) -> bool` or `None`: whether the run ends after the
            epoch (0-based) now ending although `fit` was given more, as a time budget
            decides after this callback (`train` passes its budget's plan); that epoch is
            scored with the others, in its logs. A last epoch it did not foresee (a
            callback's stop) is scored when `fit` ends, before any callback after this one
            restores other weights, unless its loss was not finite (`TerminateOnNaN`).
            Defaults to `None`.
        record_late: callable `(epoch, bleu)` or `None`: records a score made as `fit`
            ends, when the epoch's logs are gone (`train` writes it into `history.json`).
            Defaults to `None`.

    Example:

    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> x, y = np.ones((8, 2)), np.ones((8, 1))
    >>> def translate(sentences):  # stands in for a decoder over `model`
    ...     return [s.replace("Hund", "Hunde") for s in sentences]
    >>> bleu = BleuCallback(translate, ["Ein Hund rennt."], ["Ein Hunde rennt."],
    ...                     best_path="run/best.keras", verbose=0)
    >>> history = model.fit(x, y, epochs=1, verbose=0, callbacks=[bleu])
    >>> round(history.history["val_bleu"][0], 2)
    100.0

    References:
        - [Post, 2018](https://aclanthology.org/W18-6319/), a call for clarity in
          reporting BLEU scores (sacreBLEU).
    """

    def __init__(
        self,
        translate_fn,
        sources,
        references,
        every_n_epochs=1,
        best_path=None,
        batch_size=None,
        verbose=1,
        target_lang=None,
        initial_epoch=None,
        ends_after=None,
        record_late=None,
    ):
        super().__init__()
        if ends_after is not None and not callable(ends_after):
            raise ValueError("`ends_after` must be None or a function of the epoch that says "
                             f"whether the run ends after it. Received: {ends_after!r}")
        if record_late is not None and not callable(record_late):
            raise ValueError("`record_late` must be None or a function (epoch, bleu). "
                             f"Received: {record_late!r}")
        if not callable(translate_fn):
            raise ValueError(f"`translate_fn` must be a function from a list of source "
                             f"sentences to their translations. Received: {translate_fn!r}")
        if not len(sources):
            raise ValueError("`sources` is empty: validation BLEU needs sentences to translate.")
        if len(sources) != len(references):
            raise ValueError(
                "`sources` and `references` must have the same length. Received: "
                f"{len(sources)} sources, {len(references)} references"
            )
        if every_n_epochs < 1:
            raise ValueError(f"`every_n_epochs` must be >= 1. Received: {every_n_epochs}")
        if best_path is not None and not str(best_path).endswith(
            (_MODEL_SUFFIX, _WEIGHTS_SUFFIX)
        ):
            raise ValueError(
                f"`best_path` must end with {_MODEL_SUFFIX!r} or {_WEIGHTS_SUFFIX!r}. "
                f"Received: best_path={best_path!r}"
            )
        self.translate_fn = translate_fn
        self.sources = list(sources)
        self.references = list(references)
        self.every_n_epochs = every_n_epochs
        self.best_path = None if best_path is None else str(best_path)
        self.batch_size = batch_size
        self.verbose = verbose
        self.tokenize = bleu_tokenizer(target_lang)
        self.initial_epoch = initial_epoch
        self.ends_after = ends_after
        self.record_late = record_late
        self.best_bleu = None
        self._last_epoch = self._scored_epoch = None  # this `fit`'s
        self._last_loss_finite = True

    @property
    def _record_path(self):
        return None if self.best_path is None else self.best_path + ".json"

    def on_train_begin(self, logs=None):
        self._last_epoch = self._scored_epoch = None
        if self._record_path is None:
            return
        record = read_best_record(self.best_path, self.initial_epoch)
        # A record of another score (val_loss: a run trained without BLEU) has none to beat.
        self.best_bleu = None if record is None else record.get("val_bleu")

    def compute_bleu(self):
        """Translates the validation sample and returns its corpus BLEU (0-100)."""
        step = self.batch_size or max(len(self.sources), 1)
        progress = (
            keras.utils.Progbar(len(self.sources), unit_name="sentence")
            if self.verbose == 1 else None
        )
        if self.verbose:  # a line in a log too; the bar (`\r`, ANSI codes) at 1 only
            print(f"Validation BLEU: translating {len(self.sources)} sentences", flush=True)
        hypotheses = []
        for start in range(0, len(self.sources), step):
            hypotheses.extend(self.translate_fn(self.sources[start : start + step]))
            if progress is not None:
                progress.update(min(start + step, len(self.sources)))
        if len(hypotheses) != len(self.sources):
            raise ValueError(
                f"`translate_fn` returned {len(hypotheses)} translations for "
                f"{len(self.sources)} sources."
            )
        return sacrebleu.corpus_bleu(hypotheses, [self.references],
                                     tokenize=self.tokenize).score

    def _scores(self, epoch):
        """Whether the epoch (0-based) now ending is scored."""
        return ((epoch + 1) % self.every_n_epochs == 0
                or epoch + 1 >= self.params.get("epochs", math.inf)
                or (self.ends_after is not None and bool(self.ends_after(epoch))))

    def on_epoch_end(self, epoch, logs=None):
        self._last_epoch = epoch
        loss = (logs or {}).get("loss")
        self._last_loss_finite = loss is None or bool(np.all(np.isfinite(loss)))
        if self._scores(epoch):
            self._score(epoch, logs)

    def on_train_end(self, logs=None):
        # The run's last epoch, if a stop this callback did not foresee ended it unscored.
        if (self._last_epoch is not None and self._scored_epoch != self._last_epoch
                and self._last_loss_finite):
            bleu = self._score(self._last_epoch, None, last=True)
            if self.record_late is not None:
                self.record_late(self._last_epoch, bleu)

    def _score(self, epoch, logs, last=False):
        self._scored_epoch = epoch
        started = time.time()
        bleu = self.compute_bleu()
        if logs is not None:
            logs["val_bleu"] = bleu
        improved = self.best_bleu is None or bleu > self.best_bleu
        if self.verbose:
            best = "new best" if improved else f"best {self.best_bleu:.2f}"
            which = " (the run's last)" if last else ""
            print(f"Epoch {epoch + 1}{which}: val_bleu = {bleu:.2f} ({best}) on "
                  f"{len(self.sources)} sentences in {time.time() - started:.1f}s", flush=True)
        if improved:
            self.best_bleu = bleu
            if self.best_path is not None:
                save_best(self.model, self.best_path, {"val_bleu": bleu, "epoch": epoch + 1})
        return bleu


def read_best_record(model_path, initial_epoch=None):
    """The record (`{score name: value, "epoch": N}`) of a best model saved with one, or
    None. A record of an epoch after `initial_epoch` (a resumed run's) is of an epoch the
    run trains again: the record is written before its model, so the model is of that
    epoch or (a save cut short) an earlier best it was replacing; both go, as that epoch's
    checkpoint does (`drop_epoch_checkpoints_after`), the record last, so that a kill
    between the two leaves it to be dropped again."""
    record_path = f"{model_path}.json"  # as `save_best` writes it
    if not os.path.exists(record_path):
        return None
    with open(record_path, encoding="utf-8") as f:
        record = json.load(f)
    if initial_epoch is not None and record.get("epoch", 0) > initial_epoch:
        for path in (model_path, record_path):
            if os.path.exists(path):
                os.remove(path)
        return None
    return record


def save_best(model, path, record):
    """Saves a best model and its record (`path + ".json"`): the record first (see
    `read_best_record`), then the model, each atomically."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_json_atomically(f"{path}.json", record)
    save_atomically(model, path)


def save_atomically(model, path):
    """`model.save(path)` (or `save_weights` for a `.weights.h5` path) into a temporary file
    beside `path`, renamed over it once complete: a full disk or a kill during the save
    leaves the previous file whole."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    # The partial file keeps the suffix, from which Keras picks the format.
    save = model.save if str(path).endswith(_MODEL_SUFFIX) else model.save_weights
    replace_atomically(os.path.abspath(path), lambda temporary: save(str(temporary)))


class AtomicBackupAndRestore(keras.callbacks.BackupAndRestore):
    """Keras' `BackupAndRestore` whose backup is whole at every moment.

    Keras rewrites `backup/latest.weights.h5` in place, then the epoch in
    `training_metadata.json`: a kill (a preemption, a Ctrl-C) or a full disk during the
    first write left a backup that could not be read, and one between the two writes
    resumed an epoch's weights under the previous epoch's number. Here every backup writes
    its weights to a new file, then the metadata naming that file (atomically, renamed over
    the old one), then removes the weights before the previous ones: the metadata always
    names a complete file of its epoch. The previous epoch's weights stay (`previous` in the
    metadata), so that workers whose backups are one epoch apart (one killed between the
    others' backup and its own) can all resume from the earlier one: `resume_epoch` picks
    it. A backup written by Keras' own callback (no file named) is still read.

    `before_delete` (a callable, or `None`) runs when training ends, before the backup is
    deleted: the workers of a cluster wait there for each other (`strategy.worker_barrier`),
    so no worker deletes its backup before the chief has saved the final model (which
    `FinalModelSaver`, before this callback, does). A chief killed or failing in that save
    never reaches it, and the others, stopping in the barrier, keep their backups: started
    again, every worker resumes from the same epoch.
    """

    def __init__(self, *args, resume_epoch=None, before_delete=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.resume_epoch = resume_epoch
        self.before_delete = before_delete
        # False once a `BackupRestorer` placed first restores instead.
        self.restore_at_begin = True

    def on_train_end(self, logs=None):
        if self.before_delete is not None:
            self.before_delete()
        super().on_train_end(logs)

    def on_train_begin(self, logs=None):
        if self.restore_at_begin:
            self._load_model()

    def _load_model(self):
        if not self.model.built:
            raise ValueError("To resume from a backup the model must be built before `fit`.")
        metadata = read_backup_metadata(self.backup_dir)
        if metadata is None or self.resume_epoch == 0:
            return  # a new run, or one that starts again from its seeded weights
        if self.resume_epoch is not None and self.resume_epoch != metadata["epoch"]:
            previous = metadata.get("previous") or {}
            if previous.get("epoch") != self.resume_epoch:
                raise ValueError(f"{self.backup_dir} holds no backup of epoch "
                                 f"{self.resume_epoch} (it holds {backup_epochs(metadata)}).")
            metadata = previous
        weights = os.path.join(self.backup_dir, metadata.get("weights", "latest.weights.h5"))
        if not os.path.isfile(weights):
            if "weights" in metadata:  # this callback's record names a file it wrote
                raise FileNotFoundError(f"{weights}, the backup of epoch {metadata['epoch']}, "
                                        "is missing: the backup was damaged.")
            return
        if self.model.optimizer is not None and not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)
        self.model.load_weights(weights)
        self.model._initial_epoch = metadata["epoch"]

    def on_epoch_begin(self, epoch, logs=None):
        self._current_epoch = epoch  # Keras' counts from 0 in every fit: a mid-epoch
        # backup (an integer save_freq) of a resumed run recorded epoch 0

    def _save_model(self):
        os.makedirs(self.backup_dir, exist_ok=True)
        old = read_backup_metadata(self.backup_dir) or {}
        # A name never used before in this backup: no file the record names is rewritten.
        serial = int(old.get("serial", 0)) + 1
        name = f"backup-{serial:06d}.weights.h5"
        self.model.save_weights(os.path.join(self.backup_dir, name), overwrite=True)
        flush_to_disk(os.path.join(self.backup_dir, name))  # before the record names it
        previous = {"epoch": old["epoch"], "weights": old["weights"]} if old.get(
            "weights") else None
        write_json_atomically(self._training_metadata_path, {
            "epoch": self._current_epoch, "batch": self._last_batch_seen, "weights": name,
            "serial": serial, "previous": previous})
        keep = {name} | ({previous["weights"]} if previous else set())
        for other in glob.glob(os.path.join(glob.escape(self.backup_dir), "*.weights.h5")):
            if os.path.basename(other) not in keep:
                os.remove(other)


class BackupRestorer(keras.callbacks.Callback):
    """Restores an `AtomicBackupAndRestore`'s backup when training begins, placed first, so
    that every other callback's `on_train_begin` sees the restored weights and step (the
    backup callback itself comes last, to back up an epoch after everything else has
    handled it).

    Args:
        backup: the run's `AtomicBackupAndRestore` (in the same `fit`'s callbacks).
    """

    def __init__(self, backup):
        super().__init__()
        self.backup = backup
        backup.restore_at_begin = False

    def on_train_begin(self, logs=None):
        self.backup._load_model()


def read_backup_metadata(backup_dir):
    """The record of a run's backup (`AtomicBackupAndRestore`), or `None` without one."""
    path = os.path.join(str(backup_dir), "training_metadata.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def backup_epochs(metadata):
    """The epochs a backup record can resume after: the latest, then the previous one."""
    if metadata is None:
        return []
    previous = metadata.get("previous") or {}
    return [metadata["epoch"]] + ([previous["epoch"]] if "epoch" in previous else [])


class StopTogether(keras.callbacks.Callback):
    """Under several workers, a stop decided by one worker's callbacks stops every worker
    after the same epoch.

    A callback of one worker alone setting `model.stop_training` (an `EarlyStopping` on
    `val_bleu`, which only the chief computes and logs) ended that worker's `fit` while
    the others went on into their next epoch's all-reduce: the workers then waited for each
    other for ever (the chief in the end-of-training barrier). Placed after every callback
    that may stop training, at each epoch's end it makes `stop_training` true on every
    worker if it is on one (`any_worker`, a collective op every worker runs there). A stop in the middle of an
    epoch (`on_train_batch_end`) is not seen: it must be decided alike on every worker.

    Args:
        any_worker: callable `bool -> bool`, whether any worker passed `True` (a
            collective op; see `trainer.py`).
    """

    def __init__(self, any_worker):
        super().__init__()
        self.any_worker = any_worker

    def on_epoch_end(self, epoch, logs=None):
        self.model.stop_training = bool(self.any_worker(bool(self.model.stop_training)))


class FinalModelSaver(keras.callbacks.Callback):
    """Saves the trained model atomically when `fit` ends, before the backup is deleted.

    Place it before the backup callback: `on_train_end` runs in the callbacks' order, so a
    kill during this save leaves the backup to resume from (and no half-written model).

    With `run_history`, the number of epochs the model has trained (over every attempt of
    the run) is recorded beside it in `<filepath>.json` (`{"epoch": N}`, written after the
    model, atomically; `read_final_model_epochs`): a run found with both a final model and a
    backup tells from it whether the model is the backup's epoch or an earlier one, which
    file times do not tell once the run was copied without them.

    Args:
        filepath: str, the `.keras` path.
        run_history: the run's `RunHistory` or `None` (no record). Defaults to `None`.
    """

    def __init__(self, filepath, run_history=None):
        super().__init__()
        self.filepath = str(filepath)
        self.run_history = run_history

    def on_train_end(self, logs=None):
        save_atomically(self.model, self.filepath)
        if self.run_history is not None:
            write_json_atomically(final_model_record_path(self.filepath),
                                  {"epoch": len(self.run_history.epoch_seconds)})


class DropoutSeeds(keras.callbacks.Callback):
    """Sets every random seed generator of the model (dropout's) from the run's seed and the
    epoch at the start of each epoch.

    A seed generator's state is not among the weights a backup saves, and a process
    restarts it from its initial seed: a resumed run drew other dropout masks than an
    uninterrupted one, and ended with other weights. With the state a function of
    `(seed, generator's position among the model's generators, epoch)` every epoch draws the
    same masks however the run got there (a resumed run resumes at an epoch's start). The
    position, not the variable's path: Keras numbers generators process-wide
    (`seed_generator_9` once another model was built), so a path-keyed seed changed with
    every model built before in the same process (a notebook kernel).
    """

    def __init__(self, seed):
        super().__init__()
        self.seed = int(seed)

    def on_epoch_begin(self, epoch, logs=None):
        import hashlib

        generators = [variable for variable in self.model.variables
                      if variable.name == "seed_generator_state"]
        for position, variable in enumerate(generators):
            # One seed per (run, generator, epoch), the counter from 0: Keras reduces seeds
            # modulo 2**31 - 2, so an epoch in the counter's high bits (epoch << 32) shifted
            # each epoch's masks by 4 steps only, repeating them epoch after epoch.
            key = f"{self.seed}/{position}/{epoch}".encode()
            seed = int(hashlib.blake2b(key, digest_size=8).hexdigest(), 16) % (2**31 - 2)
            variable.assign(np.array([seed, 0], dtype=variable.dtype))


class ModelSaver(keras.callbacks.Callback):
    """Saves the model (or its weights) after every epoch, or with `monitor` only when the
    monitored value beats the best so far; each save atomic (`save_atomically`).

    Keras' `ModelCheckpoint` writes over the previous file in place, and a resumed run's
    checkpoint starts with no best, so its first epoch replaced the best model whatever its
    score: here the best of the earlier epochs (`earlier`) is the one to beat.

    Args:
        filepath: str, a `.keras` (the model) or `.weights.h5` (its weights) path.
        monitor: str or None, a logged quantity; None saves every epoch.
        mode: `"min"`, `"max"` or `"auto"` (max for accuracies and BLEU, else min).
        earlier: the monitored values of earlier epochs (a resumed run's), the best of them
            to beat; None (an epoch without the value) and NaN are skipped.
        initial_epoch: int or None, the epoch a resumed run resumes after. Each save is
            recorded in `filepath + ".json"` (`{monitor: value, "epoch": N}`, or `{"epoch":
            N}` without `monitor`; written before the model); a model recorded for a
            later epoch (saved before a kill that came before that epoch's backup) is
            dropped when training begins, as `BleuCallback` drops its own: its weights
            are of an epoch trained again (or, resumed to fewer epochs, never), and a best
            one's value is in no history for a later epoch to beat.
    """

    def __init__(self, filepath, monitor=None, mode="auto", earlier=(), initial_epoch=None):
        super().__init__()
        if not str(filepath).endswith((_MODEL_SUFFIX, _WEIGHTS_SUFFIX)):
            raise ValueError(f"`filepath` must end with {_MODEL_SUFFIX!r} (the model) or "
                             f"{_WEIGHTS_SUFFIX!r} (its weights). Received: {filepath!r}")
        if mode not in ("auto", "min", "max"):
            raise ValueError(f"mode must be 'auto', 'min' or 'max', got {mode!r}.")
        if mode == "auto":
            mode = "max" if monitor and ("acc" in monitor or "bleu" in monitor) else "min"
        earlier = [v for v in earlier
                   if v is not None and np.ndim(v) == 0 and not math.isnan(v)]
        self.filepath, self.monitor, self.mode = filepath, monitor, mode
        self.best = (min if mode == "min" else max)(earlier) if earlier else None
        self.initial_epoch = initial_epoch

    def on_train_begin(self, logs=None):
        if os.path.exists(f"{self.filepath}.json") and (
                read_best_record(self.filepath, self.initial_epoch) is None):
            self.best = None  # dropped: its weights had replaced the earlier best's

    def on_epoch_end(self, epoch, logs=None):
        if self.monitor is not None:
            value = (logs or {}).get(self.monitor)
            if value is None:
                logger.warning("%s is not in the epoch's logs: %s not saved.", self.monitor,
                               self.filepath)
                return
            if np.ndim(value):
                raise ValueError(f"{self.monitor!r} holds {np.size(value)} values: the best "
                                 "model is chosen on a metric of one value.")
            value = float(value)
            if math.isnan(value):
                return
            if self.best is not None and not (
                    value < self.best if self.mode == "min" else value > self.best):
                return
            self.best = value
            save_best(self.model, self.filepath, {self.monitor: value, "epoch": epoch + 1})
            return
        save_best(self.model, self.filepath, {"epoch": epoch + 1})


class RunHistory(keras.callbacks.Callback):
    """Keeps the whole run's history and training time in `history.json`, epoch by epoch.

    `model.fit`'s own `History` covers one call only: a run resumed by `BackupAndRestore`
    or continued to more epochs would lose the epochs of earlier processes. This callback
    starts from the earlier epochs' records (`initial`, as read by `read_run_history`),
    appends every epoch's logs and wall time, and rewrites the file after every epoch.
    Place it before the backup callback: a process killed between the two leaves one
    epoch more here than in the backup, which the trainer drops when it resumes.

    The file holds `{"history": {name: [value per epoch]}, "epoch_seconds": [...],
    "train_seconds": sum of epoch_seconds, "epochs": number of epochs}`, `"precision"` (of
    the last epoch) when given, and `"stopped": {"epochs": N, "planned": M}` when a callback ended `fit`
    (`model.stop_training`, say
    an `EarlyStopping`) after N of the M epochs it was given (`RecordStop` writes it): a
    stop other than the time budget's (`TimeBudget` and `BudgetCooldown` call
    `budget_stop`), which the run's settings could not tell again when it is run once more.

    Args:
        path: string, the JSON file (e.g. `<run>/history.json`).
        initial: dict or `None`, the record of the epochs already trained (see
            `read_run_history`). Defaults to `None` (a new run).
        reduce_seconds: callable `float -> float` or `None`: each epoch's wall time is
            recorded as `reduce_seconds(seconds)`. Several workers pass
            `keras_transformer.training.strategy.slowest_worker(strategy)`, so that every
            worker's record, and what a time budget plans from it, holds the same times.
            Defaults to `None`.
        precision: str or `None`, the dtype policy the epochs train in, recorded as
            `"precision"` once an epoch has trained in it: the precision of the run's last
            epoch (`train` warns when a run goes on in another). Defaults to `None`.

    Example:

    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> x, y = np.ones((8, 2)), np.ones((8, 1))
    >>> record = RunHistory("history.json")
    >>> _ = model.fit(x, y, epochs=2, verbose=0, callbacks=[record])
    >>> record.record()["epochs"], len(record.record()["history"]["loss"])
    (2, 2)
    """

    def __init__(self, path, initial=None, reduce_seconds=None, precision=None):
        super().__init__()
        self.path = str(path)
        self.reduce_seconds = reduce_seconds
        initial = initial or {}
        # The precision this `fit`'s epochs train in, and the one of the last epoch trained.
        self.precision = precision
        self._last_precision = initial.get("precision")
        self.history = {k: list(v) for k, v in initial.get("history", {}).items()}
        self.epoch_seconds = list(initial.get("epoch_seconds", []))
        self._epoch_started = None
        self.stopped = None  # this `fit`'s stop, if a callback other than the budget's made it
        self._budget_stop = False

    def budget_stop(self):
        """Tells the record that the run's time budget stops `fit` (`TimeBudget`,
        `BudgetCooldown`): its settings say so again, so no `"stopped"` is recorded."""
        self._budget_stop = True

    def record_stop(self, planned):
        """Records that a callback other than the budget's stopped `fit` after the epochs
        recorded so far, of the `planned` ones it was given (`RecordStop`); nothing if the
        budget stopped it."""
        if not self._budget_stop:
            self.stopped = {"epochs": len(self.epoch_seconds), "planned": int(planned)}
            write_json_atomically(self.path, self.record(), indent=2)

    @property
    def train_seconds(self):
        """float, the training time of all epochs so far, over every process of the run."""
        return float(sum(self.epoch_seconds))

    def record_late(self, name, epoch, value):
        """Records `value` as the metric `name` of `epoch` (0-based), one already recorded
        (a score made as `fit` ends, after the epoch's logs: `BleuCallback`)."""
        values = self.history.setdefault(name, [])
        values.extend([None] * (len(self.epoch_seconds) - len(values)))
        values[epoch] = float(value)
        write_json_atomically(self.path, self.record(), indent=2)

    def epoch_elapsed(self):
        """Seconds since the epoch now training began (this process's clock), or None
        outside an epoch."""
        return None if self._epoch_started is None else time.time() - self._epoch_started

    def on_train_begin(self, logs=None):
        self.stopped, self._budget_stop = None, False  # this `fit`'s own
        # The file may record an epoch the backup lost (killed between the two writes): a
        # run resumed to no further epoch must not keep it.
        if os.path.isfile(self.path) and (
                read_run_history(self.path)["epochs"] != len(self.epoch_seconds)):
            write_json_atomically(self.path, self.record(), indent=2)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_started = time.time()

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.time() - self._epoch_started
        self._epoch_started = None
        if self.reduce_seconds is not None:
            seconds = self.reduce_seconds(seconds)
        self.epoch_seconds.append(seconds)
        epochs = len(self.epoch_seconds)
        for key, value in (logs or {}).items():
            # A metric first logged in a later epoch (val_bleu every n epochs) is padded
            # with None, so every list is indexed by epoch.
            values = self.history.setdefault(key, [None] * (epochs - 1))
            values.extend([None] * (epochs - 1 - len(values)))
            # A metric of several values (`R2Score(class_aggregation=None)`) as a list.
            values.append(float(value) if np.ndim(value) == 0 else
                          np.asarray(value, dtype=float).tolist())
        for values in self.history.values():
            values.extend([None] * (epochs - len(values)))
        if self.precision is not None:
            self._last_precision = self.precision
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        write_json_atomically(self.path, self.record(), indent=2)

    def record(self):
        """The dict written to the file."""
        record = {
            "history": self.history,
            "epoch_seconds": self.epoch_seconds,
            "train_seconds": self.train_seconds,
            "epochs": len(self.epoch_seconds),
        }
        if self._last_precision is not None:
            record["precision"] = self._last_precision
        if self.stopped is not None:
            record["stopped"] = self.stopped
        return record


class RecordStop(keras.callbacks.Callback):
    """Records in the run's `RunHistory` a stop that callbacks decided (`model.stop_training`
    before the epochs `fit` was given), at the end of the epoch they decided it: placed
    after every callback that may stop training (`StopTogether` included) and before the
    backup, so a process killed after the backup of that epoch, before `fit` ended, finds
    the stop recorded when it resumes, and every worker of a cluster records it with the
    same backup.

    Args:
        run_history: the run's `RunHistory`.
    """

    def __init__(self, run_history):
        super().__init__()
        self.run_history = run_history

    def on_epoch_end(self, epoch, logs=None):
        planned = self.params.get("epochs")
        if self.model.stop_training and planned and epoch + 1 < planned:
            self.run_history.record_stop(planned)


def read_run_history(path, epochs=None):
    """Reads a `RunHistory` file, keeping only the first `epochs` epochs.

    Args:
        path: path-like, the JSON file.
        epochs: int or `None`, the epochs the resumed state covers; later ones (written
            just before a kill that the backup did not see) are dropped. `None` keeps all.

    Returns:
        The record dict, empty lists when the file does not exist.
    """
    if not os.path.exists(path):
        return {"history": {}, "epoch_seconds": [], "train_seconds": 0.0, "epochs": 0}
    with open(path, encoding="utf-8") as f:
        record = json.load(f)
    record.setdefault("epoch_seconds", [])
    if epochs is not None:
        record["history"] = {k: v[:epochs] for k, v in record.get("history", {}).items()}
        record["epoch_seconds"] = record["epoch_seconds"][:epochs]
        if (record.get("stopped") or {}).get("epochs") != len(record["epoch_seconds"]):
            record.pop("stopped", None)  # a stop after epochs the resumed state lacks
    record["epochs"] = len(record["epoch_seconds"])
    record["train_seconds"] = float(sum(record["epoch_seconds"]))
    return record


def _check_budget(minutes):
    """Refuses a time budget that is not a finite number of minutes > 0."""
    if isinstance(minutes, bool) or not isinstance(minutes, numbers.Real) or not (
            0 < minutes < math.inf):
        raise ValueError(f"`minutes` must be a finite number > 0. Received: {minutes!r}")


def time_budget_reached(epoch_seconds, minutes):
    """Whether one more epoch would end after `minutes` of training.

    The next epoch is predicted to last as long as the longest one so far (validation
    epochs are longer than the others), the first left out once another is timed (it
    also traces the step; `predicted_epoch_seconds`), so a run stops before it overruns
    the budget.

    Args:
        epoch_seconds: list of float, the wall time of every epoch trained so far.
        minutes: float or `None`, the budget. `None` never stops.

    Returns:
        bool.

    Example:

    >>> time_budget_reached([600.0, 660.0], minutes=35)  # 21 + 11 min <= 35
    False
    >>> time_budget_reached([600.0, 660.0, 630.0], minutes=35)  # 31.5 + 11 min > 35
    True
    """
    if minutes is None or not epoch_seconds:
        return False
    return _epochs_left(epoch_seconds, minutes) < 1


def predicted_epoch_seconds(epoch_seconds):
    """How long the next epoch is predicted to last: the longest epoch after the first
    (the first also traces the training step: 449 s against 309-431 s for the next six in
    one run of the `multi30k` preset), or the first while it is the only one.

    A resumed attempt's first epoch traces again; it is counted, which errs on the safe
    side.

    Example:

    >>> predicted_epoch_seconds([449.0]), predicted_epoch_seconds([449.0, 403.0, 356.0])
    (449.0, 403.0)
    """
    return max(epoch_seconds[1:] or epoch_seconds)


def _epochs_left(epoch_seconds, minutes):
    """How many more epochs, each as long as `predicted_epoch_seconds`, end within `minutes`
    (negative when the budget is already overrun): the prediction of both
    `time_budget_reached` and `plan_cooldown`."""
    return int((60.0 * minutes - sum(epoch_seconds)) // predicted_epoch_seconds(epoch_seconds))


class TimeBudget(keras.callbacks.Callback):
    """Stops `fit` after the epoch past which the next one would overrun a time budget.

    Machines of one kind differ in speed (up to 1.7x measured for this project's
    reference recipe), so a fixed number of epochs tuned to fill an hour on one machine
    overruns on another. With a budget, `epochs` becomes an upper bound. The clock is the
    run's training time over every process that trained it (`RunHistory.train_seconds`,
    validation included; vocabulary and data preparation are not counted), and the next
    epoch is predicted by the longest one so far after the first (`time_budget_reached`).
    Place it after the `RunHistory` it reads.

    Args:
        minutes: float, the budget.
        run_history: the run's `RunHistory`.

    Example:

    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> record = RunHistory("budget_history.json")
    >>> budget = TimeBudget(1e-9, record)
    >>> _ = model.fit(np.ones((8, 2)), np.ones((8, 1)), epochs=5, verbose=0,
    ...               callbacks=[record, budget])
    Time budget: 0.0 of 1e-09 minutes used after epoch 1; ... so training stops here.
    >>> record.record()["epochs"], budget.stopped_epoch
    (1, 1)
    """

    def __init__(self, minutes, run_history):
        super().__init__()
        _check_budget(minutes)
        self.minutes = float(minutes)
        self.run_history = run_history
        self.stopped_epoch = None

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 >= self.params.get("epochs", float("inf")):
            return  # the last epoch: the run ends anyway, the budget stopped nothing
        seconds = self.run_history.epoch_seconds
        if time_budget_reached(seconds, self.minutes):
            self.model.stop_training = True
            self.run_history.budget_stop()
            self.stopped_epoch = epoch + 1
            print(f"Time budget: {sum(seconds) / 60:.1f} of {self.minutes:g} minutes used "
                  f"after epoch {epoch + 1}; the next epoch (up to "
                  f"{predicted_epoch_seconds(seconds) / 60:.1f} "
                  "min) would overrun it, so training stops here.", flush=True)


def plan_cooldown(epoch_seconds, minutes, max_epochs, steps_per_epoch, fraction):
    """The run length and cooldown of a budgeted run, after the epochs timed so far.

    After every epoch the budget is predicted to hold the epochs so far plus as many
    more as fit in what is left, each as long as the longest so far after the first (the
    rule of `time_budget_reached`, at most `max_epochs`); the cooldown is the last
    `fraction` of that many epochs' updates (`cooldown_steps`). Updates before the
    cooldown do not depend on the run's length, so the plan follows the prediction until its
    cooldown has begun (`epochs * (1 - fraction)` epochs done), then stays; it is always
    made once after the first epoch, so the first plan's cooldown begins after the first
    epoch at the earliest (the rate would otherwise rise again where the second plan moves
    it: `fraction > 1 - 1 / max_epochs`). A cooldown the new plan would have begun already
    begins now, shorter. The number of epochs planned does not depend on `steps_per_epoch`.

    Args:
        epoch_seconds: list of float, the wall time of every epoch trained so far.
        minutes: float, the time budget.
        max_epochs: int, the most epochs the run may train (`epochs`).
        steps_per_epoch: int, updates per epoch.
        fraction: float in (0, 1], the cooldown's share of the run's updates.

    Returns:
        `(epochs, total_steps, cooldown_steps)`: the epochs the run trains, its updates
        and the updates of its cooldown; `cooldown_steps` is `0` when the budget ends the
        run before any cooldown could begin.

    Example:

    >>> plan_cooldown([], 60, max_epochs=30, steps_per_epoch=100, fraction=0.25)
    (30, 3000, 750)
    >>> plan_cooldown([600.0], 60, max_epochs=30, steps_per_epoch=100, fraction=0.25)
    (6, 600, 150)
    >>> plan_cooldown([600.0] * 5 + [900.0], 60, 30, 100, 0.25)  # cooldown began at 4.5
    (6, 600, 150)
    """
    # Before any epoch is timed the plan is `max_epochs` long and made again after the
    # first: a cooldown begins after that epoch at the earliest, so that the rate never
    # rises where the new plan moves it (a run of one epoch has no later plan).
    epochs, replanned_at = max_epochs, min(1, max_epochs - 1)
    for done in range(1, len(epoch_seconds) + 1):
        if done > 1 and done > epochs * (1.0 - fraction):
            break  # the cooldown has begun: the plan stays
        more = max(_epochs_left(epoch_seconds[:done], minutes), 0)
        epochs, replanned_at = max(done, min(max_epochs, done + more)), done
    total = epochs * steps_per_epoch
    # Updates already made keep their rate: a late cooldown begins after them.
    return epochs, total, min(cooldown_steps(fraction, total),
                              total - replanned_at * steps_per_epoch)


class BudgetCooldown(keras.callbacks.Callback):
    """Ends a budgeted run's learning rate at zero: plans its cooldown as it trains.

    A run trained for a time budget does not know its number of updates in advance, so
    the end of a `TransformerSchedule` cooldown (`set_run_length`) is planned after every
    epoch by `plan_cooldown` from the run's epoch times (every attempt's, so a resumed
    run replans the same way), and training stops when the plan ends: past it the rate
    would be zero. `TimeBudget` still stops the run first if later epochs are slower than
    predicted (the cooldown is then cut short). Place it after the `RunHistory` it reads.

    Args:
        schedule: the optimizer's `TransformerSchedule`, made with a cooldown (see
            `learning_rate_schedule`).
        fraction: float in (0, 1], the cooldown's share of the run's updates.
        minutes: float, the time budget.
        run_history: the run's `RunHistory`.
        max_epochs: int or `None`, the most epochs the run may train (its `epochs`).
            Defaults to `None`: `fit`'s `epochs`, which differ from the run's when `fit` is
            only to save a finished run again (the trainer passes its `epochs`).
    """

    def __init__(self, schedule, fraction, minutes, run_history, max_epochs=None):
        super().__init__()
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"`fraction` must be in (0, 1]. Received: {fraction}")
        _check_budget(minutes)
        self.schedule = schedule
        self.fraction = float(fraction)
        self.minutes = float(minutes)
        self.run_history = run_history
        self.max_epochs = max_epochs
        self.planned_epochs = None

    def _plan(self):
        done = len(self.run_history.epoch_seconds)
        epochs, total, cool = plan_cooldown(
            self.run_history.epoch_seconds, self.minutes,
            self.max_epochs or self.params["epochs"], self.params["steps"], self.fraction,
        )
        # A `fit` with no epoch to train (a finished run saved again) says nothing.
        quiet = self.params["epochs"] <= done
        if not cool:  # the budget ends the run now: no update left to cool down
            if self.planned_epochs != epochs and not quiet:
                print(f"Learning-rate cooldown: the {self.minutes:g}-minute budget ends the "
                      f"run after epoch {epochs}, before its cooldown could begin.",
                      flush=True)
        elif (total, cool) != (self.schedule.total_steps, self.schedule.cooldown_steps):
            self.schedule.set_run_length(total, cool)
            if not quiet:
                print(f"Learning-rate cooldown: the {self.minutes:g}-minute budget is "
                      f"predicted to hold {epochs} epoch(s); the rate falls to zero over the "
                      f"last {cool} of {total} updates.", flush=True)
        self.planned_epochs = epochs

    def on_train_begin(self, logs=None):
        if not self.params.get("steps"):
            raise ValueError("`BudgetCooldown` needs `fit` to know its steps per epoch.")
        self._plan()

    def on_epoch_end(self, epoch, logs=None):
        self._plan()
        if epoch + 1 >= self.planned_epochs:
            self.model.stop_training = True
            self.run_history.budget_stop()


def set_dropout_rate(model, rate):
    """Sets the rate of every `keras.layers.Dropout` in use in `model`, nested ones too.

    "In use" means made with a rate > 0: a `Dropout` made with rate 0 (the feed-forward
    layer's inner one by default, not in the paper) stays off, and Keras gave it no random
    state to draw masks from anyway. A `fit` already under way keeps the rates its train
    function was traced with: make it again (`model.make_train_function(force=True)`), as
    `LateDropout` does.

    Args:
        model: a `keras.Model` (or layer).
        rate: float in (0, 1), the new rate.

    Returns:
        int, the number of `Dropout` layers changed.
    """
    dropouts = [layer for layer in model._flatten_layers(include_self=False)
                if isinstance(layer, keras.layers.Dropout) and layer.rate > 0]
    for layer in dropouts:
        layer.rate = float(rate)
    return len(dropouts)


class LateDropout(keras.callbacks.Callback):
    """Raises every dropout rate of the model from a given epoch on ("late dropout").

    A model that overfits its data learns fastest with little dropout and generalizes
    better with more once it has learned (Liu et al., 2023, "Dropout Reduces
    Underfitting": late dropout). From epoch `epoch` (0-based, as `fit` counts) on, every
    `Dropout` in use (`set_dropout_rate`) gets `rate` and the train function is made again,
    so the steps use it (a traced step keeps the rates it was traced with). The switch costs
    BLEU for a few epochs before it pays (measured on Multi30K, RESULTS.md), so with
    `min_epochs` it happens only in a run planned, after its first `epoch` epochs, to last
    at least `min_epochs`: `planned_epochs(epoch)` says how long (say, what a time budget
    predicted then, from the epoch times in `history.json`). The decision depends only on
    those, so a run resumed past `epoch` decides as it did (unless resumed with another
    time budget or `epochs`, which the trainer warns of), and gets `rate` from its first
    epoch if it switched. A run shorter than `epoch + 1` epochs is unaffected. Only
    training changes: inference never drops.

    Args:
        rate: float in (0, 1), the rate from epoch `epoch` on.
        epoch: int >= 0, the first epoch (0-based) trained with `rate`.
        min_epochs: int, switch only if the run is planned to last at least this many
            epochs. Defaults to `0` (always).
        planned_epochs: callable `(epochs_done) -> int`, the run's planned length after
            `epochs_done` epochs; needed when `min_epochs` is set. Defaults to `None`.

    References:
        Liu et al., 2023, "Dropout Reduces Underfitting", ICML.
    """

    def __init__(self, rate, epoch, min_epochs=0, planned_epochs=None):
        super().__init__()
        if not 0.0 < rate < 1.0:
            raise ValueError(f"The late dropout `rate` must be in (0, 1). Received: {rate}")
        if epoch < 0:
            raise ValueError(f"The late dropout `epoch` must be >= 0. Received: {epoch}")
        if min_epochs and planned_epochs is None:
            raise ValueError("`min_epochs` needs `planned_epochs`, the run's planned length.")
        self.rate = float(rate)
        self.epoch = int(epoch)
        self.min_epochs = int(min_epochs)
        self.planned_epochs = planned_epochs
        self.decided = False

    def on_epoch_begin(self, epoch, logs=None):
        if self.decided or epoch < self.epoch:
            return
        self.decided = True
        if self.min_epochs:
            planned = self.planned_epochs(self.epoch)
            if planned < self.min_epochs:
                print(f"Late dropout: not applied, the run is planned to last {planned} "
                      f"epoch(s), fewer than {self.min_epochs}.", flush=True)
                return
        if not set_dropout_rate(self.model, self.rate):
            raise ValueError("Late dropout needs a model with dropout in use (a rate > 0) to "
                             "raise: this one has none.")
        self.model.make_train_function(force=True)
        print(f"Late dropout: every Dropout layer's rate is {self.rate:g} from epoch "
              f"{self.epoch + 1} on.", flush=True)


class EpochCheckpoints(keras.callbacks.Callback):
    """Saves the model's weights after every epoch and keeps the last `keep` of them.

    The files (`epoch-NNN.weights.npz`, the arrays of `model.get_weights()` in order,
    without optimizer state) are what checkpoint averaging reads (`average_checkpoints`,
    `keras-transformer average`): Vaswani et al. (2017) average the last 5 checkpoints of
    their base models.

    Numbering, decided when a `fit` begins its first epoch:
    - it begins at epoch 0 with a model that has trained (its optimizer has taken steps)
      and the directory holds checkpoints: "train some more", numbered after the newest;
    - otherwise the number is the epoch's own: a run resumed at epoch E (`initial_epoch`,
      a restored backup) first removes the checkpoints after E, which a process killed
      before its backup wrote (and a new model, at epoch 0 with an untrained optimizer,
      removes an earlier run's, saying so), so that an average never mixes them in.

    Args:
        directory: string, where the files go (e.g. `<run>/checkpoints`).
        keep: int, how many of the latest epochs to keep (older files are deleted).

    Example:

    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> x, y = np.ones((8, 2)), np.ones((8, 1))
    >>> _ = model.fit(x, y, epochs=3, verbose=0,
    ...               callbacks=[EpochCheckpoints("run/checkpoints", keep=2)])
    >>> sorted(os.listdir("run/checkpoints"))
    ['epoch-002.weights.npz', 'epoch-003.weights.npz']
    """

    def __init__(self, directory, keep):
        super().__init__()
        if keep < 1:
            raise ValueError(f"`keep` must be >= 1. Received: keep={keep}")
        self.directory = str(directory)
        self.keep = keep
        self._offset = None

    def on_train_begin(self, logs=None):
        self._offset = None

    def on_epoch_begin(self, epoch, logs=None):
        if self._offset is None:
            self._number_from(epoch)

    def _number_from(self, epoch):
        """Decides this fit's numbering at its first epoch (see the class docstring)."""
        found = numbered_epoch_checkpoints(self.directory)
        optimizer = getattr(self.model, "optimizer", None)
        trained = optimizer is not None and int(optimizer.iterations) > 0
        if epoch == 0 and trained and found:
            self._offset = found[-1][0]
            return
        self._offset = 0
        removed = drop_epoch_checkpoints_after(self.directory, epoch)
        if removed and not epoch:
            logger.warning("EpochCheckpoints: a new model's first epoch; removed the %d "
                           "checkpoint(s) of an earlier run in %s.", len(removed),
                           self.directory)

    def on_epoch_end(self, epoch, logs=None):
        if self._offset is None:
            self._number_from(epoch)
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, EPOCH_CHECKPOINT_PATTERN.format(
            epoch=epoch + 1 + self._offset))
        weights = [np.asarray(w) for w in self.model.get_weights()]
        # The partial name ends in .npz, which np.savez would otherwise add.
        replace_atomically(path, lambda temporary: np.savez(temporary, *weights))
        for old in epoch_checkpoints(self.directory)[: -self.keep]:
            os.remove(old)


def drop_epoch_checkpoints_after(directory, epochs):
    """Removes the `EpochCheckpoints` files in `directory` of epochs after `epochs` (those a
    process killed before its backup wrote: the resumed run trains those epochs again);
    returns their paths."""
    removed = [path for epoch, path in numbered_epoch_checkpoints(directory) if epoch > epochs]
    for path in removed:
        os.remove(path)
    return removed


def make_callbacks(
    output_dir,
    bleu_callback=None,
    best_monitor=None,
    best_mode=None,
    save_weights_only=False,
    tensorboard_update_freq="epoch",
    backup_save_freq="epoch",
    tensorboard=None,
    keep_checkpoints=0,
    run_history=None,
    time_budget_minutes=None,
    cooldown_schedule=None,
    cooldown_fraction=0.0,
    max_epochs=None,
    final_model_path=None,
    seed=None,
    resume_epoch=None,
    initial_epoch=None,
    before_backup_delete=None,
    more_callbacks=None,
):
    """The standard callbacks of a run, in the order `fit` must see them.

    - `DropoutSeeds(seed)`, if `seed` is given, then `bleu_callback` (if given), so
      `val_bleu` is in the epoch logs the others see;
    - `ModelSaver` saving the latest model every epoch to
      `<output_dir>/checkpoints/last.keras` (or `last.weights.h5`; its epoch in
      `last.keras.json`, a later epoch's dropped as a resumed run begins), plus, if
      `best_monitor` is set (e.g. `"val_loss"` or `"val_bleu"`), the best one to
      `checkpoints/best.keras` (a resumed run's earlier epochs in `run_history` count);
      every save atomic;
    - `EpochCheckpoints` keeping the last `keep_checkpoints` epochs' weights in
      `checkpoints/epoch-NNN.weights.npz` (for checkpoint averaging), if asked;
    - `TensorBoard` writing under `<output_dir>/logs` (when the `tensorboard` package is
      installed: TensorFlow 2.21 no longer depends on it);
    - `run_history` (a `RunHistory`), if given, then a `TimeBudget` reading it if
      `time_budget_minutes` is set, and a `BudgetCooldown` if `cooldown_fraction` is too;
    - `more_callbacks` (the trainer's late dropout and multi-worker `StopTogether`, and a
      user's own), which see every epoch's logs (`val_bleu` too) and the budget's stop,
      and end before the final save: what they do when `fit` ends
      (`EarlyStopping(restore_best_weights=True)` restores the best epoch's weights) is
      what the final model holds; then `RecordStop` (with `run_history`), recording a stop
      they decided before the epoch's backup;
    - `FinalModelSaver(final_model_path)`, if given: the trained model, saved when `fit`
      ends, before the backup is deleted (with the record of its epochs, given a
      `run_history`);
    - `AtomicBackupAndRestore` under `<output_dir>/backup`, last, so it backs up an epoch
      only after everything else has handled it; its restore is first (`BackupRestorer`),
      so every callback's `on_train_begin` sees the restored state. Rerunning the same `fit` call after the
      process was killed restores the weights, the optimizer state (step count, Adam
      moments) and the epoch, and continues from the last completed epoch. The backup is
      deleted when training finishes.

    Args:
        output_dir: string, the run directory.
        bleu_callback: a `BleuCallback` or `None`. Defaults to `None`.
        best_monitor: string or `None`, a logged quantity to keep the best checkpoint by.
            Defaults to `None` (keep only the latest).
        best_mode: string or `None`, `"auto"`, `"min"` or `"max"` for `best_monitor`.
            `None` means `"auto"` (`ModelSaver`'s: max for accuracies and BLEU, else
            min). Defaults to `None`.
        save_weights_only: bool, save `.weights.h5` instead of `.keras` files.
            Defaults to `False`.
        tensorboard_update_freq: `"epoch"`, `"batch"` or int, how often TensorBoard
            writes. Defaults to `"epoch"`.
        backup_save_freq: `"epoch"` or int (batches), how often to back up.
            Defaults to `"epoch"`, the only one that resumes exactly: a run resumed from
            a backup made inside an epoch restarts that epoch at its first batch, with
            weights that have trained on the batches before the backup (trained twice).
        tensorboard: bool or `None`, add the `TensorBoard` callback; `None` adds it if
            the `tensorboard` package is installed (and logs a warning if not); `True`
            raises if it is missing. Defaults to `None`.
        keep_checkpoints: int, keep this many epochs' weights for averaging; `0` adds
            no `EpochCheckpoints`. Defaults to `0`.
        run_history: a `RunHistory` or `None`. Defaults to `None`.
        time_budget_minutes: float or `None`, stop training before an epoch that would
            end after this many minutes (see `TimeBudget`; needs `run_history`).
            Defaults to `None`.
        cooldown_schedule: the run's `TransformerSchedule` (made with a cooldown) or
            `None`; needed with `cooldown_fraction`. Defaults to `None`.
        cooldown_fraction: float, with `time_budget_minutes`, plan the cooldown of
            `cooldown_schedule` over this share of the updates the budget is predicted to
            hold (see `BudgetCooldown`); `0` plans nothing. Defaults to `0.0`.
        max_epochs: int or `None`, the run's `epochs`, which bound that plan (see
            `BudgetCooldown`). Defaults to `None`: `fit`'s.
        final_model_path: str or `None`, where to save the trained model when `fit` ends
            (atomically, before the backup is deleted). Defaults to `None`.
        seed: int or `None`, the run's seed, from which `DropoutSeeds` sets the dropout
            random state at every epoch (so a resumed run draws the same masks); `None`
            adds no `DropoutSeeds`. Defaults to `None`.
        resume_epoch: int or `None`, the backed-up epoch to resume after when it is not the
            latest (`AtomicBackupAndRestore`). Defaults to `None`.
        initial_epoch: int or `None`, the epoch the run resumes after (`fit`'s
            `initial_epoch`); with `best_monitor`, a best model recorded for a later epoch
            is dropped (see `ModelSaver`). Defaults to `None`.
        before_backup_delete: callable or `None`, run when training ends, after the final
            model is saved and before the backup is deleted (a cluster's barrier; see
            `AtomicBackupAndRestore`). Defaults to `None`.
        more_callbacks: list of `keras.callbacks.Callback` or `None`, placed after the
            run's own callbacks of every epoch, before the final save and the backup.
            Defaults to `None`.

    Returns:
        A list of `keras.callbacks.Callback`.

    Example:

    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> x, y = np.ones((8, 2)), np.ones((8, 1))
    >>> callbacks = make_callbacks("run2", best_monitor="val_loss", tensorboard=False)
    >>> _ = model.fit(x, y, validation_data=(x, y), epochs=1, verbose=0,
    ...               callbacks=callbacks)
    >>> sorted(os.listdir("run2/checkpoints"))
    ['best.keras', 'best.keras.json', 'last.keras', 'last.keras.json']
    """
    suffix = _WEIGHTS_SUFFIX if save_weights_only else _MODEL_SUFFIX
    checkpoint_dir = os.path.join(output_dir, "checkpoints")
    os.makedirs(checkpoint_dir, exist_ok=True)
    callbacks = [] if seed is None else [DropoutSeeds(seed)]
    if bleu_callback is not None:
        callbacks.append(bleu_callback)
    callbacks.append(ModelSaver(os.path.join(checkpoint_dir, "last" + suffix),
                                initial_epoch=initial_epoch))
    if best_monitor is not None:
        callbacks.append(ModelSaver(
            os.path.join(checkpoint_dir, "best" + suffix), monitor=best_monitor,
            mode=best_mode or "auto",
            earlier=[] if run_history is None else run_history.history.get(best_monitor, []),
            initial_epoch=initial_epoch))
    if keep_checkpoints:
        callbacks.append(EpochCheckpoints(checkpoint_dir, keep_checkpoints))
    tensorboard_installed = importlib.util.find_spec("tensorboard") is not None
    if tensorboard and not tensorboard_installed:
        raise ValueError("`tensorboard=True` but the `tensorboard` package is not installed.")
    if tensorboard is None and not tensorboard_installed:
        logger.warning("The `tensorboard` package is not installed: no TensorBoard logs.")
    if tensorboard_installed and tensorboard is not False:
        callbacks.append(
            keras.callbacks.TensorBoard(
                log_dir=os.path.join(output_dir, "logs"),
                update_freq=tensorboard_update_freq,
                profile_batch=0,
            )
        )
    if run_history is not None:
        callbacks.append(run_history)
    if time_budget_minutes is not None:
        if run_history is None:
            raise ValueError("`time_budget_minutes` needs a `run_history` to read.")
        callbacks.append(TimeBudget(time_budget_minutes, run_history))
        if cooldown_fraction:
            callbacks.append(BudgetCooldown(
                cooldown_schedule, cooldown_fraction, time_budget_minutes, run_history,
                max_epochs=max_epochs))
    elif cooldown_fraction:
        raise ValueError("`cooldown_fraction` is planned within a `time_budget_minutes`.")
    callbacks.extend(more_callbacks or ())
    if run_history is not None:
        callbacks.append(RecordStop(run_history))
    if final_model_path is not None:
        callbacks.append(FinalModelSaver(final_model_path, run_history=run_history))
    backup = AtomicBackupAndRestore(
        os.path.join(output_dir, "backup"), save_freq=backup_save_freq,
        resume_epoch=resume_epoch, before_delete=before_backup_delete)
    return [BackupRestorer(backup)] + callbacks + [backup]

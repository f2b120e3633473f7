"""One training run end to end: data, tokenizers, model, `model.fit` under a strategy.

The run directory layout is the contract with export (see `keras_transformer/export/run.py`):
`config.json`, `data_report.json`, `tokenizer/`, `checkpoints/{last,best}.keras` (and
`checkpoints/epoch-NNN.weights.npz` with `keep_checkpoints`), `logs/`, `backup/` (while
training), `model.keras` (and `model.keras.json`, the epochs it holds), `history.json` (every
epoch's logs and time, over all attempts).
"""

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import logging
import math
import os
import pathlib
import shutil
import sys
import time
import zlib

import keras
import numpy as np
import tensorflow as tf

from keras_transformer.data import compare_padding, make_translation_dataset
from keras_transformer.data.preparation import (
    CACHE_MAX_PAIRS,
    data_file_stats,
    open_run_source,
    prepare_data_report,
)
from keras_transformer.data.readers import write_json_atomically
from keras_transformer.model import build_transformer
from keras_transformer.text import load_tokenizers, train_tokenizers
from keras_transformer.text.subword_sampling import SegmentationSampler
from keras_transformer.textfiles import file_digest, is_partial, remove_stale_partials
from keras_transformer.training.callbacks import (
    BleuCallback,
    LateDropout,
    RunHistory,
    StopTogether,
    backup_epochs,
    drop_epoch_checkpoints_after,
    make_callbacks,
    plan_cooldown,
    predicted_epoch_seconds,
    read_backup_metadata,
    read_final_model_epochs,
    read_run_history,
    time_budget_reached,
)
from keras_transformer.training.losses import MaskedSparseCategoricalCrossentropy
from keras_transformer.training.metrics import MaskedAccuracy
from keras_transformer.training.optimizers import learning_rate_schedule, make_optimizer
from keras_transformer.training.presets import TrainingConfig, resolve_precision
from keras_transformer.training.schedules import cooldown_multiplier, cooldown_steps
from keras_transformer.training.strategy import (
    CLUSTER_TIMEOUT_MINUTES,
    WORKER_TEMP_PREFIX,
    cluster_from_tf_config,
    fix_keras_multi_worker_logs,
    gather_from_workers,
    is_chief,
    num_workers_from_tf_config,
    select_strategy,
    shard_by_data,
    slowest_worker,
    task_of,
    worker_barrier,
    worker_write_dir,
)

logger = logging.getLogger(__name__)

# Validation sentences translated per call while computing BLEU (one progress-bar step).
_BLEU_BATCH_SIZE = 64


@dataclasses.dataclass
class TrainingRun:
    """What `train` returns: the trained model, its tokenizers and where things are.

    On a worker of a cluster whose disk holds nothing of a run another worker holds
    finished (no shared filesystem), `model` is `None` and nothing was trained.
    """

    model: keras.Model
    source_tokenizer: object
    target_tokenizer: object
    config: object
    output_dir: pathlib.Path
    history: dict
    train_seconds: float
    # Epochs this call trained (0: the run was already finished).
    epochs_trained: int = 0


def _pairs(dataset, source_lang, target_lang, limit=None):
    """Python lists `(sources, references)` of a split of `{lang: string}` examples."""
    if limit:
        dataset = dataset.take(limit)
    sources, references = [], []
    for example in dataset.as_numpy_iterator():
        sources.append(example[source_lang].decode("utf-8"))
        references.append(example[target_lang].decode("utf-8"))
    return sources, references


# Next to the vocabulary: the training files it was made from (`prepare_tokenizers`).
_TRAINED_ON = "trained_on.json"


def _files_record(data_files):
    """`{path: {"stat": [size, mtime_ns], "digest": ...}}` of `data_files`' paths, each
    stat taken just before its digest (a file written meanwhile is seen as changed)."""
    record = {}
    for path in data_files:
        status = os.stat(path)
        record[path] = {"stat": [status.st_size, status.st_mtime_ns],
                        "digest": file_digest(path)}
    return record


def _vocabulary_is_current(record_path, data_files):
    """Whether the vocabulary beside `record_path` was made from `data_files`' content, and
    a message saying why not. Files only touched (the same bytes) are current; their new
    times are written to the record, so they are not hashed again."""
    if not record_path.is_file():
        return False, ("the training files it was trained on is not recorded (a start "
                       "stopped before the record, or a run of an earlier version)")
    try:
        record = json.loads(record_path.read_text())
        if not isinstance(record, dict) or not all(
                isinstance(entry, dict) for entry in record.values()):
            raise ValueError("not a record of files")
    except ValueError as error:
        return False, f"{record_path} cannot be read ({error})"
    gone = sorted(set(record) ^ set(data_files))
    if gone:
        return False, f"{gone[0]} is not among the files it was trained on, or was removed"
    touched = False
    for path, stat in sorted(data_files.items()):
        if list(stat) == record[path].get("stat"):
            continue
        try:
            if file_digest(path) != record[path].get("digest"):
                return False, f"{path} changed since it was trained on it"
        except OSError as error:
            return False, f"{path} cannot be read ({error})"
        record[path]["stat"], touched = list(stat), True
    if touched:
        write_json_atomically(record_path, record)
    return True, ""


def vocabulary_digests(source_tokenizer, target_tokenizer):
    """The digests of the tokenizers' `.model` files (one when shared)."""
    return sorted({file_digest(tokenizer.model_path)
                   for tokenizer in (source_tokenizer, target_tokenizer)})


def prepare_tokenizers(config, train_split, output_dir, data_files=None):
    """Loads the run's tokenizers, training them on the train split the first time.

    A vocabulary file that cannot be read (cut short by a kill or a full disk before it
    was written atomically, or in a copy) is trained again while no epoch was trained with
    it; once one was, the model's ids are that vocabulary's pieces, and the run is refused
    with a `ValueError` naming the file.

    `data_files`, `{path: [size, mtime_ns]}` of the local files the train split reads
    (`data_file_stats`), are recorded beside the vocabulary (`tokenizer/trained_on.json`).
    While no epoch was trained, a vocabulary whose files have other content now (a first
    start stopped after its vocabulary, then the user replaced the files), or whose record
    is missing or unreadable, is trained again, and the run says why. (Once an epoch was,
    the data report refuses changed files: `prepare_data_report`.)
    """
    output_dir = pathlib.Path(output_dir)
    directory = output_dir / "tokenizer"
    try:
        tokenizers = load_tokenizers(directory)
        current, why = True, ""
        if data_files and not _trained_files(output_dir):
            current, why = _vocabulary_is_current(directory / _TRAINED_ON, data_files)
        if current:
            logger.info("Reusing the tokenizer in %s", directory)
            return tokenizers
        print(f"The vocabulary in {directory} is trained again: {why}, and no epoch was "
              "trained with it.", flush=True)
    except FileNotFoundError:
        pass
    except (RuntimeError, ValueError) as error:
        # SentencePiece cannot parse the file, or reads a model cut short before its
        # settings with other reserved ids (`check_reserved_ids`).
        files = " and ".join(str(path) for path in sorted(directory.glob("*.model"))
                             if not path.name.startswith("."))  # not a write's partial file
        trained = _trained_files(output_dir)
        if trained:
            listed = ", ".join(str(path) for path in trained[:3])
            raise ValueError(
                f"{files} cannot be read ({error}), and epochs were trained with it "
                f"({listed}): the model's ids are its pieces, so it is not trained again. Put "
                "back a copy of it (an export of the run holds one in its assets/), or start "
                "over with --overwrite.") from None
        print(f"{files} cannot be read ({error}); no epoch was trained with it: the "
              "vocabulary is trained again.", flush=True)
    started = time.time()
    # Taken before training: a file written meanwhile is seen as changed next time. The old
    # record goes first: a kill before the new one leaves none (trained again), never the
    # old one beside the new vocabulary.
    record = _files_record(data_files) if data_files else None
    (directory / _TRAINED_ON).unlink(missing_ok=True)
    source_lang, target_lang = run_languages(config)
    # One pass over the training data, then SentencePiece: minutes on a large corpus.
    print(f"Training a {config.vocab_size}-piece vocabulary on a sample of at most "
          f"{config.tokenizer_sample_pairs:,} training pairs...", flush=True)
    tokenizers = train_tokenizers(
        train_split,
        source_lang,
        target_lang,
        vocab_size=config.vocab_size,
        shared=config.shared_vocabulary,
        output_dir=directory,
        max_pairs=config.tokenizer_sample_pairs,
        seed=config.seed,
        max_chars=TOKENIZER_SAMPLE_CHARS,
        normalization_rule_name=config.normalization,
        character_coverage=config.character_coverage,
    )
    if data_files:
        write_json_atomically(directory / _TRAINED_ON, record)
    print(f"Trained a {config.vocab_size}-piece {'shared' if config.shared_vocabulary else 'separate'}"
          f" SentencePiece vocabulary in {time.time() - started:.1f}s -> {directory}", flush=True)
    return tokenizers


def _trained_files(run_dir):
    """What epochs trained in `run_dir` left: its final model, backup, history of an epoch
    or more, files under `checkpoints/`; an empty list before the first epoch's end."""
    run_dir = pathlib.Path(run_dir)
    found = [path for path in (run_dir / "model.keras", run_dir / "backup") if path.exists()]
    if read_run_history(run_dir / "history.json")["epochs"]:
        found.append(run_dir / "history.json")
    if (run_dir / "checkpoints").is_dir():
        found.extend(sorted(path for path in (run_dir / "checkpoints").iterdir()
                            if path.is_file()))
    return found


def build_model(config, source_tokenizer, target_tokenizer):
    """`build_transformer` from a `TrainingConfig` and the tokenizers' vocabulary sizes."""
    shared = source_tokenizer is target_tokenizer
    return build_transformer(
        vocab_size=source_tokenizer.vocab_size,
        target_vocab_size=None if shared else target_tokenizer.vocab_size,
        d_model=config.d_model,
        num_heads=config.num_heads,
        ff_dim=config.ff_dim,
        num_layers=config.num_layers,
        num_decoder_layers=config.num_decoder_layers,
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        norm_first=config.norm_first,
        tie_embeddings=config.tie_embeddings,
        max_length=max(config.max_length, 512),
        skip_padding=config.skip_padding,
    )


def compile_model(model, config, jit_compile="auto", total_steps=None):
    """Compiles with the masked label-smoothed loss, masked accuracy and the warm-up Adam
    (`jit_compile` as in `keras.Model.compile`). `total_steps`, the run's number of
    updates, is needed when `config.lr_cooldown` is set."""
    if config.lr_cooldown and not total_steps:
        raise ValueError(
            "`lr_cooldown` needs the run's number of updates (`total_steps`). Received: "
            f"total_steps={total_steps}"
        )
    cooldown = cooldown_steps(config.lr_cooldown, total_steps)
    model.compile(
        optimizer=make_optimizer(
            config.d_model, config.warmup_steps, scale=config.lr_scale,
            total_steps=total_steps if cooldown else None, cooldown_steps=cooldown,
            cooldown_shape=config.lr_cooldown_shape,
            clipnorm=config.clipnorm, global_clipnorm=config.global_clipnorm,
        ),
        loss=MaskedSparseCategoricalCrossentropy(label_smoothing=config.label_smoothing),
        metrics=[MaskedAccuracy()],
        jit_compile=jit_compile,
    )
    return model


def run_languages(config):
    """`(source_lang, target_lang)` of a config: its own, or Multi30K's en->de when it names
    none. `train` records the languages its data source chose in the run's config; a config
    of other data without them has to be opened first (`open_run_source`)."""
    from keras_transformer.data.sources import MULTI30K_DIRECTION

    if config.source_lang and config.target_lang:
        return config.source_lang, config.target_lang
    if config.data == "multi30k":
        return (config.source_lang or MULTI30K_DIRECTION[0],
                config.target_lang or MULTI30K_DIRECTION[1])
    raise ValueError(
        f"data={config.data!r} without source_lang/target_lang: the data source decides them "
        "(open_run_source(config), then config.replace(source_lang=source.source_lang, "
        "target_lang=source.target_lang)).")


def _batching(config, replicas):
    """`make_translation_dataset`'s batching arguments of a run (train and validation)."""
    source_lang, target_lang = run_languages(config)
    return dict(
        max_length=config.max_length,
        batch_size=config.batch_size or 64,
        tokens_per_batch=config.tokens_per_batch,
        bucket_boundaries=config.bucket_boundaries,
        batch_multiple=replicas,
        source_lang=source_lang,
        target_lang=target_lang,
    )


def padding_report(config, train_pairs, source_tokenizer, target_tokenizer, replicas=1,
                   num_batches=30):
    """The padding of a run's own training batches against plain `padded_batch`.

    Measured on the first `num_batches` batches of the run's batching (its token budget
    or batch size, its bucket edges, over-long pairs dropped or truncated as it does), with
    the run's seed; see `compare_padding` (which buckets a run that does not with the
    default edges, to show what bucketing would save).
    """
    return compare_padding(train_pairs, source_tokenizer, target_tokenizer,
                           num_batches=num_batches, seed=config.seed,
                           drop_long=config.drop_long_pairs, **_batching(config, replicas))


def make_datasets(config, splits, source_tokenizer, target_tokenizer, replicas=1,
                  data_report=None):
    """The training and validation `tf.data` pipelines of a run.

    With a `data_report` (see `keras_transformer.data.prepare_data_report`) over-long pairs
    are dropped as the report counted them, each pass declares its number of batches (a
    progress bar with a total), and the tokenized training set is cached in memory only
    when it is small enough (`CACHE_MAX_PAIRS`).
    """
    batching = _batching(config, replicas)
    train = splits["train"]
    if config.train_subset:
        train = train.take(config.train_subset)
    counted = {}
    if data_report is not None:
        batching["drop_long"] = config.drop_long_pairs
        counted = data_report.batches
    train_ds = make_translation_dataset(
        train, source_tokenizer, target_tokenizer, shuffle=True, seed=config.seed,
        repeat=config.steps_per_epoch is not None, num_batches=counted.get("train"),
        cache=data_report is None or data_report.kept("train") <= CACHE_MAX_PAIRS,
        **batching,
    )
    val_ds = None
    if splits.get("validation") is not None:
        val_ds = make_translation_dataset(
            splits["validation"], source_tokenizer, target_tokenizer, shuffle=False,
            num_batches=counted.get("validation"),
            cache=data_report is None or data_report.kept("validation") <= CACHE_MAX_PAIRS,
            **batching,
        )
    return train, train_ds, val_ds


# Config fields a resumed or continued run may change: neither the data nor the model
# depends on them. A cooldown's plan and late dropout's decision do (`resume_plan_warning`).
RESUMABLE_FIELDS = ("epochs", "keep_checkpoints", "time_budget_minutes")
# What the run's vocabulary (`prepare_tokenizers`) is made from: until an epoch is trained
# every other field may change (the data report is counted again when its settings do).
VOCABULARY_FIELDS = ("vocab_size", "shared_vocabulary", "normalization", "character_coverage",
                     "data", "data_files", "source_lang", "target_lang",
                     "tokenizer_sample_pairs", "train_subset", "seed")
# A run directory holds these (written by `train`); a directory without any of them is
# not a run directory (see `is_run_directory`).
RUN_MARKERS = ("config.json", "history.json", "model.keras", "backup", "tokenizer")
# Mixes the epoch into the shuffle seed: epoch e shuffles with seed + e * this prime.
_EPOCH_SEED_STRIDE = 1_000_003


class ConfigMismatchError(ValueError):
    """A run directory was trained with another configuration than the one given."""


class RunInUseError(ValueError):
    """Another process is training into the run directory."""


# Run directories this process holds: {real path: (descriptor, depth)}.
_HELD_RUNS = {}


@contextlib.contextmanager
def hold_run_directory(path):
    """Holds `path` (created if missing) for one training process while the block runs.

    Two processes training into one directory would overwrite each other's checkpoints,
    history and backup, and `--overwrite` would delete a running run's files under it.
    The lock is the kernel's `flock` on the directory itself: no lock file to leave
    behind, and a process that dies, however it dies, releases it (so a machine or pod
    restarted with another host name and process id never finds a stale lock). The same
    process may take it again (the command line holds it around `train`, which takes it
    too). A filesystem without `flock` on directories (some network filesystems) is
    trained into unlocked, with a warning.

    Args:
        path: path-like, the run directory.

    Raises:
        RunInUseError: if another process holds it.
    """
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(path)
    if key in _HELD_RUNS:
        descriptor, depth = _HELD_RUNS[key]
        _HELD_RUNS[key] = (descriptor, depth + 1)
    else:
        descriptor = os.open(key, os.O_RDONLY)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(descriptor)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise RunInUseError(
                    f"Another process is training into {path}: wait for it to end, or "
                    "choose another --output.") from None
            logger.warning("Cannot lock %s (%s): nothing stops another process from "
                           "training into it meanwhile.", path, error)
            descriptor = None  # unlocked, and said once: held without a descriptor
        _HELD_RUNS[key] = (descriptor, 1)
    try:
        yield
    finally:
        descriptor, depth = _HELD_RUNS[key]
        if depth > 1:
            _HELD_RUNS[key] = (descriptor, depth - 1)
        else:
            del _HELD_RUNS[key]
            if descriptor is not None:
                os.close(descriptor)  # releases the lock


def is_run_directory(path):
    """Whether `path` is a directory `train` wrote (so `--overwrite` may delete it): its
    `config.json` and another of `RUN_MARKERS`, or nothing but the `config.json` that
    `train` writes first (every `TrainingConfig` field: what a run that failed before its
    vocabulary leaves; a hand-written config names only some fields)."""
    path = pathlib.Path(path)
    if not (path.is_dir() and (path / "config.json").is_file()):
        return False
    if any((path / name).exists() for name in RUN_MARKERS if name != "config.json"):
        return True
    if _own_entries(path) != ["config.json"]:
        return False
    try:
        values = json.loads((path / "config.json").read_text())
    except (ValueError, OSError):
        return False
    fields = {field.name for field in dataclasses.fields(TrainingConfig)}
    return isinstance(values, dict) and set(values) == fields


def _own_entries(path):
    """Sorted names in a run directory, other workers' private directories left out (a
    worker of a failed multi-worker start leaves its own beside the chief's files), and
    partial files of atomic writes (a kill while `train` or `--overwrite` wrote
    `config.json` leaves one; `train` removes those of processes no longer running)."""
    return sorted(entry.name for entry in pathlib.Path(path).iterdir()
                  if not entry.name.startswith(WORKER_TEMP_PREFIX) and not is_partial(entry.name))


def _check_new_run_directory(path):
    """Refuses to start a run among files `train` did not write: `--overwrite` would later
    take the directory for a run and delete them with it."""
    others = _own_entries(path)
    if others and not is_run_directory(path):
        listed = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
        raise ValueError(
            f"{path} holds other files ({listed}) and is not a run of `train`: choose an "
            "empty or new --output directory.")


def _saved_config(run_dir):
    """The `TrainingConfig` of `run_dir`'s `config.json`, or `None` without one."""
    path = pathlib.Path(run_dir) / "config.json"
    if not path.is_file():
        return None
    return TrainingConfig.from_dict(json.loads(path.read_text()))


def check_resumable(config, run_dir):
    """Refuses to resume or continue `run_dir` with a different configuration.

    Args:
        config: `TrainingConfig`, the configuration asked for now.
        run_dir: path-like, a run directory (without `config.json`, or with nothing else
            from a start that failed before its vocabulary, nothing is checked).

    Until an epoch is trained (`_trained_files`), only the fields the vocabulary on disk
    was made from (`VOCABULARY_FIELDS`) must stay: a start cut short, or refused after its
    vocabulary (too many pairs for subword sampling), is started again with other settings.

    Raises:
        ConfigMismatchError: listing every field that differs, except those in
            `RESUMABLE_FIELDS` (and, before the first epoch, those not in
            `VOCABULARY_FIELDS`).
    """
    path = pathlib.Path(run_dir) / "config.json"
    if not path.is_file():
        return
    if _own_entries(path.parent) == ["config.json"] and is_run_directory(path.parent):
        return  # a start that failed before its vocabulary: nothing trained to keep
    saved = type(config).from_dict(json.loads(path.read_text())).to_dict()
    current = config.to_dict()
    for name in ("source_lang", "target_lang"):
        if current[name] is None:  # the same data source chooses them as it did for the run
            current[name] = saved[name]
    differing = [
        name for name in current if name not in RESUMABLE_FIELDS and saved[name] != current[name]
    ]
    if differing and not _trained_files(path.parent):
        differing = [name for name in differing if name in VOCABULARY_FIELDS]
    if differing:
        lines = "\n".join(
            f"  {name}: {saved[name]!r} in the run, {current[name]!r} now" for name in differing
        )
        raise ConfigMismatchError(
            f"{run_dir} was trained with a different configuration:\n{lines}\n"
            f"Only {', '.join(RESUMABLE_FIELDS)} may change when resuming or continuing a "
            "run. Use the run's own settings (leave out --preset and --config to continue with "
            "them), another output directory, or --overwrite to start over (from Python: "
            "delete the directory)."
        )


def _latest_backup_epoch(write_dir):
    """Epochs the `BackupAndRestore` state covers, or `None` without a backup."""
    metadata = read_backup_metadata(pathlib.Path(write_dir) / "backup")
    return None if metadata is None else int(metadata["epoch"])


def _finished_after_backup(write_dir, output_dir=None):
    """Whether the run's `model.keras` was saved after `write_dir`'s backup: a process
    killed between the final save and the backup's removal finished its run (resuming from
    the backup would train nothing while the other workers, finding the run finished, left).
    The model is `write_dir`'s, or, for a worker other than the chief (which never writes
    one), the chief's in `output_dir` where every worker sees it: the chief killed after its
    final save, before the workers' barrier, left the others' backups in place.

    Told by epochs: the model's record (`read_final_model_epochs`) against the backup's. A
    continued run's backup is of later epochs than its old model, which a copy without file
    times (`cp -r`) can make look newer: deleting the backup then lost those epochs. Only a
    model without a record (saved before records were written) is compared by file time.
    """
    model, record = write_dir / "model.keras", write_dir / "backup" / "training_metadata.json"
    if not model.is_file() and output_dir is not None:
        model = pathlib.Path(output_dir) / "model.keras"
    if not (model.is_file() and record.is_file()):
        return False
    model_epochs = read_final_model_epochs(model)
    if model_epochs is not None:
        return model_epochs >= _latest_backup_epoch(write_dir)
    return model.stat().st_mtime_ns >= record.stat().st_mtime_ns


# The workers compare their settings as one digest, and as this many digests of the
# settings grouped by name (`_bucket`), so that a refusal can name what differs (a few
# candidates a bucket) with rows of one length whatever the settings.
_SETTING_BUCKETS = 32


def _bucket(name):
    return zlib.crc32(name.encode()) % _SETTING_BUCKETS


def _setting_buckets(settings):
    """`_SETTING_BUCKETS` digests of `settings` (a dict), each of the fields of a bucket."""
    groups = [{} for _ in range(_SETTING_BUCKETS)]
    for name, value in settings.items():
        groups[_bucket(name)][name] = value
    return [_short_hash(group) for group in groups]


def _short_hash(value):
    """A JSON-able value's digest as an integer below 2**48 (exact in a float64)."""
    text = json.dumps(value, sort_keys=True, default=str)
    return int(hashlib.blake2b(text.encode(), digest_size=6).hexdigest(), 16)


class RunFinishedElsewhere(Exception):
    """Another worker holds the finished run (`agree_with_workers`): nothing to train."""


def agree_with_workers(strategy, config, data_report, initial_epoch, write_dir,
                       restartable=True, failure=None, finished=False, vocabulary=()):
    """The epoch every worker resumes after; refuses workers that would train apart.

    Every worker of a cluster runs this at the same point (a collective op), with its own
    settings, data and backup. Workers with other settings (`--set`, `--preset`) or other
    data (other counts, other file contents) would train different models in lockstep, or
    fail deep in a collective op; they are refused, every worker with the same message.
    Workers whose backups are one epoch apart (one killed between the others' backup and
    its own) resume after the earlier epoch, which each still holds (or, `restartable`,
    start again from the seeded weights: epoch 0); a worker with no backup of it (its disk
    was lost) is refused with what to do.

    Args:
        restartable: bool, whether this worker may start again from epoch 0 (not a
            finished run it continues from its final model).
        failure: the exception this worker stopped with before the agreement, or `None`:
            it takes part, then raises it; the others stop too, saying which worker failed.
        finished: bool, this worker holds the run finished (nothing to train): it takes
            part, and the workers that do not (their disk holds nothing of the run) stop
            with `RunFinishedElsewhere` rather than wait for it in a collective.
        vocabulary: the digests of this worker's vocabulary files (`vocabulary_digests`):
            workers that trained or kept other vocabularies are refused as other data.

    Returns:
        int, the epoch to resume after (`initial_epoch` outside a cluster).

    Raises:
        ValueError: workers that disagree, naming them.
        RunFinishedElsewhere: another worker holds the run finished.
    """
    if task_of(strategy)[0] is None:
        if failure is not None:
            raise failure
        return initial_epoch
    # This worker's row: [failed, settings, data, restartable, latest epoch, previous or -1].
    if failure is not None:
        row = [1, 0, 0, 0, -1, -1] + [0] * _SETTING_BUCKETS
    elif finished:
        row = [2, 0, 0, 0, initial_epoch, -1] + [0] * _SETTING_BUCKETS
    else:
        settings = {k: v for k, v in config.to_dict().items() if k != "data_files"}
        # "auto" resolves from each machine's CPU: what counts is what this worker computes in.
        settings["precision"] = resolve_precision(config.precision)
        # What each split holds, not where from (the files may sit elsewhere on each machine),
        # nor how many pairs were cut (a report reused from before that count existed has
        # none; the cut pairs are in `kept` either way).
        data = [{split: {k: v for k, v in counts.items() if k not in ("origin", "truncated")}
                 for split, counts in data_report.splits.items()},
                data_report.batches, sorted(data_report.digests.values()), sorted(vocabulary)]
        epochs = backup_epochs(read_backup_metadata(pathlib.Path(write_dir) / "backup"))
        epochs = epochs or [initial_epoch]
        row = [0, _short_hash(settings), _short_hash(data), int(restartable)] + (
            epochs + [-1])[:2] + _setting_buckets(settings)
    rows = gather_from_workers(strategy, row)
    if failure is not None:
        raise failure
    # One row per replica: a worker with several devices has several of the same rows.
    per_worker = max(len(rows) // (num_workers_from_tf_config() or len(rows)), 1)
    rows = rows[::per_worker]
    workers = _worker_names(len(rows))
    failed = [w for w, row in zip(workers, rows) if row[0] == 1]
    if failed:
        raise ValueError(f"{', '.join(failed)} stopped before training (its own message says "
                         "why): every worker stops; mend it and start them all again.")
    done = [(w, int(row[4])) for w, row in zip(workers, rows) if row[0] == 2]
    if finished:
        return initial_epoch
    if done:
        raise RunFinishedElsewhere(f"{done[0][0]} holds the finished run ({done[0][1]} "
                                   "epoch(s))")
    buckets = [row[6:] for row in rows]
    rows = [[row[1], row[2]] + row[4:6] + ([0] if row[3] else []) for row in rows]
    same_settings = "run the same --preset, --config and --set on every worker"
    if config.precision == "auto":
        same_settings += ("; precision 'auto' resolves from each machine's CPU (bfloat16 where "
                          "it computes it natively): on machines that differ, set the "
                          "precision (--mixed-precision)")
    for column, what in ((0, f"settings ({same_settings})"),
                         (1, "data (the same files, with the same content, and the same "
                             "vocabulary)")):
        differ = [i for i, row in enumerate(rows) if row[column] != rows[0][column]]
        if differ:
            named = ""
            if column == 0:  # which settings: those of the buckets whose digests differ
                fields = sorted(name for name in settings
                                if any(buckets[i][_bucket(name)] != buckets[0][_bucket(name)]
                                       for i in differ))
                named = f" (the settings that differ are among: {', '.join(fields)})" if (
                    fields) else ""
            raise ValueError(f"{', '.join(workers[i] for i in differ)} train with other "
                             f"{what} than {workers[0]}{named}; every worker must train the "
                             "same run.")
    # Synchronous workers' backups are at most one epoch apart; more means a lost backup.
    agreed = int(min(row[2] for row in rows))
    if agreed < max(row[2] for row in rows) - 1 or any(agreed not in row[2:] for row in rows):
        held = "; ".join(f"{w}: {sorted({int(e) for e in row[2:] if e >= 0}, reverse=True)}"
                         for w, row in zip(workers, rows))
        behind = [w for w, row in zip(workers, rows) if row[2] == agreed]
        ahead = max(rows, key=lambda row: row[2])
        latest = " or ".join(str(int(e)) for e in sorted({e for e in ahead[2:4] if e > 0},
                                                         reverse=True))
        raise ValueError(
            f"The workers' backups hold no common epoch to resume after ({held}): "
            f"{', '.join(behind)} {'holds' if len(behind) == 1 else 'hold'} no backup of "
            f"epoch {latest} (lost with a disk, or never written: a worker that did not "
            "train this run before, as on resuming with more workers than it started with, or "
            "one killed before it wrote that epoch's). Copy the backup of a worker that has "
            "the latest epoch (the chief's RUN/backup, worker i's RUN/workertemp_i/backup) to "
            "the same place on the others (the workers' weights are the same), or start "
            "over with --overwrite on every worker.")
    return agreed


def _worker_names(count):
    """The workers' names in the order of their rows: by task, as `TF_CONFIG` names them
    (with a `chief` task, the chief first and worker task i after it, "worker i")."""
    if cluster_from_tf_config().get("chief"):
        return ["the chief"] + [f"worker {i}" for i in range(count - 1)]
    return [f"worker {i}" for i in range(count)]


def epoch_seed(seed, epoch):
    """The shuffle seed of `epoch` (0-based): a function of the run's seed and the epoch.

    `tf.data`'s `reshuffle_each_iteration` draws each epoch's order from a generator that
    starts again when the process restarts, so a resumed run would replay epoch 0's order;
    a seed computed from the epoch number survives restarts.
    """
    return seed + epoch * _EPOCH_SEED_STRIDE


def segmentation_samplers(config, train_pairs, source_tokenizer, target_tokenizer,
                          log=print):
    """The source and target `SegmentationSampler`s of a run with `config.subword_nbest > 1`.

    Reads the training pairs once; refuses a training set of more than `CACHE_MAX_PAIRS`
    pairs (every sentence's candidates stay in memory). `log` (a callable taking a str, or
    None for silence) is told the samplers' progress and time.

    Returns:
        `(source sampler, target sampler)`, or `None` when `config.subword_nbest == 1`.
    """
    if config.subword_nbest == 1:
        return None
    source_lang, target_lang = run_languages(config)
    sources, targets = [], []
    for pair in train_pairs.as_numpy_iterator():
        if len(sources) == CACHE_MAX_PAIRS:
            raise ValueError(
                f"subword_nbest={config.subword_nbest} keeps every training sentence's "
                f"segmentations in memory, for at most {CACHE_MAX_PAIRS:,} pairs; this "
                "training set has more. Run the same command with --set subword_nbest=1 "
                "(the vocabulary made so far is kept), or with a train_subset and "
                "--overwrite (the vocabulary is made from the subset).")
        sources.append(pair[source_lang])
        targets.append(pair[target_lang])
    return tuple(
        SegmentationSampler(tokenizer, sentences, config.subword_nbest, config.subword_alpha,
                            log=None if log is None else
                            lambda message, side=side: log(f"{message} ({side})"))
        for tokenizer, sentences, side in ((source_tokenizer, sources, "source"),
                                           (target_tokenizer, targets, "target")))


# Characters (both sides) the vocabulary's sample holds at most, whatever
# `tokenizer_sample_pairs` says: SentencePiece takes about 20 MiB of memory per MiB of text,
# so paragraph-long lines made 200,000 pairs many GiB. 200,000 Multi30K-length pairs are
# about 26 million characters: the presets' samples are within it.
TOKENIZER_SAMPLE_CHARS = 40_000_000

# The passes of `make_epoch_train_dataset`'s stream: more than any run reads (its `take`
# ends it), few enough that a pass number times the seed stride stays an int64.
_PASSES_END = 2**31


def make_epoch_train_dataset(config, train_pairs, source_tokenizer, target_tokenizer,
                             replicas=1, initial_epoch=0, data_report=None, samplers=None):
    """Training batches of epochs `initial_epoch, ..., config.epochs - 1`, back to back.

    The batches are one stream of passes over the data, pass `p` shuffled with
    `epoch_seed(config.seed, p)`; without `config.steps_per_epoch` epoch `e` is pass `e`,
    with it each epoch is the next `steps_per_epoch` batches of the stream (an epoch
    shorter than a pass goes on where the previous one stopped; a longer one runs into the
    next pass). The batches do not depend on which process trains them, so a resumed or
    continued run sees exactly the batches an uninterrupted one does; one resumed inside a
    pass prepares the pass's earlier batches again to skip them (said when it does).

    With `samplers` (`segmentation_samplers`, subword regularization) pass `p` reads each
    sentence in the segmentation its samplers draw with that seed. Sampled segmentations
    change the batches' lengths and so their number: a pass is then as many batches as
    one pass of the best segmentations makes (its shuffled data cut or repeated to that).

    With a `data_report` (see `keras_transformer.data.prepare_data_report`) over-long pairs
    are dropped as the report counted them and its batch count is the epoch's length;
    without one, the batches of one pass are counted here.

    Returns:
        `(dataset, steps_per_epoch)`; pass both to `fit`.
    """
    batching = _batching(config, replicas)
    if data_report is not None:
        batching["drop_long"] = config.drop_long_pairs

    def one_epoch(epoch, sampled=True):
        source, target = source_tokenizer, target_tokenizer
        seed = epoch_seed(config.seed, epoch)
        if samplers is not None and sampled:
            source, target = (sampler.tokenizer(tf.stack([seed, tf.constant(side, seed.dtype)]))
                              for side, sampler in enumerate(samplers))
        return make_translation_dataset(
            train_pairs, source, target, shuffle=True, seed=seed,
            repeat=samplers is not None and sampled,  # cut to a pass's batch count
            # Cached data would be cached per epoch here, so it is not cached at all:
            # tokenizing a corpus is cheap next to training on it.
            cache=False, **batching,
        )

    # The batches of one pass over the data. Their number does not depend on the order:
    # every length bucket yields ceil(its examples / its batch size) batches, so one count
    # holds for every pass (a sampled pass is cut or repeated to it).
    per_pass = data_report.batches["train"] if data_report is not None else None
    if per_pass is None:
        per_pass = int(one_epoch(tf.constant(0, tf.int64), sampled=False).reduce(
            0, lambda count, _: count + 1))
    steps = config.steps_per_epoch or per_pass

    def pass_batches(index):
        batches = one_epoch(index)
        return batches.take(per_pass) if samplers is not None else batches

    # Epochs are consecutive slices of one stream of passes, pass `p` shuffled with
    # `epoch_seed(seed, p)`: with `steps_per_epoch` shorter than a pass, the next epoch
    # goes on where the last one stopped (restarting each pass would never reach what lies
    # past its first `steps_per_epoch` batches), and a resumed run starts in the pass, and
    # at the batch, where epoch `initial_epoch` starts. Without it, epoch `e` is pass `e`.
    start = initial_epoch * steps
    first_pass = start // per_pass
    if start > first_pass * per_pass and initial_epoch < config.epochs:
        print(f"Resuming inside pass {first_pass + 1} over the data: its first "
              f"{start - first_pass * per_pass:,} batches are prepared again and skipped "
              "(the first resumed epoch takes longer)", flush=True)
    dataset = tf.data.Dataset.range(first_pass, _PASSES_END).flat_map(pass_batches)
    dataset = dataset.skip(start - first_pass * per_pass).take(
        max(config.epochs - initial_epoch, 0) * steps)
    return dataset.prefetch(tf.data.AUTOTUNE), steps


def train(
    config,
    output_dir,
    data_dir=None,
    local_dir=None,
    strategy="auto",
    make_translate_fn="auto",
    report_padding=True,
    verbose="auto",
    callbacks=None,
    cluster_timeout_minutes=CLUSTER_TIMEOUT_MINUTES,
):
    """Trains a Transformer on the config's data source with `model.fit`; writes a run dir.

    The data source is `config.data` (Multi30K, parallel files, TSV or a TFDS dataset, see
    `keras_transformer.data.sources`). Before training, its files are checked, and a data
    report (pairs read, kept, dropped and why; batches per epoch) is printed and saved as
    `data_report.json`; the epoch's batch count gives the progress bar its total.

    A run's life:
    - *Resume*: rerunning the same call after the process (or a worker) died resumes from
      the last completed epoch (`BackupAndRestore`): weights, optimizer state and epoch
      counter are restored, the tokenizer of the first attempt is reused, epoch `e` sees
      the same shuffled batches as in an uninterrupted run (`epoch_seed`), and
      `history.json` and the training time cover every epoch of every attempt.
    - *Continue*: a finished run called again with a larger `config.epochs` continues from
      its final model with its optimizer state (step count, so the schedule; Adam
      moments). With the same or fewer epochs nothing is trained and the run is loaded.
    - A different configuration (other than `RESUMABLE_FIELDS`) is refused with
      `ConfigMismatchError`.
    - One process at a time: the call holds its write directory (`hold_run_directory`);
      another process training into it meanwhile gets `RunInUseError`.

    Several machines: under `MultiWorkerMirroredStrategy` (`TF_CONFIG` names the cluster)
    every worker runs this same call; each keeps its part of every global batch
    (`shard_by_data`), only the chief writes `output_dir`, the other workers write to
    `worker_write_dir` (removed at the end) and only the chief computes validation BLEU.
    A time budget is shared: every worker records the slowest worker's epoch times
    (`strategy.slowest_worker`), so all of them stop after the same epoch.

    Args:
        config: `TrainingConfig`.
        output_dir: str or path-like, the run directory (created).
        data_dir: TFDS data directory (for `tfds:<name>` data). Defaults to TFDS' own.
        local_dir: directory holding the raw Multi30K files; found automatically when
            `None` (see `keras_transformer.data.find_local_multi30k`).
        strategy: a `tf.distribute.Strategy` or a name for `select_strategy`
            (`"auto"`, `"default"`, `"mirrored"`, `"multi_worker"`). Defaults to `"auto"`.
            A name is resolved first thing, before any other TensorFlow op, as
            `MultiWorkerMirroredStrategy` requires.
        make_translate_fn: how validation BLEU translates: `"auto"` (the in-graph
            `Translator` with the config's `beam_size` and `length_penalty`, up to
            `max_length + 16` tokens: `validation_translator(config)`, what the command
            line uses), a callable `(model, source_tokenizer, target_tokenizer) ->
            translate_fn(list[str]) -> list[str]`, or `None` to skip BLEU (`best.keras`
            then follows the validation loss). BLEU runs only with `bleu_sentences > 0` and
            a validation split. Defaults to `"auto"`.
        report_padding: bool, print the padding fraction with and without bucketing.
        verbose: Keras `fit` verbosity. Defaults to `"auto"`: the progress bar on a
            terminal, one line per epoch otherwise (no stream of `\r` and ANSI codes in a
            log file).
        callbacks: list of extra `keras.callbacks.Callback`, run after the run's own
            callbacks of every epoch and before its final save (`model.keras` holds the
            weights they leave as `fit` ends). A run they stop before `config.epochs` is
            finished: called again, it trains nothing until `epochs` is larger than the
            epochs it was given. Under several workers, a stop one of them decides at an
            epoch's end (an `EarlyStopping` on `val_bleu`, the chief's) stops all
            (`StopTogether`); one decided in the middle of an epoch must be decided alike
            on every worker. In a resumed or continued run they start afresh (Keras keeps
            a callback's state, such as `EarlyStopping`'s patience count, in memory only),
            and the run says so. Defaults to `None`.
        cluster_timeout_minutes: float or `None`, with a strategy name that resolves to
            `"multi_worker"`: how long this worker waits for the others to connect before
            it exits with status 1 (`None` or 0: no limit; `select_strategy`). Defaults to
            30.

    Returns:
        A `TrainingRun`.
    """
    if isinstance(make_translate_fn, str) and make_translate_fn == "auto":
        make_translate_fn = validation_translator(config)
    elif make_translate_fn is not None and not callable(make_translate_fn):
        raise ValueError("`make_translate_fn` must be 'auto', a callable or None. "
                         f"Received: {make_translate_fn!r}")
    if isinstance(strategy, str):
        strategy = select_strategy(strategy, cluster_timeout_minutes=cluster_timeout_minutes)
    else:  # a user's own (`MultiWorkerMirroredStrategy()`): Keras' scalar logs need the fix
        fix_keras_multi_worker_logs()
    output_dir = pathlib.Path(output_dir)
    write_dir = worker_write_dir(output_dir, strategy)
    # The run sets Keras' global dtype policy to its precision while it builds its model; the
    # caller's (a notebook's next model) is restored however the run ends.
    caller_policy = keras.config.dtype_policy()
    try:
        with hold_run_directory(write_dir):
            return _train(config, output_dir, write_dir, strategy, data_dir, local_dir,
                          make_translate_fn, report_padding, verbose, callbacks)
    finally:
        keras.config.set_dtype_policy(caller_policy)


def validation_translator(config):
    """The factory `train` translates validation BLEU with unless told otherwise.

    Beam search of `config.beam_size` beams and length penalty `config.length_penalty`
    (greedy when `beam_size` is 1) through the in-graph `keras_transformer.export.Translator`,
    up to `config.max_length + 16` output tokens. Decoding is imported when the factory is
    called, not when training is.

    Args:
        config: `TrainingConfig`.

    Returns:
        A callable `(model, source_tokenizer, target_tokenizer) -> Translator` (a
        `list[str] -> list[str]` callable).
    """

    def make(model, source_tokenizer, target_tokenizer):
        from keras_transformer.export import DecodingConfig, Translator

        beam = ({"search": "beam", "beam_size": config.beam_size,
                 "alpha": config.length_penalty} if config.beam_size > 1
                else {"search": "greedy"})
        return Translator(model, source_tokenizer, target_tokenizer,
                          DecodingConfig(max_output_length=config.max_length + 16, **beam))

    return make


def _remove_partial_files(write_dir):
    """Removes what a process killed during an atomic write left in the directory this
    process writes and the subdirectories training writes (a model's partial file: tens of
    MB), of processes no longer running (`textfiles.remove_stale_partials`). Not other
    workers' directories inside the run directory: their processes run on other machines."""
    for directory in (write_dir, write_dir / "checkpoints", write_dir / "tokenizer",
                      write_dir / "backup"):
        remove_stale_partials(directory, keep_own=False)  # nothing written here yet


def _train(config, output_dir, write_dir, strategy, data_dir, local_dir, make_translate_fn,
           report_padding, verbose, callbacks):
    """`train`'s work, once this process holds `write_dir`."""
    chief = is_chief(strategy)
    # A mistake refused here on one worker only would leave the others waiting in the
    # agreement below: the failing worker takes part in it, saying it failed.
    try:
        if chief:
            _check_new_run_directory(write_dir)
        source = open_run_source(config, local_dir=local_dir, tfds_dir=data_dir)
        # A TFDS source may have chosen the languages: the run records the ones used.
        config = config.replace(source_lang=source.source_lang, target_lang=source.target_lang)
        check_resumable(config, write_dir)
        # What an interrupted run was planned with, before its config.json is rewritten.
        saved_config = _saved_config(write_dir)
        _remove_partial_files(write_dir)

        # Where this run stands: a backup (interrupted), a final model (finished) or nothing.
        initial_epoch = _latest_backup_epoch(write_dir)
        if initial_epoch is not None and _finished_after_backup(write_dir, output_dir):
            shutil.rmtree(write_dir / "backup")
            initial_epoch = None
        continue_from = None
        if initial_epoch is None:
            # A finished run: on a worker whose private directory is gone, the chief's
            # files (a shared filesystem) say how far the run got.
            finished_dir = write_dir if (write_dir / "model.keras").is_file() else output_dir
            if (finished_dir / "model.keras").is_file():
                # The model's own record, not the history: a continuation killed between
                # its first epoch's history and that epoch's backup has a history one
                # epoch ahead of the model it continues from.
                continue_from = finished_dir / "model.keras"
                initial_epoch = read_final_model_epochs(continue_from)
                if initial_epoch is None:  # a model saved before records were written
                    initial_epoch = read_run_history(finished_dir / "history.json")["epochs"]
            else:
                initial_epoch = 0
        previous = read_run_history(
            (continue_from.parent if continue_from else write_dir) / "history.json",
            initial_epoch)
        if chief and not initial_epoch and config.data in ("files", "tsv"):
            # A new run: the user's test sets are found missing or unaligned now, not at
            # `evaluate` after the training (not on resuming: they may have moved since), and
            # every split's files named the right way round.
            source.check(source.test_sets())
            source.check_directions()
        finished = continue_from is not None and _nothing_to_train(config, initial_epoch,
                                                                    previous)
        if not finished:  # (a finished run is told to the others below)
            keras.utils.set_random_seed(config.seed)
            precision = resolve_precision(config.precision)
            if config.precision == "auto" and chief:
                print(f"precision 'auto': {precision or 'float32'} on this machine", flush=True)
            keras.config.set_dtype_policy(precision or "float32")
            replicas = strategy.num_replicas_in_sync
            if chief and initial_epoch and continue_from is None and saved_config is not None:
                # Said before config.json takes the new values, which the warning names.
                warning = resume_plan_warning(saved_config, config, previous)
                if warning:
                    print(warning, file=sys.stderr, flush=True)
            if chief:
                # Atomically: other workers may read it (a shared filesystem) at this moment.
                write_json_atomically(output_dir / "config.json", config.to_dict(), indent=2)

            splits = {split: source.dataset(split) if split in source.splits() else None
                      for split in ("train", "validation")}
            source_tokenizer, target_tokenizer = prepare_tokenizers(
                config, source.pairs("train", limit=config.train_subset), write_dir,
                data_files=data_file_stats(source.spec(), ("train",)))
            data_report = prepare_data_report(
                source, config, source_tokenizer, target_tokenizer, write_dir, replicas,
                resuming=bool(initial_epoch),
                log=(lambda message: print(message, flush=True)) if chief else None)
    except (ValueError, OSError) as error:
        agree_with_workers(strategy, config, None, 0, write_dir, failure=error)
        raise
    if finished:
        print(f"{output_dir} holds {finished}.", flush=True)
        if not chief:  # nothing of this worker's is needed any more
            shutil.rmtree(write_dir, ignore_errors=True)
        # With the others: some may not see the run (no shared filesystem) and wait for it.
        agree_with_workers(strategy, config, None, initial_epoch, write_dir, finished=True)
        return _load_finished_run(config, output_dir, continue_from, previous)
    try:
        agreed_epoch = agree_with_workers(
            strategy, config, data_report, initial_epoch, write_dir,
            restartable=continue_from is None,
            vocabulary=vocabulary_digests(source_tokenizer, target_tokenizer))
    except RunFinishedElsewhere as elsewhere:
        print(f"{elsewhere}: nothing to train on this worker.", flush=True)
        if not chief:
            shutil.rmtree(write_dir, ignore_errors=True)
        return TrainingRun(model=None, source_tokenizer=source_tokenizer,
                           target_tokenizer=target_tokenizer, config=config,
                           output_dir=output_dir, history={}, train_seconds=0.0)
    resume_epoch = None
    if agreed_epoch != initial_epoch:  # another worker's backup is an epoch behind
        initial_epoch = resume_epoch = agreed_epoch
        previous = read_run_history(write_dir / "history.json", initial_epoch)
    fit_epochs = config.epochs
    finished = continue_from is None and _nothing_to_train(config, initial_epoch, previous)
    if finished:
        # Its final save was cut short (a full disk, a kill) after its last epoch's backup.
        # `fit` to `config.epochs` would train one more epoch before its callbacks check the
        # budget and the cooldown plan: it is given none to train, and ends as the run
        # would have ended, saving the final model and removing the backup.
        fit_epochs = min(config.epochs, initial_epoch)
        if chief:
            print(f"{output_dir} holds {finished}; its final model is saved from its "
                  "backup (its last epoch's weights: weights a callback restored as the "
                  "interrupted training ended were only in memory).", flush=True)
    if chief:
        # Killed after an epoch's checkpoints, before its backup: that epoch is trained
        # again (or, resumed to fewer epochs, not at all); `average` must not take it.
        drop_epoch_checkpoints_after(write_dir / "checkpoints", initial_epoch)
    if chief:
        print(data_report, flush=True)
    train_pairs, _, val_ds = make_datasets(
        config, splits, source_tokenizer, target_tokenizer, replicas, data_report
    )
    samplers = segmentation_samplers(
        config, train_pairs, source_tokenizer, target_tokenizer,
        log=lambda message: print(message, flush=True) if chief else None)
    train_ds, steps_per_epoch = make_epoch_train_dataset(
        config, train_pairs, source_tokenizer, target_tokenizer, replicas, initial_epoch,
        data_report, samplers,
    )
    train_ds = shard_by_data(train_ds)
    val_ds = shard_by_data(val_ds) if val_ds is not None else None
    warning = warmup_warning(config, steps_per_epoch) if chief and not finished else None
    if warning:
        print(warning, file=sys.stderr, flush=True)
    policy = keras.config.dtype_policy().name  # this run's, set above
    if chief and not finished and config.precision == "auto":  # said when epochs will train
        warning = precision_change_warning(previous, policy)
        if warning:
            print(warning, file=sys.stderr, flush=True)
    if verbose == "auto":
        verbose = 1 if getattr(sys.stdout, "isatty", lambda: False)() else 2
    if report_padding and chief:
        report = padding_report(config, train_pairs, source_tokenizer, target_tokenizer,
                                replicas)
        print(f"Padding per batch: {report}", flush=True)

    with strategy.scope():
        model = compile_model(build_model(config, source_tokenizer, target_tokenizer), config,
                              total_steps=config.epochs * steps_per_epoch)
        build_from_spec(model, train_ds.element_spec)
        if continue_from is not None:
            model.optimizer.build(model.trainable_variables)
            model.load_weights(continue_from)  # the weights and the optimizer state
    print(f"Model: {model.count_params():,} parameters; strategy "
          f"{type(strategy).__name__} with {replicas} replica(s); policy "
          f"{keras.config.dtype_policy().name}", flush=True)
    if initial_epoch:
        print(f"{'Continuing' if continue_from else 'Resuming'} after epoch {initial_epoch} "
              f"of {config.epochs}", flush=True)

    # Several workers record the slowest one's epoch times, so that a time budget (and the
    # cooldown and late dropout it plans) decides the same on all of them.
    run_history = RunHistory(write_dir / "history.json", initial=previous,
                             reduce_seconds=slowest_worker(strategy),
                             precision=policy)
    bleu_callback = None
    if (make_translate_fn is not None and config.bleu_sentences and chief
            and splits["validation"] is not None):
        # Decoding is not a collective op: the chief alone translates, once per
        # evaluation, while the other workers wait at the next step's all-reduce. Only
        # the chief saves the best model, so its decision needs no collective either.
        sources, references = _pairs(
            splits["validation"], config.source_lang, config.target_lang, config.bleu_sentences
        )
        bleu_callback = BleuCallback(
            make_translate_fn(model, source_tokenizer, target_tokenizer),
            sources,
            references,
            every_n_epochs=config.bleu_every_n_epochs,
            best_path=str(write_dir / "checkpoints" / "best.keras"),
            batch_size=_BLEU_BATCH_SIZE,
            target_lang=config.target_lang,
            initial_epoch=initial_epoch,
            verbose=verbose,
            ends_after=None if config.time_budget_minutes is None else (
                lambda epoch: budget_ends_after(config, run_history, epoch)),
            record_late=lambda epoch, bleu: run_history.record_late("val_bleu", epoch, bleu),
        )
    late_dropout = []
    if config.late_dropout is not None:
        late_dropout.append(LateDropout(
            config.late_dropout, epoch=config.late_dropout_after,
            min_epochs=config.late_dropout_min_epochs,
            planned_epochs=lambda done: planned_epochs(config, run_history.epoch_seconds[:done])))
    # Last of an epoch's: a stop one worker's callbacks decide (the chief's validation
    # BLEU) stops all.
    together = [] if task_of(strategy)[0] is None else [StopTogether(
        lambda stop: max(row[0] for row in gather_from_workers(strategy, [float(stop)])) > 0)]
    run_callbacks = make_callbacks(
        str(write_dir),
        bleu_callback=bleu_callback,
        best_monitor=(None if bleu_callback or not chief
                      else "val_loss" if val_ds is not None else "loss"),
        keep_checkpoints=config.keep_checkpoints,
        run_history=run_history,
        time_budget_minutes=config.time_budget_minutes,
        cooldown_schedule=learning_rate_schedule(model.optimizer),
        cooldown_fraction=config.lr_cooldown if config.time_budget_minutes else 0.0,
        max_epochs=config.epochs,
        final_model_path=str(write_dir / "model.keras") if chief else None,
        seed=config.seed,
        resume_epoch=resume_epoch,
        initial_epoch=initial_epoch,
        # No worker deletes its backup before the chief has saved the final model.
        before_backup_delete=worker_barrier(strategy),
        # The user's before the final save: what they restore as `fit` ends is saved.
        more_callbacks=late_dropout + list(callbacks or []) + together,
    )
    if callbacks and initial_epoch:
        names = ", ".join(sorted({type(callback).__name__ for callback in callbacks}))
        print(f"Resuming after epoch {initial_epoch}: your callbacks ({names}) start afresh. "
              "What they held in memory in the earlier process (EarlyStopping's best value "
              "and patience count, for one) is not restored; they count from epoch "
              f"{initial_epoch + 1}.", flush=True)
    model.fit(
        train_ds,
        validation_data=val_ds,
        epochs=fit_epochs,
        initial_epoch=initial_epoch,
        steps_per_epoch=steps_per_epoch,
        shuffle=False,  # the pipeline shuffles each epoch with its own seed
        callbacks=run_callbacks,
        # Other workers print one line per epoch: the chief's progress bar is the run's.
        verbose=verbose if chief else 2,
    )
    if not chief:  # the chief saved model.keras as fit ended (FinalModelSaver)
        shutil.rmtree(write_dir, ignore_errors=True)
    return TrainingRun(
        model=model,
        source_tokenizer=source_tokenizer,
        target_tokenizer=target_tokenizer,
        config=config,
        output_dir=output_dir,
        history=run_history.history,
        train_seconds=run_history.train_seconds,
        epochs_trained=len(run_history.epoch_seconds) - initial_epoch,
    )


def _nothing_to_train(config, epochs_done, record):
    """Why a run that trained `epochs_done` epochs (its history `record`, as
    `read_run_history` reads it) has no epoch left to train under `config`, or `None`: its
    `epochs` reached, its time budget, the end of its learning-rate cooldown plan, or a
    callback's stop (`RecordStop`) while `epochs` is not larger than it was then."""
    if not epochs_done:
        return None
    if config.epochs <= epochs_done:
        return (f"a finished run of {epochs_done} epoch(s); nothing to train (pass a larger "
                "--epochs, or epochs= from Python, to continue it)")
    seconds = record["epoch_seconds"]
    if time_budget_reached(seconds, config.time_budget_minutes):
        next_epoch = predicted_epoch_seconds(seconds)
        return (f"a run of {epochs_done} epoch(s) that its time budget of "
                f"{config.time_budget_minutes:g} minutes stopped; nothing to train (its next "
                f"epoch is predicted to take {next_epoch / 60:.2f} min, as its longest after "
                f"the first: set time_budget_minutes to "
                f"{budget_to_continue(config, seconds, epochs_done):g} to continue it)")
    if (config.lr_cooldown and config.time_budget_minutes
            and planned_epochs(config, seconds) <= epochs_done):
        return (f"a run of {epochs_done} epoch(s) whose learning rate cooled down to zero as "
                f"its time budget of {config.time_budget_minutes:g} minutes planned; nothing "
                "to train (set time_budget_minutes to "
                f"{budget_to_continue(config, seconds, epochs_done):g} to continue it)")
    stopped = record.get("stopped") or {}
    if stopped.get("epochs") == epochs_done and config.epochs <= stopped.get("planned", 0):
        return (f"a run of {epochs_done} of {stopped['planned']} epoch(s) that a callback "
                "stopped (model.stop_training, say an EarlyStopping); nothing to train (pass "
                f"epochs larger than {stopped['planned']} to continue it)")
    return None


def peak_share(warmup_steps, total_steps, cooldown, shape="linear"):
    """The largest learning rate a run of `total_steps` updates reaches, as a share of the
    schedule's peak (the rate at the end of `warmup_steps`): `TransformerSchedule`'s
    warm-up, times its cooldown of `shape` over the last `cooldown` updates. The warm-up and
    the cooldown overlap when the run is short or the cooldown long (`lr_cooldown=1`)."""
    steps = np.arange(1, min(total_steps, warmup_steps) + 1, dtype=np.float64)  # from 1
    rates = steps / warmup_steps  # the warm-up; past it the rate only falls
    if cooldown:
        rates *= cooldown_multiplier(steps - 1, total_steps, cooldown, shape, np)
    return float(rates.max()) if len(rates) else 0.0


# Below this share of its peak the learning rate of a run is worth a warning.
_LOW_PEAK_SHARE = 0.5


def budget_ends_after(config, run_history, epoch):
    """Whether the time budget (`TimeBudget`, or the cooldown `BudgetCooldown` plans)
    will end the run after `epoch` (0-based), asked as the epoch ends, before
    `run_history` times it: its time so far counted as the whole epoch's (`planned_epochs`).
    What comes after the question (validation, saves) is not counted, so that scoring an
    epoch never makes it the last; `BleuCallback` scores a last epoch this did not foresee
    when `fit` ends. The chief's own clock: with several workers the budget reads the
    slowest one's."""
    elapsed = run_history.epoch_elapsed()
    if elapsed is None:
        return False
    return planned_epochs(config, run_history.epoch_seconds + [elapsed]) <= epoch + 1


def warmup_warning(config, steps_per_epoch):
    """The warning for a run whose learning rate would stay below half its peak: too few
    updates (`config.epochs` x `steps_per_epoch`) for `warmup_steps`, the cooldown
    (`lr_cooldown`) counted, as on a small corpus with a preset made for a larger one.
    None otherwise (a time budget can only end the run earlier)."""
    total = config.epochs * steps_per_epoch
    cooldown = cooldown_steps(config.lr_cooldown, total)
    share = peak_share(config.warmup_steps, total, cooldown, config.lr_cooldown_shape)
    if share >= _LOW_PEAK_SHARE:
        return None
    before_cooldown = total - cooldown
    suggestion = max(1, before_cooldown // 4, total // 8)
    run = f"{config.epochs} epoch(s) of {steps_per_epoch} batches"
    updates = (f"{before_cooldown} updates before its cooldown ({total} updates: {run})"
               if before_cooldown < total else f"{total} updates ({run})")
    return (f"Warning: warmup_steps={config.warmup_steps} is more than this run's "
            f"{updates}: the learning rate will "
            f"reach only {share:.0%} of its peak, and a model trained so little translates "
            f"little. Warm up over a fraction of the run (e.g. --set "
            f"warmup_steps={suggestion}), or train more epochs or on more data.")


def precision_change_warning(record, precision):
    """The warning for a run that goes on in another precision than its last epoch trained
    in (`record["precision"]`, as `RunHistory` writes it): `precision="auto"` resolves from
    each machine's CPU on each start. `None` when nothing was recorded or nothing changes.

    Args:
        record: dict, the run's history as `read_run_history` reads it.
        precision: the policy this start resolved (`None` is float32).
    """
    before, now = record.get("precision"), precision or "float32"
    if not record.get("epochs") or before in (None, now):
        return None
    return (f"Warning: this run's last epoch ({record['epochs']}) trained in {before}; "
            f"precision 'auto' means {now} on this machine, so it goes on in {now}, not "
            "exactly as an uninterrupted run would have. (A run started with its precision "
            f"set, --set precision={before}, keeps it wherever it resumes.)")


def resume_plan_warning(saved, config, record):
    """The warning for an interrupted run resumed with another `epochs` or
    `time_budget_minutes` than `saved` (the config it trained with; both may change,
    `RESUMABLE_FIELDS`), when that changes what the run does from the resumed epoch on:
    its learning rate, where its cooldown is planned over the run's length, and whether
    late dropout applies, where it is decided on the planned length. Either is replanned
    as if the new value had applied from the start. `None` when neither changes (say, a
    larger budget before the cooldown has begun: the plan follows it as it would have),
    and for a run that had ended as planned (its final save cut short: the new value
    continues it, as it would a finished run) or trains nothing now.

    Args:
        saved: `TrainingConfig`, the run's own.
        config: `TrainingConfig`, the one it resumes with.
        record: dict, the run's history as `read_run_history` reads it (`epoch_seconds`,
            the times of the epochs trained).
    """
    changed = [name for name in ("epochs", "time_budget_minutes")
               if getattr(saved, name) != getattr(config, name)]
    epoch_seconds = record["epoch_seconds"]
    done = len(epoch_seconds)
    if not changed or _nothing_to_train(saved, done, record) or _nothing_to_train(
            config, done, record):
        return None
    # Multipliers hardly depend on the batches per epoch (only through rounding), and the
    # warning is said before they are counted.
    steps_per_epoch = 10_000
    step = done * steps_per_epoch

    def multiplier(run):
        total = run.epochs * steps_per_epoch
        cool = cooldown_steps(run.lr_cooldown, total)
        if run.time_budget_minutes is not None:  # `BudgetCooldown`'s plan, if it has one
            _, planned_total, planned_cool = plan_cooldown(
                epoch_seconds, run.time_budget_minutes, run.epochs, steps_per_epoch,
                run.lr_cooldown)
            if planned_cool:
                total, cool = planned_total, planned_cool
        return float(cooldown_multiplier(step, total, cool, run.lr_cooldown_shape, np))

    changes = []
    if config.lr_cooldown:
        before, now = multiplier(saved), multiplier(config)
        if not math.isclose(before, now, abs_tol=1e-6):
            changes.append(
                f"the learning rate's cooldown, planned over the run's length, multiplies "
                f"it by {now:.3f} at epoch {done + 1}'s start (the run as it was planned: "
                f"{before:.3f})")
    after = config.late_dropout_after
    if config.late_dropout is not None and config.late_dropout_min_epochs and done > after:
        def applies(run):
            return planned_epochs(run, epoch_seconds[:after]) >= run.late_dropout_min_epochs

        if applies(saved) != applies(config):
            changes.append(
                f"late dropout ({config.late_dropout:g} from epoch {after + 1}), decided on "
                f"the planned length, {'now applies' if applies(config) else 'no longer applies'}")
    if not changes:
        return None
    values = ", ".join(f"{name} {getattr(saved, name)} -> {getattr(config, name)}"
                       for name in changed)
    return (f"Warning: resuming after epoch {done} with {values}: {'; '.join(changes)}. "
            "The plan is made as if the new value had applied from the start. To resume the "
            "run as it was planned, stop now and give it its own values; to lengthen it, let "
            "it finish and continue it.")


def budget_to_continue(config, epoch_seconds, epochs_done):
    """The least time budget larger than `config.time_budget_minutes`, in minutes to the
    hundredth, under which a run that trained `epochs_done` epochs (taking
    `epoch_seconds`) trains another: its next epoch fits (`time_budget_reached`) and, with
    a cooldown, the plan `planned_epochs` replays with that budget holds more epochs than
    were trained (a plan stays once its cooldown has begun, so the next epoch fitting is
    not enough). Not every larger budget does: one that keeps the plan open until a slow
    epoch shortens it can end the run where it ended. `config.epochs` must be larger than
    `epochs_done`.

    Example:

    >>> from keras_transformer.training import get_preset
    >>> seconds = [426.0, 315.0, 337.0, 379.0, 378.0, 402.0, 347.0, 390.0]
    >>> config = get_preset("multi30k")  # a 55-minute budget, the last 30% a cooldown
    >>> budget_to_continue(config.replace(lr_cooldown=0.0), seconds, 8)  # the next epoch
    56.27
    >>> budget_to_continue(config, seconds, 8)  # a plan of 9 epochs
    57.39
    """
    def continues(hundredths):
        minutes = hundredths / 100
        if time_budget_reached(epoch_seconds, minutes):
            return False
        return not config.lr_cooldown or planned_epochs(
            config.replace(time_budget_minutes=minutes), epoch_seconds) > epochs_done

    # The next epoch must fit (in whole seconds: no rounding up past an exact hundredth).
    needed = sum(epoch_seconds) + predicted_epoch_seconds(epoch_seconds)
    hundredths = max(math.ceil(round(needed * 100 / 60, 6)),
                     math.floor(round(config.time_budget_minutes * 100, 6)) + 1)
    # Upwards one hundredth at a time: a budget planning all of `config.epochs` continues.
    while not continues(hundredths):
        hundredths += 1
    return hundredths / 100


def planned_epochs(config, epoch_seconds):
    """How many epochs a run is planned to train after the epochs timed in `epoch_seconds`:
    `config.epochs`, or with `time_budget_minutes` what the budget (and its cooldown
    plan, which stays once the cooldown has begun) predicted then (`plan_cooldown`; the
    number of epochs it plans does not depend on the batches per epoch)."""
    if config.time_budget_minutes is None:
        return config.epochs
    return plan_cooldown(epoch_seconds, config.time_budget_minutes, config.epochs, 1,
                         config.lr_cooldown)[0]


def build_from_spec(model, element_spec):
    """Builds the model's, loss', metrics' and optimizer's state from the data's spec.

    Under a `tf.distribute` strategy Keras 3's `fit` first *reduces* the first input batch
    across replicas (a `MEAN` of token ids) only to learn its shapes, then builds the same
    state symbolically; `MultiWorkerMirroredStrategy`'s collective reduce cannot reduce a
    nested batch such as `({"encoder_tokens", "decoder_tokens"}, labels)` and fails. The
    shapes are known from the dataset's `element_spec`, so the state is built from it here
    (inside `strategy.scope()`, as Keras does) and `fit`'s own attempt is skipped.
    """
    if getattr(model, "_distribute_strategy", None) is None:
        return  # outside any strategy Keras builds while tracing; nothing to work around
    model._symbolic_build(data_batch=element_spec)
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None


def _load_finished_run(config, output_dir, model_path, record):
    """The `TrainingRun` of a finished run directory, without training."""
    source_tokenizer, target_tokenizer = load_tokenizers(model_path.parent / "tokenizer")
    import keras_transformer.layers  # noqa: F401  (registers the layer classes)

    # Compiled as the run left it (optimizer state included): a notebook cell run again on
    # a finished run returns a model that `evaluate`s and `fit`s as the first run's did.
    model = keras.saving.load_model(model_path, safe_mode=True)
    return TrainingRun(
        model=model,
        source_tokenizer=source_tokenizer,
        target_tokenizer=target_tokenizer,
        config=config,
        output_dir=pathlib.Path(output_dir),
        history=record["history"],
        train_seconds=record["train_seconds"],
    )


def training_tokens_per_second(model, dataset, steps=20, warmup_steps=3):
    """Real (non-padding) source + target tokens per second of `train_on_batch` over `steps`
    batches (encoder tokens and labels, END included)."""
    iterator = iter(dataset.repeat())
    for _ in range(warmup_steps):
        inputs, labels = next(iterator)
        model.train_on_batch(inputs, labels)
    tokens, started = 0, time.time()
    for _ in range(steps):
        inputs, labels = next(iterator)
        model.train_on_batch(inputs, labels)
        tokens += int(np.count_nonzero(labels.numpy())) + int(
            np.count_nonzero(inputs["encoder_tokens"].numpy())
        )
    return tokens / (time.time() - started)


__all__ = ["ConfigMismatchError", "RESUMABLE_FIELDS", "TrainingRun", "build_from_spec",
           "build_model", "check_resumable", "compile_model", "epoch_seed", "is_run_directory",
           "make_datasets", "make_epoch_train_dataset", "prepare_tokenizers",
           "segmentation_samplers", "train", "training_tokens_per_second"]

"""A training run's data: its source, the tokenizer sample, the data report, the epoch size.

The trainer calls these in order:

1. `open_run_source(config)` opens the source the config names and checks its files (line
   counts, empty files) before anything else runs;
2. the tokenizers are trained on a bounded, uniform sample of the training pairs
   (`train_tokenizers(source.pairs("train"), max_pairs=...)`: reservoir sampling in one
   pass, so a corpus of any size costs `tokenizer_sample_pairs` pairs in memory);
3. `prepare_data_report(...)` makes one streaming pass over train and validation with the
   tokenizers: it counts pairs read, kept and dropped (and why, over-long pairs included),
   and the exact number of batches per epoch. The report is printed and saved as
   `data_report.json` in the run directory; a resumed run reads it back instead of counting
   again.

Over-long pairs (more than `max_length - 1` subword ids on either side) are dropped from
training and from the validation loss, and counted as `too_long`; evaluation and export
never drop a sentence (the export truncates input to its `max_input_length`).
"""

import dataclasses
import json
import os
import pathlib
import time

import numpy as np
import tensorflow as tf

from keras_transformer.data.pipeline import batch_plan, count_batches
from keras_transformer.data.readers import (
    READER_RULES,
    DataError,
    SplitReport,
    write_json_atomically,
)
from keras_transformer.data.sources import open_source
from keras_transformer.textfiles import file_digest

# File of the data report in a run directory.
REPORT_FILENAME = "data_report.json"
# Pairs tokenized per call while counting.
_SCAN_CHUNK = 1024
# `scan_split` tells its progress every this many pairs (about 10 s at 44,000 pairs/s).
_SCAN_PROGRESS_EVERY = 500_000
# Tokenized training examples are cached in memory only up to this many pairs (about
# 100 MB of int32 ids at Multi30K's lengths); larger corpora are re-tokenized every epoch.
CACHE_MAX_PAIRS = 300_000


def open_run_source(config, local_dir=None, tfds_dir=None, check=True):
    """Opens the data source of a `TrainingConfig` and checks its train/validation files.

    Args:
        config: `TrainingConfig` (fields `data`, `data_files`, `source_lang`, `target_lang`).
        local_dir: str or None, Multi30K's raw-file directory.
        tfds_dir: str or None, TFDS data directory.
        check: bool, validate line counts and empty files now. Defaults to `True`.

    Returns:
        A `ParallelSource`.
    """
    source = open_source(config.data, config.data_files, config.source_lang,
                         config.target_lang, local_dir=local_dir, tfds_dir=tfds_dir)
    if check:
        source.check([s for s in ("train", "validation") if s in source.splits()])
    return source


@dataclasses.dataclass
class DataReport:
    """What a run trains on: the source, per-split counts and batches per epoch."""

    # `ParallelSource.spec()`: data kind, files, languages.
    source: dict
    # Split name -> `SplitReport.to_dict()`.
    splits: dict
    # Split name -> batches of one pass (what Keras' progress bar shows as the total).
    batches: dict
    # The settings the counts depend on; a resumed run reuses the report when they match.
    fingerprint: dict
    # `{path: BLAKE2b hex digest}` of the local data files when the report was counted: a
    # run whose files changed size or time is resumed only if their content did not change.
    digests: dict = dataclasses.field(default_factory=dict)

    def kept(self, split):
        """int, pairs of `split` that go into training (after every drop)."""
        return self.splits[split]["kept"]

    def __str__(self):
        lines = [f"Data: {self.source['data']} {self.source['source_lang']}->"
                 f"{self.source['target_lang']}"]
        subset = (self.fingerprint or {}).get("train_subset")
        for split, counts in self.splits.items():
            lines.append(f"  {split}: {SplitReport(**counts)}; "
                         f"{self.batches[split]:,} batches per pass"
                         + (f"; the first {subset:,} kept pairs only (train_subset): the rest "
                            "of the data is not read" if subset and split == "train"
                            and counts.get("kept", 0) >= subset else ""))
        return "\n".join(lines)

    def save(self, path):
        """Writes the report as JSON, into a temporary file renamed when complete (a kill
        during the write leaves the previous file or none)."""
        write_json_atomically(path, dataclasses.asdict(self), indent=2)

    @classmethod
    def load(cls, path):
        """Reads a report `save` wrote."""
        return cls(**json.loads(pathlib.Path(path).read_text()))


def scan_split(source, split, source_tokenizer, target_tokenizer, max_length, batching,
               drop_long=True, limit=None, log=None):
    """Counts one split in a streaming pass: its `SplitReport` and its batches per pass.

    Args:
        source: a `ParallelSource`.
        split: str.
        source_tokenizer: the source `SubwordTokenizer`.
        target_tokenizer: the target `SubwordTokenizer`.
        max_length: int, longest sequence incl. START/END.
        batching: dict of `batch_plan` arguments (`batch_size`, `tokens_per_batch`,
            `bucket_boundaries`, `batch_multiple`) and `drop_remainder`.
        drop_long: bool, count over-long pairs as dropped (`too_long`), else as cut
            (`truncated`). Defaults to `True`.
        limit: int or None, only the first `limit` kept pairs.
        log: callable taking a str, or None: told the progress every
            `_SCAN_PROGRESS_EVERY` pairs. Defaults to `None`.

    Returns:
        `(SplitReport, num_batches)`.

    Raises:
        DataError: when no pair of the split is kept.
    """
    report = SplitReport()
    source_lang, target_lang = source.source_lang, source.target_lang

    def lengths(pairs):
        source_ids = source_tokenizer.tokenize(pairs[source_lang])
        target_ids = target_tokenizer.tokenize(pairs[target_lang])
        # encoder = source + END, decoder = START + target, labels = target + END.
        return tf.maximum(source_ids.row_lengths(), target_ids.row_lengths()) + 1

    errors = []  # the reader's DataError, raised here rather than by tf.data
    dataset = (source.dataset(split, report, limit=limit, errors=errors).batch(_SCAN_CHUNK)
               .map(lengths, num_parallel_calls=tf.data.AUTOTUNE))
    # A histogram of lengths, not a list: memory stays constant for any corpus size.
    histogram, too_long, longest = np.zeros(max_length + 1, np.int64), 0, 0
    counted, next_log, started = 0, _SCAN_PROGRESS_EVERY, time.perf_counter()
    for chunk in dataset.as_numpy_iterator():
        counted += len(chunk)
        if log is not None and counted >= next_log:
            log(f"Counting the {split} split: {counted:,} pairs so far "
                f"({time.perf_counter() - started:.0f} s)")
            next_log = (counted // _SCAN_PROGRESS_EVERY + 1) * _SCAN_PROGRESS_EVERY
        too_long += int(np.sum(chunk > max_length))  # dropped, or cut to max_length
        if drop_long:
            longest = max(longest, int(chunk.max(initial=0)))
            chunk = chunk[chunk <= max_length]
        histogram += np.bincount(np.minimum(chunk, max_length), minlength=max_length + 1)
    if errors:
        raise errors[0]
    if drop_long:
        for _ in range(too_long):
            report.drop("too_long")
    else:
        report.truncated = too_long
    if report.kept == 0:
        advice = ""
        if too_long:  # every pair the reader kept
            advice = (f"; every pair is longer than max_length={max_length} tokens (the "
                      f"longest: {longest}): train with --set max_length={longest}, or "
                      "drop_long_pairs=false to cut pairs to max_length")
        raise DataError(f"No usable sentence pair in {report.origin}: {report}{advice}")
    boundaries, sizes = batch_plan(
        max_length, batching.get("batch_size") or 64, batching.get("tokens_per_batch"),
        batching.get("bucket_boundaries"), batching.get("batch_multiple", 1))
    num_batches = count_batches(np.arange(max_length + 1), boundaries, sizes,
                                batching.get("drop_remainder", False), counts=histogram)
    if num_batches == 0:
        raise DataError(f"{report.origin} gives no complete batch: {report}")
    return report, num_batches


def data_file_stats(spec, splits):
    """`{path: [size, mtime_ns]}` of a source's local files (`data_files`) of `splits` (those
    the report counts: a test set, neither counted nor trained on, may be corrected during a
    run), so that a report counted before the files were edited is not reused; `{}` for
    other sources."""
    paths = []
    for split, entry in (spec.get("data_files") or {}).items():
        if split in splits:
            paths.extend([entry] if isinstance(entry, str) else entry)
    stats = {}
    for path in paths:
        try:
            status = os.stat(path)
        except OSError:
            continue  # reading it will say what is wrong
        stats[str(path)] = [status.st_size, status.st_mtime_ns]
    return stats


def _check_unchanged(cached, stats):
    """Raises `DataError` if a data file whose size or time changed since `cached` was
    counted has other content now: the run's vocabulary and trained epochs were made from
    the old content, and resuming would mix the two silently."""
    old_stats = cached.fingerprint.get("files", {})
    for path, digest in cached.digests.items():
        if path not in stats or stats[path] == old_stats.get(path):
            continue  # a test set (older reports hold theirs), unchanged, or missing
        if file_digest(path) != digest:
            raise DataError(
                f"{path} changed since this run started: its content is not what the run's "
                "vocabulary and trained epochs were made from. Restore the file, or train a "
                "new run on it (another --output, or --overwrite)."
            )


def prepare_data_report(source, config, source_tokenizer, target_tokenizer, output_dir,
                        replicas=1, splits=("train", "validation"), resuming=False, log=None):
    """The run's `DataReport`: read from `output_dir/data_report.json` or counted and saved.

    Files edited since the report was counted are counted again; but a run `resuming`
    after trained epochs on local data files whose content changed (the same paths, other
    sentences) is refused. Files only copied or touched (the same bytes at another time)
    keep the report.

    Args:
        source: the run's `ParallelSource`.
        config: `TrainingConfig`.
        source_tokenizer: the source tokenizer.
        target_tokenizer: the target tokenizer.
        output_dir: the run directory.
        replicas: int, batch sizes are multiples of it. Defaults to `1`.
        splits: the splits to count (those the source has). Defaults to train and
            validation.
        resuming: bool, whether the run has trained epochs (resumed or continued).
            Defaults to `False`.
        log: callable taking a str, or None: told the counting's progress (`scan_split`).
            Defaults to `None`.

    Returns:
        A `DataReport`.

    Raises:
        DataError: `resuming`, and a data file's content changed since the report was
            counted.
    """
    batching = dict(batch_size=config.batch_size or 64, tokens_per_batch=config.tokens_per_batch,
                    bucket_boundaries=list(config.bucket_boundaries or []) or None,
                    batch_multiple=replicas)
    fingerprint = dict(source=source.spec(), reader_rules=READER_RULES,
                       max_length=config.max_length,
                       train_subset=config.train_subset, drop_long=config.drop_long_pairs,
                       files=data_file_stats(source.spec(), splits), **batching)
    path = pathlib.Path(output_dir) / REPORT_FILENAME
    if path.is_file():
        try:
            cached = DataReport.load(path)
        except (ValueError, TypeError):  # unreadable (an older writer killed mid-write)
            cached = None
        fingerprint = json.loads(json.dumps(fingerprint))
        if cached is not None and cached.fingerprint == fingerprint:
            return cached
        if cached is not None and resuming and set(cached.digests) >= set(fingerprint["files"]):
            _check_unchanged(cached, fingerprint["files"])
            if {**cached.fingerprint, "files": fingerprint["files"]} == fingerprint:
                cached.fingerprint = fingerprint  # the same bytes at a new time
                cached.save(path)
                return cached
    counts, batches = {}, {}
    for split in (s for s in splits if s in source.splits()):
        report, batches[split] = scan_split(
            source, split, source_tokenizer, target_tokenizer, config.max_length, batching,
            drop_long=config.drop_long_pairs,
            limit=config.train_subset if split == "train" else None, log=log)
        counts[split] = report.to_dict()
    data_report = DataReport(source=source.spec(), splits=counts, batches=batches,
                             fingerprint=fingerprint,
                             digests={path: file_digest(path) for path in fingerprint["files"]})
    data_report.save(path)
    return data_report


__all__ = ["CACHE_MAX_PAIRS", "DataReport", "REPORT_FILENAME", "data_file_stats",
           "open_run_source", "prepare_data_report", "scan_split"]

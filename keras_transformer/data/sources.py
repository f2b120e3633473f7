"""Where sentence pairs come from: parallel files, a TSV file, any TFDS translation dataset,
or Multi30K, behind one interface chosen by the run's config.

Every source has the same few methods: `splits()` names its splits (`train`,
`validation`, then its test sets), `check()` validates the files before anything is trained
(line counts, empty files), `pairs(split)` streams `(source, target)` str pairs, and
`dataset(split)` wraps that stream as a `tf.data.Dataset` of `{source_lang: string,
target_lang: string}` scalars, what `make_translation_dataset` consumes. Nothing reads a
whole split into memory. Bad input follows the rules of `keras_transformer.data.readers`.

`spec()` returns the JSON-serializable description the run directory and the export
record (`data`, `data_files`, `source_lang`, `target_lang`), from which `open_source` opens
the same source again, e.g. for `keras-transformer evaluate`.

Example:

>>> _ = pathlib.Path("train.fr").write_text("Un chien court.\\nUn chat dort.\\n")
>>> _ = pathlib.Path("train.en").write_text("A dog runs.\\nA cat sleeps.\\n")
>>> source = open_source("files", {"train": ["train.fr", "train.en"]})
>>> source.source_lang, source.target_lang
('fr', 'en')
>>> source.splits()
['train']
>>> next(source.pairs("train"))
('Un chien court.', 'A dog runs.')
"""

import itertools
import os
import pathlib

import numpy as np
import tensorflow as tf

from keras_transformer.data import multi30k
from keras_transformer.data.readers import (
    DataError,
    SplitReport,
    check_parallel_files,
    decode_utf8,
    keep_pair,
    read_parallel_files,
    read_tsv,
)
from keras_transformer.languages import language_from_path, languages_from_paths

# Data source kinds of `TrainingConfig.data` (plus `tfds:<name>`).
KINDS = ("multi30k", "files", "tsv")
TFDS_PREFIX = "tfds:"
# Pairs per Python -> tf.data hand-over: one generator call per chunk, not per pair.
_CHUNK_PAIRS = 512
# Other names of the validation split, in the order they are looked for.
VALIDATION_NAMES = ("validation", "valid", "val", "dev")
# Multi30K's direction when a config names no languages.
MULTI30K_DIRECTION = ("en", "de")


def _canonical_split(split, names):
    """Maps `val`/`dev`/`valid` to the validation split and `test` to the first test set."""
    if split in names:
        return split
    if split in VALIDATION_NAMES:
        return next((n for n in VALIDATION_NAMES if n in names), split)
    if split == "test":
        tests = [n for n in names if n not in ("train", *VALIDATION_NAMES)]
        if tests:
            return tests[0]
    return split


class ParallelSource:
    """Base class: a named set of splits of sentence pairs in one direction.

    Subclasses implement `splits()` and `_read(split, report, keep_all)`.

    Args:
        source_lang: str, the source language code (the key of `dataset()` examples).
        target_lang: str, the target language code.
    """

    kind = None

    def __init__(self, source_lang, target_lang):
        if not source_lang or not target_lang or source_lang == target_lang:
            raise ValueError(
                "Source and target languages must be two different codes, got "
                f"source_lang={source_lang!r}, target_lang={target_lang!r}."
            )
        self.source_lang, self.target_lang = source_lang, target_lang

    def splits(self):
        """list of str: `train`, `validation`, then the test sets."""
        raise NotImplementedError

    def test_sets(self):
        """list of str: the splits other than train and validation."""
        return [s for s in self.splits() if s not in ("train", "validation")]

    def resolve(self, split):
        """The canonical name of `split` (`val` -> `validation`, `test` -> first test set).

        Raises:
            ValueError: when the source has no such split, listing the ones it has.
        """
        canonical = _canonical_split(split, self.splits())
        if canonical not in self.splits():
            raise ValueError(
                f"{self.describe()} has no split {split!r}; it has {self.splits()}."
            )
        return canonical

    def check(self, splits=("train", "validation")):
        """Validates the files of `splits` cheaply before training (no-op by default)."""

    def check_directions(self, splits=None):
        """Raises `ValueError` when the files of `splits` (None: every split) are named the
        other way round from the source's direction (files only: nothing else has names).
        A new run checks every split, `evaluate` the one it scores; resuming does not, so a
        run made before this check still resumes."""

    def origin(self, split):
        """str, where `split` is read from (for reports and messages)."""
        return f"{self.describe()}[{split}]"

    def pairs(self, split, report=None, keep_all=False, limit=None):
        """Streams the `(source, target)` str pairs of a split.

        Args:
            split: str, a split name (see `resolve`).
            report: `SplitReport` or None, counts what is read, kept, dropped, repaired.
            keep_all: bool, yield blank and one-sided pairs too (evaluation keeps line i
                aligned with reference i). Defaults to `False`.
            limit: int or None, stop after this many pairs (`train_subset`). Defaults to
                `None` (all).

        Returns:
            An iterator of `(source, target)` pairs.
        """
        split = self.resolve(split)
        if report is None:
            report = SplitReport()
        report.origin = report.origin or self.origin(split)
        return self._read_at_most(split, report, keep_all, limit)

    def _read(self, split, report, keep_all):
        raise NotImplementedError

    def _read_at_most(self, split, report, keep_all, limit):
        """`_read`'s first `limit` pairs; a source that judges what it read when it stops
        (a TSV's quoting) reads to the limit itself."""
        return itertools.islice(self._read(split, report, keep_all), limit)

    def dataset(self, split, report=None, limit=None, errors=None):
        """The pairs of a split as a `tf.data.Dataset` of `{lang: tf.string}` scalars.

        The Python reader hands pairs to tf.data in chunks; everything after it
        (tokenization, batching) runs in parallel in tf.data. Each iteration (each epoch)
        reads the files again from the start, so memory does not grow with the corpus.

        Args:
            split: str, a split name.
            report: `SplitReport` or None, filled as the dataset is iterated.
            limit: int or None, stop after this many kept pairs (`train_subset`).
            errors: list or None: a `DataError` of the reader ends the dataset and is
                appended here, for the caller to raise once it has iterated (tf.data would
                raise it as a TensorFlow `InvalidArgumentError` with the reader's traceback
                in its message). None: raised by tf.data.

        Returns:
            A `tf.data.Dataset` of `{source_lang: string, target_lang: string}`.
        """
        split = self.resolve(split)
        source_lang, target_lang = self.source_lang, self.target_lang

        def chunks():
            try:
                yield from pair_chunks()
            except DataError as error:
                if errors is None:
                    raise
                errors.append(error)

        def pair_chunks():
            sources, targets = [], []
            for source, target in self.pairs(split, report, limit=limit):
                sources.append(source)
                targets.append(target)
                if len(sources) == _CHUNK_PAIRS:
                    yield {source_lang: np.array(sources, object),
                           target_lang: np.array(targets, object)}
                    sources, targets = [], []
            if sources:
                yield {source_lang: np.array(sources, object),
                       target_lang: np.array(targets, object)}

        spec = tf.TensorSpec([None], tf.string)
        return tf.data.Dataset.from_generator(
            chunks, output_signature={source_lang: spec, target_lang: spec}
        ).unbatch()

    def describe(self):
        """str, a short description such as `files fr->en`."""
        return f"{self.kind} {self.source_lang}->{self.target_lang}"

    def spec(self):
        """dict, the JSON-serializable description `open_source(**spec)` reopens."""
        return {"data": self.kind, "data_files": None, "source_lang": self.source_lang,
                "target_lang": self.target_lang}


def _ordered_splits(names):
    """train, validation first (when present), then the others in their given order."""
    return [n for n in ("train", "validation") if n in names] + [
        n for n in names if n not in ("train", "validation")]


def check_file_directions(files, source_lang, target_lang):
    """Raises `ValueError` when a split's files are named the other way round from
    `source_lang` -> `target_lang` (`dev.en dev.fr` in a fr->en run): a model would be
    validated, or scored, on the reverse direction.

    Args:
        files: dict `{split: (source_path, target_path)}`.
        source_lang: str or None; nothing is checked unless both languages are known.
        target_lang: str or None.
    """
    if not (source_lang and target_lang) or source_lang == target_lang:
        return
    for split, (source_path, target_path) in files.items():
        named = [language_from_path(source_path), language_from_path(target_path)]
        if named == [target_lang, source_lang]:
            raise ValueError(
                f"The {split!r} files {source_path} ({named[0]}) and {target_path} "
                f"({named[1]}) are named the other way round from {source_lang}->"
                f"{target_lang} (source_lang={source_lang!r}, target_lang={target_lang!r}): "
                "give the source file first.")


class FileSource(ParallelSource):
    """Parallel text files, one sentence per line, plain or `.gz`, split by split.

    Args:
        files: dict `{split: (source_path, target_path)}`; `validation` may be named
            `valid`/`val`/`dev`; any other name is a test set.
        source_lang: str or None, source language code. Defaults to the suffix of the
            source file name (`train.fr.gz` -> `fr`).
        target_lang: str or None, target language code, likewise.
    """

    kind = "files"

    def __init__(self, files, source_lang=None, target_lang=None):
        self.files = {
            ("validation" if name in VALIDATION_NAMES else name): tuple(map(str, paths))
            for name, paths in files.items()
        }
        for name, paths in self.files.items():
            if len(paths) != 2:
                raise ValueError(f"Split {name!r} needs a source and a target file, got {paths}.")
        if "train" in self.files:
            check_file_directions({"train": self.files["train"]}, source_lang, target_lang)
            if not (source_lang and target_lang):
                named = languages_from_paths(*self.files["train"])
                source_lang = source_lang or named[0]
                target_lang = target_lang or named[1]
        if not (source_lang and target_lang):
            raise ValueError(
                "Could not tell the languages from the file names; give source_lang and "
                "target_lang (--source-lang/--target-lang)."
            )
        super().__init__(source_lang, target_lang)

    def splits(self):
        return _ordered_splits(list(self.files))

    def origin(self, split):
        return " + ".join(self.files[split])

    def check_directions(self, splits=None):
        check_file_directions({split: self.files[self.resolve(split)]
                               for split in (self.splits() if splits is None else splits)},
                              self.source_lang, self.target_lang)

    def check(self, splits=("train", "validation")):
        """Raises `DataError` on missing, empty or misaligned files of `splits`."""
        for split in splits:
            for path in self.files[self.resolve(split)]:
                if not os.path.isfile(path):
                    raise DataError(f"{path} ({split}) does not exist.")
            check_parallel_files(*self.files[self.resolve(split)])

    def _read(self, split, report, keep_all):
        return read_parallel_files(*self.files[split], report, keep_all=keep_all)

    def spec(self):
        return dict(super().spec(), data_files={k: list(v) for k, v in self.files.items()})


class TsvSource(ParallelSource):
    """Tab-separated files, `source<TAB>target` per line, plain or `.gz`.

    Args:
        files: dict `{split: path}` (validation names as for `FileSource`).
        source_lang: str, source language code (a TSV file name does not say it).
        target_lang: str, target language code.
    """

    kind = "tsv"

    def __init__(self, files, source_lang, target_lang):
        self.files = {("validation" if n in VALIDATION_NAMES else n): str(p)
                      for n, p in files.items()}
        super().__init__(source_lang, target_lang)

    def splits(self):
        return _ordered_splits(list(self.files))

    def origin(self, split):
        return self.files[split]

    def check(self, splits=("train", "validation")):
        """Raises `DataError` on a missing file of `splits`, and on an empty or malformed one
        (a line without exactly one tab) other than `train` (read through: test and
        validation sets are small; training's is read while it is counted)."""
        for split in splits:
            canonical = self.resolve(split)
            path = self.files[canonical]
            if not os.path.isfile(path):
                raise DataError(f"{path} ({split}) does not exist.")
            if canonical != "train":
                for _ in read_tsv(path, SplitReport(), keep_all=True):
                    pass

    def _read_at_most(self, split, report, keep_all, limit):
        return read_tsv(self.files[split], report, keep_all=keep_all, limit=limit)

    def spec(self):
        return dict(super().spec(), data_files=dict(self.files))


class Multi30kSource(ParallelSource):
    """Multi30K task 1 in any direction between en, de, fr and cs, with every test set.

    Files are found locally first, else downloaded and verified (see
    `keras_transformer.data.multi30k.multi30k_split_files`).

    Args:
        source_lang: str, one of `en`, `de`, `fr`, `cs`. Defaults to `"en"`.
        target_lang: str, another one. Defaults to `"de"`.
        local_dir: str or path-like or None, the directory holding the raw `.gz` files.
    """

    kind = "multi30k"

    def __init__(self, source_lang="en", target_lang="de", local_dir=None):
        super().__init__(source_lang, target_lang)
        self._splits = multi30k.multi30k_splits(source_lang, target_lang)
        self.local_dir = local_dir

    def splits(self):
        return list(self._splits)

    def resolve(self, split):
        return super().resolve(multi30k.SPLIT_ALIASES.get(split, split))

    def _files(self, split):
        return multi30k.multi30k_split_files(
            self.source_lang, self.target_lang, split, self.local_dir)

    def origin(self, split):
        return f"multi30k {split} {self.source_lang}->{self.target_lang}"

    def check(self, splits=("train", "validation")):
        """Finds (or downloads) the files of `splits`, raising one error naming all missing."""
        missing = []
        for split in splits:
            try:
                check_parallel_files(*self._files(self.resolve(split)))
            except multi30k.Multi30kNotFoundError as error:
                missing.append(str(error))
        if missing:
            raise multi30k.Multi30kNotFoundError("\n".join(missing))

    def _read(self, split, report, keep_all):
        return read_parallel_files(*self._files(split), report, keep_all=keep_all)


class TfdsSource(ParallelSource):
    """Any TFDS translation dataset, e.g. `ted_hrlr_translate/pt_to_en`.

    The language keys come from the dataset: its supervised keys (source, target) unless
    `source_lang`/`target_lang` pick two other keys of its features (so `en->pt` of a
    `pt_to_en` dataset works too). Splits: `train`; the validation split is the one named
    `validation` (or `valid`/`val`/`dev`); every other split is a test set.

    Args:
        name: str, the TFDS name with config, e.g. `"wmt14_translate/de-en"`.
        source_lang: str or None. Defaults to the first supervised key.
        target_lang: str or None. Defaults to the second supervised key.
        data_dir: str or None, TFDS data directory. Defaults to TFDS' own.
        download: bool, run `download_and_prepare()` first. Defaults to `True`.
    """

    def __init__(self, name, source_lang=None, target_lang=None, data_dir=None, download=True):
        import tensorflow_datasets as tfds

        self.name = name
        self.kind = TFDS_PREFIX + name
        try:
            self._builder = tfds.builder(name, data_dir=os.fspath(data_dir) if data_dir else None)
        except tfds.core.registered.DatasetNotFoundError as error:
            # Its message lists the whole catalogue (thousands of lines' worth); keep the
            # suggestion.
            suggestion = [line for line in str(error).splitlines()
                          if line.startswith("Did you mean")]
            raise ValueError(
                f"No TFDS dataset named {name.split('/')[0]!r}. {' '.join(suggestion)} The "
                "catalogue: https://www.tensorflow.org/datasets/catalog (or "
                "tfds.list_builders())."
            ) from None
        info = self._builder.info
        keys = list(getattr(info.features, "languages", None) or info.features.keys())
        supervised = tuple(info.supervised_keys or ())
        source_lang = source_lang or (supervised[0] if supervised else None)
        target_lang = target_lang or (supervised[1] if len(supervised) > 1 else None)
        for lang in (source_lang, target_lang):
            if lang not in keys:
                raise ValueError(
                    f"tfds:{name} has language keys {keys}, not {lang!r}; pick two of them "
                    "with --source-lang/--target-lang."
                )
        super().__init__(source_lang, target_lang)
        if download:
            self._builder.download_and_prepare()
        # Mocked or not-yet-described datasets list no splits: use the usual three.
        self._split_names = list(info.splits.keys()) or ["train", "validation", "test"]

    def splits(self):
        names = ["validation" if n in VALIDATION_NAMES else n for n in self._split_names]
        return _ordered_splits(names)

    def _tfds_split(self, split):
        if split == "validation":
            return next(n for n in self._split_names if n in VALIDATION_NAMES)
        return split

    def _read(self, split, report, keep_all):
        where = f"tfds:{self.name}[{split}]"
        examples = self._builder.as_dataset(split=self._tfds_split(split), shuffle_files=False)
        for index, example in enumerate(examples.as_numpy_iterator()):
            source = decode_utf8(example[self.source_lang], f"{where} example {index}")
            target = decode_utf8(example[self.target_lang], f"{where} example {index}")
            pair = keep_pair(source, target, report)
            if keep_all:
                yield source.strip(), target.strip()
            elif pair is not None:
                yield pair


def open_source(data="multi30k", data_files=None, source_lang=None, target_lang=None,
                local_dir=None, tfds_dir=None):
    """Opens the data source a run's config names.

    Args:
        data: str, `"multi30k"`, `"files"`, `"tsv"` or `"tfds:<name>"`. Defaults to
            `"multi30k"`.
        data_files: dict or None, `{split: [source_path, target_path]}` for `files`,
            `{split: path}` for `tsv`; unused otherwise.
        source_lang: str or None, source language (see each source for its default).
        target_lang: str or None, target language.
        local_dir: str or None, Multi30K's raw-file directory.
        tfds_dir: str or None, TFDS data directory.

    Returns:
        A `ParallelSource`.

    Raises:
        ValueError: an unknown kind, or files missing for `files`/`tsv`.

    Example:

    >>> _ = pathlib.Path("pairs.tsv").write_text("Ein Hund läuft.\\tA dog runs.\\n")
    >>> source = open_source("tsv", {"train": "pairs.tsv"}, source_lang="de",
    ...                      target_lang="en")
    >>> list(source.pairs("train"))
    [('Ein Hund läuft.', 'A dog runs.')]
    >>> open_source("multi30k").spec()["source_lang"]  # Multi30K: en->de by default
    'en'

    (`open_source("tfds:ted_hrlr_translate/pt_to_en")` opens a TFDS dataset, its
    languages read from the supervised keys: `('pt', 'en')`.)
    """
    if data == "multi30k":
        return Multi30kSource(source_lang or MULTI30K_DIRECTION[0],
                              target_lang or MULTI30K_DIRECTION[1], local_dir=local_dir)
    if data.startswith(TFDS_PREFIX):
        return TfdsSource(data[len(TFDS_PREFIX):], source_lang, target_lang, data_dir=tfds_dir)
    if data in ("files", "tsv"):
        if not data_files or "train" not in data_files:
            raise ValueError(f"data={data!r} needs data_files with at least a 'train' split.")
        if data == "files":
            return FileSource(data_files, source_lang, target_lang)
        return TsvSource(data_files, source_lang, target_lang)
    raise ValueError(f"Unknown data source {data!r}: use one of {KINDS} or 'tfds:<name>'.")


__all__ = ["FileSource", "Multi30kSource", "ParallelSource", "TfdsSource", "TsvSource",
           "language_from_path", "open_source"]

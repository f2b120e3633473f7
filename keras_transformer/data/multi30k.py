"""Multi30K task 1: every language (en, de, fr, cs), every published test set, and the
TFDS builder of the original English-German splits.

`multi30k_split_files(source_lang, target_lang, split, local_dir)` finds (or downloads and
verifies) the raw files of one split in any direction; `Multi30kSource` in
`keras_transformer.data.sources` streams them for training. The TFDS builder `Multi30k`
(and `load_multi30k`) keeps serving the original En-De splits.

`checksums.tsv` records the URL, size and SHA-256 of all 22 raw files of task 1 (train, val
and the four test sets in each language that has them). The en/de files were checked
against the local copy in `shared/data/multi30k`; the fr/cs files and the 2017/2018 test
sets were hashed from the `multi30k/dataset` repository (commit a3d2e0d, the raw files are
unchanged since 2018) and are verified on download. A file without a checksum entry is
refused rather than used unverified.

Where there is internet the raw files are downloaded from the `multi30k/dataset`
repository and verified against `checksums.tsv` (next to this file). Where there is none
they are read from a local copy of the same unmodified `.gz` files, found in this order:

1. an explicit directory (`load_multi30k(local_dir=...)`, `Multi30k(local_dir=...)`);
2. the TFDS manual directory (`tfds.download.DownloadConfig(manual_dir=...)`, by default
   `<data_dir>/downloads/manual`), if it holds the files;
3. the environment variable `KERAS_TRANSFORMER_MULTI30K_DIR`;
4. `shared/data/multi30k` in the repository root, the current working directory or any
   of their parents (so `../shared/data/multi30k` next to a checkout is found).

A local copy is always preferred to the network. With neither, preparation fails with one
`Multi30kNotFoundError` that says how to provide the files.
"""

import gzip
import itertools
import os
import pathlib
import socket

import tensorflow_datasets as tfds
from etils import epath

from keras_transformer.textfiles import remove_stale_partials, write_bytes_atomically

# Where the raw files are served from: `<_BASE_URL><stem>.<lang>.gz`.
_BASE_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
# Host probed before downloading: a quick connect tells "offline" from a slow download.
_DOWNLOAD_HOST = ("raw.githubusercontent.com", 443)
# Seconds the probe waits; the network of an offline machine may hang instead of failing.
_PROBE_TIMEOUT = 5.0
# The environment variable naming a local copy of the raw files.
ENV_VAR = "KERAS_TRANSFORMER_MULTI30K_DIR"
# Relative location of the shared copy, searched upwards from the repository and the cwd.
_SHARED_RELATIVE_PATH = pathlib.Path("shared", "data", "multi30k")
# TFDS split name -> file stem of the raw files.
SPLIT_FILES = {"train": "train", "validation": "val", "test_2016": "test_2016_flickr"}
# Other names accepted by `load_multi30k` for the same splits.
_SPLIT_ALIASES = {"val": "validation", "valid": "validation", "test": "test_2016"}
# The languages of task 1 (the raw files hold English-German only).
LANGUAGES = ("en", "de")

_CITATION = """\
@inproceedings{elliott-etal-2016-multi30k,
  title = {Multi30K: Multilingual English-German Image Descriptions},
  author = {Elliott, Desmond and Frank, Stella and Sima'an, Khalil and Specia, Lucia},
  booktitle = {Proceedings of the 5th Workshop on Vision and Language},
  year = {2016},
  pages = {70--74},
}
"""

_INSTRUCTIONS = f"""\
Multi30K task 1 raw files were not found and could not be downloaded.
Provide the six unmodified files {{train,val,test_2016_flickr}}.{{en,de}}.gz (the
data/task1/raw/ folder of https://github.com/multi30k/dataset) in a directory, then any
one of:
  * set the environment variable {ENV_VAR}=/path/to/dir;
  * pass it explicitly: load_multi30k(split, local_dir="/path/to/dir") (or the trainer's
    data directory option, or Multi30k(local_dir=...));
  * use it as the TFDS manual directory: download_and_prepare(download_config=
    tfds.download.DownloadConfig(manual_dir="/path/to/dir")), or copy the files into
    <data_dir>/downloads/manual/;
  * put it at shared/data/multi30k next to the repository (../shared/data/multi30k).
"""


class Multi30kNotFoundError(FileNotFoundError):
    """No local copy of Multi30K was found and the files could not be downloaded."""


# Every language of task 1.
ALL_LANGUAGES = ("en", "de", "fr", "cs")
# Published test sets -> the languages they exist in (test_2017_* were never made in Czech).
TEST_SETS = {
    "test_2016_flickr": ("en", "de", "fr", "cs"),
    "test_2017_flickr": ("en", "de", "fr"),
    "test_2017_mscoco": ("en", "de", "fr"),
    "test_2018_flickr": ("en", "de", "fr", "cs"),
}
# Split name -> file stem, for every split of `multi30k_split_files`.
ALL_SPLIT_FILES = {"train": "train", "validation": "val", **{t: t for t in TEST_SETS}}
# Short names accepted for the same splits.
SPLIT_ALIASES = {
    "val": "validation", "valid": "validation", "dev": "validation",
    "test": "test_2016_flickr", "test_2016": "test_2016_flickr",
    "test_2017": "test_2017_flickr", "test_2018": "test_2018_flickr",
}
# Where downloaded files are kept when there is no local copy.
CACHE_ENV_VAR = "KERAS_TRANSFORMER_CACHE"
_DEFAULT_CACHE = pathlib.Path("~", ".cache", "keras_transformer", "multi30k")


def _read_checksums():
    """`{file name: (size, sha256)}` from `checksums.tsv` next to this module."""
    table = {}
    for line in (pathlib.Path(__file__).with_name("checksums.tsv")).read_text().splitlines():
        if line.strip():
            _url, size, sha256, name = line.split("\t")
            table[name] = (int(size), sha256)
    return table


def multi30k_splits(source_lang, target_lang):
    """The split names that exist for a language pair: train, validation, its test sets."""
    for lang in (source_lang, target_lang):
        if lang not in ALL_LANGUAGES:
            raise ValueError(
                f"Multi30K task 1 has languages {ALL_LANGUAGES}, got {lang!r}."
            )
    tests = [t for t, langs in TEST_SETS.items() if {source_lang, target_lang} <= set(langs)]
    return ["train", "validation", *tests]


def _cache_dir():
    base = os.environ.get(CACHE_ENV_VAR)
    return (pathlib.Path(base) / "multi30k" if base else _DEFAULT_CACHE).expanduser()


def _candidate_dirs(local_dir):
    """Directories searched for raw files, in order (an explicit one alone)."""
    if local_dir:
        return [pathlib.Path(local_dir)]
    dirs = [pathlib.Path(os.environ[ENV_VAR])] if os.environ.get(ENV_VAR) else []
    dirs += [root / _SHARED_RELATIVE_PATH for root in _search_roots()]
    return dirs + [_cache_dir()]


def _download_verified(name, directory, checksums):
    """Downloads one raw file into `directory`, verifying its size and SHA-256."""
    import hashlib
    import urllib.request

    size, sha256 = checksums[name]
    directory.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(_BASE_URL + name, timeout=60) as response:
        data = response.read()
    if len(data) != size or hashlib.sha256(data).hexdigest() != sha256:
        raise Multi30kNotFoundError(
            f"Downloaded {name} does not match checksums.tsv (size {len(data)} vs {size})."
        )
    remove_stale_partials(directory)  # of downloads killed before
    write_bytes_atomically(directory / name, data)
    return directory / name


def multi30k_split_files(source_lang, target_lang, split, local_dir=None):
    """The source and target raw files of one Multi30K split, local copy first.

    Each file is looked for in `local_dir` when given (only there), else in
    `$KERAS_TRANSFORMER_MULTI30K_DIR`, `shared/data/multi30k` upwards from the repository and
    the cwd, and the download cache (`$KERAS_TRANSFORMER_CACHE/multi30k` or
    `~/.cache/keras_transformer/multi30k`). Missing files are downloaded into the cache
    where there is internet and verified against `checksums.tsv`.

    Args:
        source_lang: str, one of `en`, `de`, `fr`, `cs`.
        target_lang: str, another of them.
        split: str, `train`, `validation` or a test set of `TEST_SETS` (short names of
            `SPLIT_ALIASES` too: `val`, `test` = `test_2016_flickr`, `test_2017`...).
        local_dir: str or path-like or None, the only directory to look in.

    Returns:
        `(source_path, target_path)`, two `pathlib.Path`s.

    Raises:
        ValueError: a language or split Multi30K does not have (e.g. `test_2017_mscoco`
            in Czech).
        Multi30kNotFoundError: files missing offline; the message names every missing file
            and where to put it.

    Example:

    >>> multi30k_split_files("en", "de", "test")
    (PosixPath('.../test_2016_flickr.en.gz'), PosixPath('.../test_2016_flickr.de.gz'))
    >>> multi30k_split_files("cs", "en", "test_2017_mscoco")
    Traceback (most recent call last):
    ...
    ValueError: Multi30K has no split 'test_2017_mscoco' for cs-en; it has ['train', ...].
    """
    split, names = _split_file_names(source_lang, target_lang, split)
    source, target = _find_files(names, f"{split} {source_lang}-{target_lang}", local_dir)
    return source, target


def _split_file_names(source_lang, target_lang, split):
    """`(split, [source file name, target file name])`, the split's alias resolved.

    Raises:
        ValueError: as `multi30k_split_files`.
    """
    split = SPLIT_ALIASES.get(split, split)
    available = multi30k_splits(source_lang, target_lang)
    if split not in available:
        raise ValueError(
            f"Multi30K has no split {split!r} for {source_lang}-{target_lang}; it has "
            f"{available}."
        )
    return split, [f"{ALL_SPLIT_FILES[split]}.{lang}.gz" for lang in (source_lang, target_lang)]


def _find_files(names, label, local_dir):
    """The paths of the Multi30K files `names`, in order, found (or downloaded) as
    `multi30k_split_files` describes; `label` names them in the error.

    Raises:
        Multi30kNotFoundError: as `multi30k_split_files`.
    """
    directories = _candidate_dirs(local_dir)
    found, missing = [], []
    for name in names:
        path = next((d / name for d in directories if (d / name).is_file()), None)
        (found if path else missing).append(path or name)
    download_error = None
    if missing and not local_dir and _network_available():
        checksums = _read_checksums()
        unverifiable = [n for n in missing if n not in checksums]
        if unverifiable:
            download_error = f"no checksum recorded for {unverifiable}"
        else:
            try:
                found += [_download_verified(n, _cache_dir(), checksums) for n in missing]
                missing = []
            except OSError as error:
                download_error = error
    if missing:
        where = f"the given directory {local_dir}" if local_dir else (
            f"one of: ${ENV_VAR}, shared/data/multi30k next to the repository, or "
            f"{_cache_dir()}")
        raise Multi30kNotFoundError(
            f"Multi30K {label}: missing file(s) "
            f"{', '.join(map(str, missing))} (looked in "
            f"{', '.join(str(d) for d in directories)}) and they could not be downloaded"
            + (f" ({download_error})" if download_error else "")
            + f". Download them from {_BASE_URL} (unmodified .gz files) and put them in "
            f"{where}."
        )
    by_name = {p.name: p for p in found}
    return [by_name[name] for name in names]


def multi30k_lines(split, lang, limit=None, local_dir=None):
    """One side of a Multi30K split as a list of sentences (lines stripped), file order.

    The file is found as `multi30k_split_files` finds it (so also downloaded where it is
    missing and there is internet), without the other language's; no TFDS preparation.
    For scripts that need sentences, not a `tf.data` pipeline (the decoding benchmarks read
    test_2016 this way).

    Args:
        split: str, as in `multi30k_split_files` (`test` = test_2016).
        lang: str, `en`, `de`, `fr` or `cs`.
        limit: int or None, the first `limit` lines only. Defaults to `None` (all).
        local_dir: str or path-like or None, the only directory to look in.

    Returns:
        list of str.

    Raises:
        As `multi30k_split_files`.

    Example:

    >>> multi30k_lines("test", "en", limit=1)
    ['A man in an orange hat starring at something.']
    """
    from keras_transformer.data.readers import iter_lines

    other = "de" if lang == "en" else "en"  # every split has English and German
    split, names = _split_file_names(lang, other, split)
    # Only this side's file: the other language's need not be there.
    (path,) = _find_files(names[:1], f"{split} {lang}", local_dir)
    return [line.strip() for line in itertools.islice(iter_lines(path), limit)]


def _file_names(languages=LANGUAGES):
    return [f"{stem}.{lang}.gz" for stem in SPLIT_FILES.values() for lang in languages]


def _holds_files(directory):
    directory = pathlib.Path(directory)
    return all((directory / name).is_file() for name in _file_names())


def _search_roots():
    """Repository root and cwd, each with all its parents, without duplicates."""
    repository_root = pathlib.Path(__file__).resolve().parents[2]
    roots = []
    for start in (repository_root, pathlib.Path.cwd().resolve()):
        for directory in (start, *start.parents):
            if directory not in roots:
                roots.append(directory)
    return roots


def find_local_multi30k(explicit=None):
    """Finds a local directory holding the six Multi30K task 1 raw files.

    Args:
        explicit: str or path-like, a directory to use. It must hold the files: asking
            for a directory and silently falling back to another would hide a mistake.
            Defaults to `None` (use `KERAS_TRANSFORMER_MULTI30K_DIR`, then search
            `shared/data/multi30k` upwards from the repository root and the cwd).

    Returns:
        The `pathlib.Path` of the directory, or `None` when no copy was found.

    Raises:
        Multi30kNotFoundError: `explicit` or the environment variable names a directory
            without the files.

    Example:

    >>> find_local_multi30k()  # the shared copy beside the repository
    PosixPath('.../shared/data/multi30k')
    """
    for given, origin in ((explicit, "the given directory"), (os.environ.get(ENV_VAR), ENV_VAR)):
        if given:
            if not _holds_files(given):
                missing = [n for n in _file_names() if not (pathlib.Path(given) / n).is_file()]
                raise Multi30kNotFoundError(
                    f"{origin} {given} lacks Multi30K files {missing}.\n{_INSTRUCTIONS}"
                )
            return pathlib.Path(given).resolve()
    for root in _search_roots():
        candidate = root / _SHARED_RELATIVE_PATH
        if _holds_files(candidate):
            return candidate
    return None


def _network_available():
    """True if the download host accepts a TCP connection within `_PROBE_TIMEOUT` s."""
    try:
        with socket.create_connection(_DOWNLOAD_HOST, timeout=_PROBE_TIMEOUT):
            return True
    except OSError:
        return False


class Multi30k(tfds.core.GeneratorBasedBuilder):
    """Multi30K task 1: 31K English-German image description pairs.

    Splits `train` (29,000 pairs), `validation` (1,014) and `test_2016` (1,000, the
    Flickr 2016 test set); features `{"en": Text, "de": Text}`, line i of one language
    translating line i of the other. See the module docstring for where the files come
    from.

    Args:
        local_dir: str or path-like, directory with the raw `.gz` files, used instead
            of the search and the download. Defaults to `None`.
        **kwargs: `tfds.core.GeneratorBasedBuilder` arguments (`data_dir`, `config`).

    Example:

    >>> builder = Multi30k(config="en-de", data_dir="tfds")
    >>> builder.download_and_prepare()
    Downloading and preparing dataset ...
    Dataset multi30k downloaded and prepared to tfds/multi30k/en-de/1.0.0. ...
    >>> ds = builder.as_dataset(split="validation")
    >>> int(ds.cardinality())
    1014
    """

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Task 1 raw files, En-De, splits train/validation/test_2016."}
    BUILDER_CONFIGS = [
        tfds.core.BuilderConfig(
            name="en-de",
            description="English-German sentence pairs (task 1 raw, cased, untokenized).",
        )
    ]
    DEFAULT_CONFIG_NAME = "en-de"
    MANUAL_DOWNLOAD_INSTRUCTIONS = _INSTRUCTIONS

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls):
        # TFDS finds `checksums.tsv` next to `code_path`. Its own lookup goes through
        # `importlib_resources`, which some installs lack; this file is the answer anyway.
        return epath.Path(__file__)

    def __init__(self, *, local_dir=None, **kwargs):
        self._local_dir = local_dir
        super().__init__(**kwargs)

    def _info(self):
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict(
                {lang: tfds.features.Text() for lang in LANGUAGES}
            ),
            supervised_keys=LANGUAGES,
            homepage="https://github.com/multi30k/dataset",
            citation=_CITATION,
            # Keep file order: line i of the test set stays aligned with published
            # references and outputs, and `as_dataset` reads the corpus as distributed.
            disable_shuffling=True,
        )

    def _local_copy(self, dl_manager):
        if self._local_dir:
            return find_local_multi30k(self._local_dir)
        try:
            manual_dir = dl_manager.manual_dir
        except (AssertionError, ValueError):  # TFDS: no or empty manual directory
            manual_dir = None
        if manual_dir is not None and _holds_files(manual_dir):
            return pathlib.Path(manual_dir)
        return find_local_multi30k()

    def _split_generators(self, dl_manager):
        local = self._local_copy(dl_manager)
        if local is not None:
            paths = {name: local / name for name in _file_names()}
        else:
            if not _network_available():
                raise Multi30kNotFoundError(_INSTRUCTIONS)
            try:
                paths = dl_manager.download({name: _BASE_URL + name for name in _file_names()})
            except Exception as error:  # a failed download is the same user problem
                raise Multi30kNotFoundError(f"{_INSTRUCTIONS}Download error: {error}") from error
        return {
            split: self._generate_examples(
                {lang: paths[f"{stem}.{lang}.gz"] for lang in LANGUAGES}
            )
            for split, stem in SPLIT_FILES.items()
        }

    def _generate_examples(self, paths):
        lines = {}
        for lang, path in paths.items():
            with gzip.open(os.fspath(path), "rt", encoding="utf-8") as f:
                lines[lang] = [line.rstrip("\r\n") for line in f]
        counts = {lang: len(v) for lang, v in lines.items()}
        if len(set(counts.values())) != 1:
            raise ValueError(f"Multi30K files are not parallel: line counts {counts}.")
        for index, texts in enumerate(zip(*(lines[lang] for lang in LANGUAGES))):
            yield index, dict(zip(LANGUAGES, texts))


def load_multi30k(split, data_dir=None, local_dir=None):
    """Prepares Multi30K (once) and returns one split as a `tf.data.Dataset`.

    Args:
        split: str, `"train"`, `"validation"` (or `"val"`) or `"test_2016"` (or
            `"test"`); TFDS slicing such as `"train[:1000]"` works.
        data_dir: str or path-like, where TFDS writes the prepared dataset. Defaults to
            `None` (TFDS' default, `~/tensorflow_datasets` or `$TFDS_DATA_DIR`).
        local_dir: str or path-like, directory with the raw `.gz` files. Defaults to
            `None` (manual dir, environment variable, shared copy, then download).

    Returns:
        A `tf.data.Dataset` of `{"en": tf.string, "de": tf.string}` scalars, in file
        order.

    Example:

    >>> ds = load_multi30k("validation", data_dir="tfds")
    >>> next(iter(ds))["en"].numpy().decode()
    'A group of men are loading cotton onto a truck'
    """
    name, bracket, rest = split.partition("[")
    split = _SPLIT_ALIASES.get(name, name) + bracket + rest
    builder = Multi30k(
        config="en-de",
        data_dir=os.fspath(data_dir) if data_dir is not None else None,
        local_dir=local_dir,
    )
    builder.download_and_prepare()
    return builder.as_dataset(split=split, shuffle_files=False)

"""Plain or gzip-compressed text files: opening them (bytes to read, text to write),
decoding their lines strictly, counting them, and the digest of a file's bytes; files
written whole or not at all (a partial file beside the target, renamed over it).

A module of its own, without TensorFlow: training's readers (`keras_transformer.data`) and
the translator of an export (`keras_transformer.export.inference`, which must not load
TensorFlow Datasets) both read files with it.
"""

import contextlib
import gzip
import hashlib
import io
import os
import pathlib
import re
import shutil
import zlib

# A UTF-8 byte order mark, which some Windows editors write at the start of a file.
UTF8_BOM = b"\xef\xbb\xbf"
# Read size when counting lines or hashing a file.
_READ_CHUNK = 1 << 20
# `.partial-PID-name`: where process PID writes `name` before renaming it into place.
_PARTIAL = re.compile(r"\.partial-(?P<pid>\d+)-.")


def partial_path(path):
    """Where this process writes `path` before renaming it into place: a hidden name beside
    it (same file system, so the rename is atomic) holding the process id, so that the
    partial file of a process killed mid-write can be told from one being written
    (`remove_stale_partials`). The name keeps `path`'s suffix (Keras and NumPy pick the
    format from it)."""
    path = pathlib.Path(path)
    return path.with_name(f".partial-{os.getpid()}-{path.name}")


def is_partial(name):
    """Whether the file name `name` is a partial file of an atomic write (`partial_path`):
    its process writes it now, or was killed while it did."""
    return _PARTIAL.match(name) is not None


def flush_to_disk(path):
    """`fsync`s a file or a directory: its content (a directory's: its names, a rename
    into it) is on the disk when this returns, not only in the page cache."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def replace_atomically(path, write):
    """Writes `path` whole or not at all: `write(partial)` writes `partial_path(path)`,
    renamed over `path` once complete. A kill or a full disk during the write leaves the
    previous file (or none), never a truncated one; a failed write leaves no partial file.
    The file is flushed to the disk before the rename and the rename after it, so that a
    machine that stops (a power loss, a hard stop) does not leave the name on an empty or
    truncated file either."""
    path = pathlib.Path(path)
    temporary = partial_path(path)
    try:
        write(temporary)
        if temporary.is_file():
            flush_to_disk(temporary)
        os.replace(temporary, path)
        flush_to_disk(path.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()


def write_bytes_atomically(path, data):
    """Writes `data` (bytes) to `path` whole or not at all (`replace_atomically`)."""
    replace_atomically(path, lambda temporary: temporary.write_bytes(data))


def _running(pid):
    try:
        os.kill(pid, 0)
    except PermissionError:  # another user's process
        return True
    except (ProcessLookupError, OverflowError):  # none, or no such process number
        return False
    return True


def remove_stale_partials(directory, keep_own=True, pattern=_PARTIAL):
    """Removes the partial files (and directories) in `directory` of processes that no
    longer run on this machine: what a kill -9 during an atomic write left. Returns the
    removed paths (none for a missing directory).

    `keep_own=False` removes this process's too, for a caller that knows it writes nothing
    there now (a run starting: in a container every start may get the same process id).
    `pattern`, a compiled regular expression with a `pid` group, matches other names of
    partial files (an export's staging directories)."""
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for path in directory.iterdir():
        match = pattern.match(path.name)
        if match is None:
            continue
        pid = int(match["pid"])
        if (keep_own if pid == os.getpid() else _running(pid)):
            continue
        with contextlib.suppress(FileNotFoundError):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(path)
    return removed


# `scheme://...`: written as a URL, which no local path is (`gs://b/m` as a path: `gs:/b/m`).
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path):
    """Whether `path` (str or path-like) is written as a URL (`gs://bucket/...`), which a
    local directory written in its place would silently not be."""
    return bool(_URL.match(os.fspath(path)))


def absolute_path(path):
    """`path` (str or path-like; `~` expanded) as an absolute path string with symlinks
    resolved: how the command line and `TrainingConfig.data_files` record data files, so a
    run started from one directory (or through a symlink) resumes from another."""
    return str(pathlib.Path(os.fspath(path)).expanduser().resolve())


def file_digest(path):
    """The BLAKE2b hex digest (16 bytes) of a file's bytes, read in blocks: whether a file's
    content changed, whatever its times say (the data report, an average's record)."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while block := f.read(_READ_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def decode_utf8(raw, where, error=ValueError, check_utf16=True):
    """Decodes UTF-8 bytes; on bytes that are not UTF-8 raises `error` (a `ValueError`
    class: training's readers pass `DataError`) naming `where` (file:line), the byte and how
    to convert the file.

    UTF-16 (Windows' "Unicode" text) is named as such: its byte order mark is not UTF-8, and
    without one its ASCII letters are, each followed by a NUL byte, which no sentence holds.
    `check_utf16=False` leaves that check to the caller (a reader that checked a file's
    first line: a later line's stray NULs are UTF-8).
    """
    if check_utf16:
        check_not_utf16(raw, where, error)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as bad:
        raise error(
            f"{where}: invalid UTF-8 (byte 0x{raw[bad.start]:02x} at offset {bad.start}). "
            "Find the file's encoding (`file -i FILE`; Windows editors write cp1252 for "
            "Western European, cp1251 for Cyrillic, shift_jis for Japanese) and convert it: "
            "`iconv -f ENCODING -t utf-8 FILE > FILE.utf8`. Converting from the wrong "
            "encoding gives text that reads as nonsense but trains."
        ) from bad


def check_not_utf16(raw, where, error=ValueError):
    """Raises `error` naming `where` (file:line) when a line's bytes are UTF-16's (a byte
    order mark, or NUL bytes for a quarter of them or more: UTF-16's Latin letters are half
    NULs, where a UTF-8 line may hold a stray one), even where other bytes that are not
    UTF-8 are replaced: UTF-16 read as UTF-8 is every sentence garbled, not one bad byte."""
    nuls = raw.count(b"\x00")
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")) or (nuls and nuls * 4 >= len(raw)):
        raise error(
            f"{where}: NUL bytes or a UTF-16 byte order mark: the file looks like UTF-16, not "
            "UTF-8. Convert it (e.g. `iconv -f utf-16 -t utf-8`).")


# Bytes of a file's start that `check_line_endings` judges (`line_endings_sample`).
LINE_ENDINGS_SAMPLE = 1 << 16


def check_line_endings(raw, where, error=ValueError):
    """Raises `error` naming `where` (a file, or file:line) when `raw`, a file's first bytes
    or its first line, has its lines ended by a carriage return alone (classic Mac OS, Excel
    for Mac): two or more `\\r` not followed by `\\n`, more than the `\\n` there. Only `\\n`
    ends a line here, so such a file reads as one line. One `\\r` inside a sentence, or a
    few among more line ends, is only a character."""
    bare = raw.count(b"\r") - raw.count(b"\r\n")
    if bare >= 2 and bare > raw.count(b"\n"):
        name = where.rsplit(":", 1)[0] if re.search(r":\d+$", where) else where
        if name == "<stdin>":
            convert = "... | tr '\\r' '\\n' | ..."
        elif name.endswith(".gz"):
            convert = f"gzip -dc {name} | tr '\\r' '\\n' | gzip > FIXED.gz"
        else:
            convert = f"tr '\\r' '\\n' < {name} > FIXED"
        raise error(
            f"{where}: its lines end in a carriage return alone (\\r, as classic Mac OS and "
            "Excel for Mac write them), so it reads as one line (only \\n ends a line). "
            f"Convert it: {convert}")


def whole_lines(sample):
    """A file's first bytes up to their last `\\n` (all of them without one): a sample cut
    between a line's `\\r` and its `\\n` would count that `\\r` as bare."""
    return sample[:sample.rfind(b"\n") + 1] or sample


def line_endings_sample(path, error=ValueError):
    """At most the first `LINE_ENDINGS_SAMPLE` bytes of a plain or `.gz` file, whole lines
    (`whole_lines`)."""
    with open_binary(path, error) as file:
        return whole_lines(file.read(LINE_ENDINGS_SAMPLE))


@contextlib.contextmanager
def open_binary(path, error=ValueError):
    """Opens a plain or `.gz` file for reading bytes (a context manager).

    A damaged `.gz` file (cut short by a download, or not gzip at all) raises `error` (a
    `ValueError` class) naming the file, where gzip's own errors name none (an `EOFError`
    traceback, "Not a gzipped file (b'un')").
    """
    path = os.fspath(path)
    if not path.endswith(".gz"):
        with open(path, "rb") as file:
            yield file
        return
    try:
        with gzip.open(path, "rb") as file:
            yield file
    except (EOFError, zlib.error, gzip.BadGzipFile) as bad:
        raise error(f"{path} is not a readable gzip file ({bad or type(bad).__name__}): a "
                    "download cut short, or a plain file named .gz?") from bad


def open_text_output(path, compress=None, name=None):
    """Opens a file for writing UTF-8 text, gzip-compressed when its name ends in `.gz` (as
    `open_binary` reads it), or as `compress` says.

    `name`: the file name a gzip header records (what `gunzip -N` restores), when `path`
    is a partial file that will be renamed to it; `path` by default.
    """
    path = os.fspath(path)
    if path.endswith(".gz") if compress is None else compress:
        named = path if name is None else os.fspath(name)
        return io.TextIOWrapper(_NamedGzipFile(path, named), encoding="utf-8")
    return open(path, "w", encoding="utf-8")


class _NamedGzipFile(gzip.GzipFile):
    """A gzip file written at `path` whose header names `name`; closing it closes the file."""

    def __init__(self, path, name):
        raw = open(path, "wb")
        try:
            super().__init__(filename=name, mode="wb", fileobj=raw)
        except BaseException:
            raw.close()
            raise
        self._raw = raw

    def close(self):
        try:
            super().close()
        finally:
            self._raw.close()


def count_lines(path, error=ValueError):
    """Counts the lines of a plain or `.gz` file by scanning bytes (constant memory).

    A last line without a final newline counts as a line; an empty file has 0 lines.

    Args:
        path: str or path-like.
        error: the `ValueError` class raised for a damaged `.gz` file (`open_binary`).

    Returns:
        int, the number of lines.

    Example:

    >>> with gzip.open("train.en.gz", "wt", encoding="utf-8") as f:
    ...     _ = f.write("A dog runs.\\nA cat sleeps.\\nNo final newline")
    >>> count_lines("train.en.gz")
    3
    """
    lines, last = 0, b"\n"
    with open_binary(path, error) as f:
        while chunk := f.read(_READ_CHUNK):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")

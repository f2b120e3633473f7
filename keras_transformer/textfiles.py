"""Plain or gzip-compressed text files: opening them (bytes to read, text to write),
decoding their lines strictly, counting them, and the digest of a file's bytes.

A module of its own, without TensorFlow: training's readers (`keras_transformer.data`) and
the translator of an export (`keras_transformer.export.inference`, which must not load
TensorFlow Datasets) both read files with it.
"""

import contextlib
import gzip
import hashlib
import os
import pathlib
import zlib

# A UTF-8 byte order mark, which some Windows editors write at the start of a file.
UTF8_BOM = b"\xef\xbb\xbf"
# Read size when counting lines or hashing a file.
_READ_CHUNK = 1 << 20


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


def decode_utf8(raw, where, error=ValueError):
    """Decodes UTF-8 bytes; on bytes that are not UTF-8 raises `error` (a `ValueError`
    class: training's readers pass `DataError`) naming `where` (file:line), the byte and how
    to convert the file.

    UTF-16 (Windows' "Unicode" text) is named as such: its byte order mark is not UTF-8, and
    without one its ASCII letters are, each followed by a NUL byte, which no sentence holds.
    """
    check_not_utf16(raw, where, error)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as bad:
        raise error(
            f"{where}: invalid UTF-8 (byte 0x{raw[bad.start]:02x} at offset {bad.start}). "
            "Convert the file to UTF-8 (e.g. `iconv -f latin1 -t utf-8`)."
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


def open_text_output(path):
    """Opens a file for writing UTF-8 text, gzip-compressed when its name ends in `.gz` (as
    `open_binary` reads it)."""
    path = os.fspath(path)
    if path.endswith(".gz"):
        return gzip.open(path, "wt", encoding="utf-8")
    return open(path, "w", encoding="utf-8")


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

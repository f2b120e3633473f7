"""Plain or gzip-compressed text files: opening them (bytes to read, text to write),
decoding their lines strictly, counting them, and the digest of a file's bytes.

A module of its own, without TensorFlow: training's readers (`keras_transformer.data`) and
the translator of an export (`keras_transformer.export.inference`, which must not load
TensorFlow Datasets) both read files with it.
"""

import gzip
import hashlib
import os
import pathlib

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
    to convert the file."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as bad:
        raise error(
            f"{where}: invalid UTF-8 (byte 0x{raw[bad.start]:02x} at offset {bad.start}). "
            "Convert the file to UTF-8 (e.g. `iconv -f latin1 -t utf-8`)."
        ) from bad


def open_binary(path):
    """Opens a plain or `.gz` file for reading bytes."""
    path = os.fspath(path)
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def open_text_output(path):
    """Opens a file for writing UTF-8 text, gzip-compressed when its name ends in `.gz` (as
    `open_binary` reads it)."""
    path = os.fspath(path)
    if path.endswith(".gz"):
        return gzip.open(path, "wt", encoding="utf-8")
    return open(path, "w", encoding="utf-8")


def count_lines(path):
    """Counts the lines of a plain or `.gz` file by scanning bytes (constant memory).

    A last line without a final newline counts as a line; an empty file has 0 lines.

    Args:
        path: str or path-like.

    Returns:
        int, the number of lines.

    Example:

    >>> with gzip.open("train.en.gz", "wt", encoding="utf-8") as f:
    ...     _ = f.write("A dog runs.\\nA cat sleeps.\\nNo final newline")
    >>> count_lines("train.en.gz")
    3
    """
    lines, last = 0, b"\n"
    with open_binary(path) as f:
        while chunk := f.read(_READ_CHUNK):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")

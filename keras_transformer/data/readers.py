"""Streaming readers of parallel text, with one rule per kind of bad input.

Nothing here holds a file in memory: lines are read one at a time (plain or `.gz`), and line
counts are taken by scanning bytes. Every reader feeds a `SplitReport`, so what was read,
kept, repaired and dropped is counted, never silently lost.

What happens to bad input (the same rules for parallel files, TSV and TFDS datasets):

| input                                        | answer                                         |
|----------------------------------------------|------------------------------------------------|
| source and target files of different lengths | `DataError` naming both files and both counts  |
| blank lines at the end of one file only      | blank pairs (dropped, counted as `blank`)      |
| an empty file (or a split with no usable pair) | `DataError` naming the file                  |
| a blank line (both sides empty)              | dropped, counted as `blank`                    |
| a pair with one empty (or whitespace) side   | dropped, counted as `empty_source`/`empty_target` |
| a side of characters normalization removes   | the same (zero-width spaces, bidi marks, controls) |
| a TSV line without exactly one tab           | `DataError` with file, line number, tab count  |
| a TSV written in CSV quoting (fields wrapped in quotes, their quotes doubled, no quote outside that form in the lines read) | `DataError` with file and line, and the fix  |
| CRLF line endings                            | repaired (the `\\r` removed), counted as `crlf` |
| a UTF-8 byte order mark at the start of a file | repaired (removed), counted as `bom`         |
| invalid UTF-8 bytes                          | `DataError` with file, line number and byte    |
| UTF-16 text (a byte order mark, NUL bytes)   | `DataError` with file and line, and the fix    |
| a damaged `.gz` file (cut short, not gzip)   | `DataError` naming the file                    |
| over-long pairs (more tokens than `max_length`) | dropped from training, counted as `too_long` (see `keras_transformer.data.preparation`) |

Why these choices: a line-count mismatch, a wrong number of TSV columns or invalid UTF-8
mean the file is not what the user thinks it is (misaligned, a tab inside a sentence, a
Latin-1 file), and training on it would teach the model noise, so they stop the run with
the place to look. Blank lines and one-sided pairs are common in real corpora and carry no
translation; dropping them (as Marian, OpenNMT and fairseq's cleaning scripts do) and
counting them is enough. CRLF and a BOM are encodings of the same text and are repaired.
Leading and trailing whitespace is removed from every sentence.
"""

import dataclasses
import json
import os

from keras_transformer import textfiles
from keras_transformer.text.normalization import normalize
from keras_transformer.textfiles import (
    UTF8_BOM,
    count_lines,
    open_binary,
    write_bytes_atomically,
)

# Reasons a pair is dropped, in the order the report lists them.
DROP_REASONS = ("blank", "empty_source", "empty_target", "too_long")
# Repairs that keep the pair, counted per line.
REPAIRS = ("crlf", "bom")


class DataError(ValueError):
    """Input data that cannot be trained on; the message names the file and line."""


@dataclasses.dataclass
class SplitReport:
    """Counts of one split: pairs read, kept, dropped (by reason) and lines repaired."""

    # Where the split comes from (file names, or `tfds:<name>[<split>]`).
    origin: str = ""
    # Pairs (lines, examples) read.
    read: int = 0
    # Pairs kept for training.
    kept: int = 0
    # Pairs dropped, by reason (see `DROP_REASONS`).
    dropped: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))
    # Lines repaired and kept, by repair (see `REPAIRS`).
    repaired: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(REPAIRS, 0))
    # Pairs kept but cut to `max_length` tokens (`drop_long_pairs=False`; counted when the
    # split is scanned, 0 in a report written before the count existed).
    truncated: int = 0

    def drop(self, reason):
        """Counts one dropped pair (`reason` in `DROP_REASONS`)."""
        self.dropped[reason] += 1
        self.kept -= 1

    def to_dict(self):
        """A JSON-serializable dict of the counts."""
        return dataclasses.asdict(self)

    def __str__(self):
        dropped = ", ".join(f"{n:,} {reason}" for reason, n in self.dropped.items() if n)
        repaired = ", ".join(f"{n:,} {what}" for what, n in self.repaired.items() if n)
        return (
            f"{self.read:,} pairs read, {self.kept:,} kept, "
            f"{sum(self.dropped.values()):,} dropped ({dropped or 'none'})"
            + (f", {self.truncated:,} cut to max_length" if self.truncated else "")
            + (f", lines repaired: {repaired}" if repaired else "")
            + f"  [{self.origin}]"
        )


def write_json_atomically(path, value, **dump_options):
    """`json.dump(value)` written whole or not at all (`textfiles.write_bytes_atomically`):
    a kill during the write leaves the previous file (or none), never half of one; a value
    JSON cannot write leaves no file."""
    write_bytes_atomically(path, json.dumps(value, **dump_options).encode("utf-8"))


def iter_lines(path, report=None):
    """Yields the decoded lines of a plain or `.gz` UTF-8 file, without line terminators.

    Only `\\n` ends a line (a Unicode line separator inside a sentence stays in it). A
    trailing `\\r` (CRLF) and a BOM at the start of the file are removed and counted in
    `report.repaired`. A file with no `\\n` but carriage returns between its lines (`\\r`
    line endings) is refused.

    Args:
        path: str or path-like.
        report: `SplitReport` or None, where repairs are counted.

    Yields:
        str, one line (leading/trailing whitespace kept; callers strip).

    Raises:
        DataError: on invalid UTF-8 or UTF-16, with the file, line number and byte offset;
            on a damaged `.gz` file; on carriage-return line endings.
    """
    with open_binary(path, DataError) as f:
        for number, raw in enumerate(f, start=1):
            if number == 1 and not raw.endswith(b"\n"):  # the whole file is one line
                textfiles.check_line_endings(raw, os.fspath(path), DataError)
            if raw.endswith(b"\n"):
                raw = raw[:-1]
            if raw.endswith(b"\r"):
                raw = raw[:-1]
                if report is not None:
                    report.repaired["crlf"] += 1
            if number == 1 and raw.startswith(UTF8_BOM):
                raw = raw[len(UTF8_BOM):]
                if report is not None:
                    report.repaired["bom"] += 1
            yield decode_utf8(raw, f"{os.fspath(path)}:{number}")


def decode_utf8(raw, where):
    """Decodes UTF-8 bytes, raising `DataError` naming `where` (file:line) on bad bytes
    (`textfiles.decode_utf8`)."""
    return textfiles.decode_utf8(raw, where, DataError)


# What the reader keeps changed (sides of characters normalization removes count as empty):
# a data report counted under other rules is counted again (`prepare_data_report`).
READER_RULES = 2


def _no_text(side):
    """Whether a stripped side holds no token once normalized by the default rule
    (`nmt_nfkc`: a zero-width space, bidi marks, control characters alone); with another
    `normalization` such a side has a token or two, but no text either. A side starting
    with a letter or digit holds text: only the rest are normalized, in C++."""
    return not side or (not side[0].isalnum() and not normalize(side))


def keep_pair(source, target, report):
    """Strips a pair and decides whether it is kept; counts it in `report`.

    Returns:
        `(source, target)` stripped, or `None` when the pair is dropped (blank line, or one
        side empty, or of characters the tokenizers' normalization removes).
    """
    source, target = source.strip(), target.strip()
    report.read += 1
    report.kept += 1
    source_empty, target_empty = _no_text(source), _no_text(target)
    if source_empty and target_empty:
        report.drop("blank")
    elif source_empty:
        report.drop("empty_source")
    elif target_empty:
        report.drop("empty_target")
    else:
        return source, target
    return None


def _lines_to_last_text(path):
    """The number of the last line of `path` that holds more than whitespace (0: none)."""
    last = 0
    for number, line in enumerate(iter_lines(path), start=1):
        if line.strip():
            last = number
    return last


def check_parallel_files(source_path, target_path):
    """Raises `DataError` unless both files are non-empty and have the same line count.

    Counting streams the bytes, so this is cheap enough to run before anything else.

    Returns:
        int, the common number of lines.
    """
    for path in (source_path, target_path):  # the cause of counts that differ, if so
        textfiles.check_line_endings(textfiles.line_endings_sample(path, DataError),
                                     os.fspath(path), DataError)
    counts = {path: count_lines(path, DataError) for path in (source_path, target_path)}
    for path, count in counts.items():
        if count == 0:
            raise DataError(f"{os.fspath(path)} is empty: no sentence pairs to read.")
    source_count, target_count = counts[source_path], counts[target_path]
    if source_count != target_count:
        # Blank lines at the end of the longer file misalign nothing: blank pairs.
        longer, shorter = sorted(counts, key=counts.get, reverse=True)
        if _lines_to_last_text(longer) <= counts[shorter]:
            return counts[longer]
        raise DataError(
            f"Source and target files have different line counts: {os.fspath(source_path)} "
            f"has {source_count:,} lines, {os.fspath(target_path)} has {target_count:,}. Line i "
            "of one must translate line i of the other."
        )
    return source_count


def read_parallel_files(source_path, target_path, report, keep_all=False):
    """Yields the pairs of two line-aligned files (plain or `.gz`), counted in `report`.

    Args:
        source_path: str or path-like, one source sentence per line.
        target_path: str or path-like, the target sentences, line by line.
        report: `SplitReport`, filled while reading.
        keep_all: bool, yield every pair, blank ones included (for evaluation, where line
            i must stay line i). Defaults to `False` (drop blank and one-sided pairs).

    Yields:
        `(source, target)` str pairs.

    Raises:
        DataError: different line counts (found when one file ends first), invalid UTF-8.
    """
    sources, targets = iter_lines(source_path, report), iter_lines(target_path, report)
    done = object()
    while True:
        source, target = next(sources, done), next(targets, done)
        if source is done and target is done:
            return
        if source is done or target is done:
            # One file ended first: the rest of the other must be blank lines (blank
            # pairs, no sentences even for evaluation), else both are counted for the
            # message.
            line = target if source is done else source
            if line.strip():
                check_parallel_files(source_path, target_path)
                raise DataError(f"{os.fspath(source_path)} and {os.fspath(target_path)} "
                                "have different line counts.")  # changed while read
            keep_pair("", "", report)
            continue
        pair = keep_pair(source, target, report)
        if keep_all:
            yield source.strip(), target.strip()
        elif pair is not None:
            yield pair


def _quoting(field):
    """What a TSV field's quotes say of how its file was written: `"csv"` for a field a
    CSV writer quoted (wrapped in quotes, every quote inside doubled, at least one: a
    sentence's own quotes around it are not doubled inside), `"plain"` for a quote a CSV
    writer would have quoted (one not in that form), else `None`."""
    field = field.strip()
    if '"' not in field or field == '""':  # `""`: an empty cell in CSV, or a pair of quotes
        return None
    inside = field[1:-1]
    if len(field) > 2 and field[0] == field[-1] == '"' and '"' not in inside.replace('""', ""):
        return "csv" if '""' in inside else None
    return "plain"


def read_tsv(path, report, keep_all=False, limit=None):
    """Yields the pairs of a `source<TAB>target` file (plain or `.gz`), counted in `report`.

    A blank line is a blank pair (dropped and counted); any other line must hold exactly
    one tab.

    Args:
        path: str or path-like.
        report: `SplitReport`, filled while reading.
        keep_all: bool, yield blank and one-sided pairs too. Defaults to `False`.
        limit: int or `None`, stop after this many pairs (`None`: all). The file's quoting
            is judged on the lines read.

    Yields:
        `(source, target)` str pairs.

    Raises:
        DataError: an empty file, a line without exactly one tab (file, line number and the
            number of tabs found), invalid UTF-8, a file written in CSV quoting.
    """
    empty = True
    # A field in CSV form may be a sentence's own text (code's docstrings), where a quote
    # outside that form shows the file was not written by a CSV writer (which quotes every
    # field holding a quote): the file is judged on all the lines read, at the end.
    csv_line, plain_quotes = None, False  # the first line in CSV quoting; a quote outside it
    yielded = 0
    if limit == 0:
        return
    textfiles.check_line_endings(textfiles.line_endings_sample(path, DataError),
                                 os.fspath(path), DataError)
    for number, line in enumerate(iter_lines(path, report), start=1):
        empty = False
        if not line.strip():
            source = target = ""
        else:
            tabs = line.count("\t")
            if tabs != 1:
                ending = (" The line ends with a tab: remove the empty last column."
                          if tabs == 2 and line.rstrip(" ").endswith("\t") else
                          " A tab inside a sentence must be removed first.")
                raise DataError(
                    f"{os.fspath(path)}:{number}: expected exactly one tab between source and "
                    f"target, found {tabs}.{ending}"
                )
            source, target = line.split("\t")
            if not plain_quotes:
                quoting = {_quoting(source), _quoting(target)}
                plain_quotes = "plain" in quoting
                if "csv" in quoting:
                    csv_line = csv_line or number
        pair = keep_pair(source, target, report)
        if keep_all:
            pair = source.strip(), target.strip()
        if pair is not None:
            yield pair
            yielded += 1
            if yielded == limit:
                break
    if empty:
        raise DataError(f"{os.fspath(path)} is empty: no sentence pairs to read.")
    if csv_line is not None and not plain_quotes:
        raise DataError(
            f"{os.fspath(path)}:{csv_line}: a field in CSV quoting (wrapped in quotes, its "
            "own quotes doubled, as pandas, Excel or Python's csv module write a field "
            "holding a quote), and no quote outside that form in the lines read: it would be "
            "trained with those quotes. Write plain `source<TAB>target` lines, each pair as "
            "`f.write(source + \"\\t\" + target + \"\\n\")`, not through a CSV writer."
        )

"""Bad input gets a clear answer: each case is repaired, dropped and counted, or rejected
with the file and line number (see the table in keras_transformer/data/readers.py)."""

import pytest

from keras_transformer.data.readers import (
    DataError,
    SplitReport,
    check_parallel_files,
    count_lines,
    read_parallel_files,
    read_tsv,
)
from keras_transformer.data.sources import FileSource, TsvSource

from tests.data.conftest import write_bytes, write_lines


def _read(source_path, target_path, **kwargs):
    report = SplitReport()
    return list(read_parallel_files(source_path, target_path, report, **kwargs)), report


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_count_lines_streams_plain_and_gz(tmp_path, suffix):
    assert count_lines(write_bytes(tmp_path / f"a{suffix}", b"x\ny\nz")) == 3  # no final \n
    assert count_lines(write_bytes(tmp_path / f"b{suffix}", b"x\n\n")) == 2
    assert count_lines(write_bytes(tmp_path / f"c{suffix}", b"")) == 0


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_different_line_counts_name_both_files_and_counts(tmp_path, suffix):
    source = write_lines(tmp_path / f"train.fr{suffix}", ["un", "deux", "trois"])
    target = write_lines(tmp_path / f"train.en{suffix}", ["one", "two"])
    files = FileSource({"train": [source, target]})
    with pytest.raises(DataError) as info:
        files.check(["train"])  # before any training: a streaming count
    message = str(info.value)
    assert str(source) in message and str(target) in message
    assert "3 lines" in message and "has 2" in message
    # Reading alone finds it too (whichever file is longer).
    for pair in ((source, target), (target, source)):
        with pytest.raises(DataError, match="different line counts"):
            _read(*pair)


def test_blank_lines_at_the_end_of_one_file_are_blank_pairs(tmp_path):
    # An editor's extra empty lines at the end misalign nothing: they had been refused as
    # "different line counts: 202 ... 200".
    source = write_lines(tmp_path / "train.fr", ["un", "deux", "", "  "])
    target = write_lines(tmp_path / "train.en", ["one", "two"])
    FileSource({"train": [source, target]}).check(["train"])
    for pair, expected in (((source, target), [("un", "one"), ("deux", "two")]),
                           ((target, source), [("one", "un"), ("two", "deux")])):
        pairs, report = _read(*pair)
        assert pairs == expected
        assert report.dropped["blank"] == 2 and report.read == 4
        # Evaluation (every line kept in place) leaves them out too: no sentences.
        assert _read(*pair, keep_all=True)[0] == expected
    # Text after them still misaligns the files.
    longer = write_lines(tmp_path / "more.fr", ["un", "deux", "", "trois"])
    with pytest.raises(DataError, match="different line counts"):
        FileSource({"train": [longer, target]}).check(["train"])
    with pytest.raises(DataError, match="different line counts"):
        _read(longer, target)


def test_empty_file_is_rejected_with_its_name(tmp_path):
    source = write_lines(tmp_path / "train.fr", [])
    target = write_lines(tmp_path / "train.en", [])
    with pytest.raises(DataError, match=f"{source} is empty"):
        FileSource({"train": [source, target]}).check(["train"])
    with pytest.raises(DataError, match="is empty"):
        list(read_tsv(write_lines(tmp_path / "t.tsv", []), SplitReport()))


def test_blank_lines_and_one_sided_pairs_are_dropped_and_counted(tmp_path):
    source = write_lines(tmp_path / "a.fr", ["un", "", "", "deux", "  ", "trois"])
    target = write_lines(tmp_path / "a.en", ["one", "", "lost", "", "x", " three "])
    pairs, report = _read(source, target)
    assert pairs == [("un", "one"), ("trois", "three")]
    assert (report.read, report.kept) == (6, 2)
    assert report.dropped == {"blank": 1, "empty_source": 2, "empty_target": 1, "too_long": 0}
    # Evaluation keeps every line aligned with its reference.
    assert len(_read(source, target, keep_all=True)[0]) == 6


def test_sides_of_characters_the_tokenizer_removes_count_as_empty(tmp_path):
    # A zero-width space, bidi marks, a BOM inside the file, a control character: no
    # token after normalization, yet they had been kept (the model learned to translate
    # to nothing: 24 of 40 translations empty in the audit's run).
    invisible = ["\u200b", "\u200e\u200f", "\ufeff", "\x07", " \u200b\u00a0"]
    source = write_lines(tmp_path / "a.fr", ["un", *invisible, "\u200b", "…", "🙂"])
    target = write_lines(tmp_path / "a.en", ["one", "x", "y", "z", "w", "v", "\u200b", "...",
                                               "smile"])
    pairs, report = _read(source, target)
    assert pairs == [("un", "one"), ("…", "..."), ("🙂", "smile")]
    assert report.dropped == {"blank": 1, "empty_source": 5, "empty_target": 0,
                              "too_long": 0}


def test_crlf_and_bom_are_repaired_and_counted(tmp_path):
    source = write_bytes(tmp_path / "a.fr", b"\xef\xbb\xbfun\r\ndeux\r\n")
    target = write_bytes(tmp_path / "a.en.gz", b"one\ntwo\n")
    pairs, report = _read(source, target)
    assert pairs == [("un", "one"), ("deux", "two")]
    assert report.repaired == {"crlf": 2, "bom": 1}
    assert report.kept == 2


def test_a_file_whose_lines_end_in_a_carriage_return_alone_is_refused(tmp_path):
    # Old Mac OS and Excel for Mac end lines in \r alone: the file read as one line, which
    # SentencePiece then skipped (longer than its limit) and failed with a bare
    # "[!sentences_.empty()]" traceback, or the pair counts disagreed later.
    source = write_bytes(tmp_path / "a.fr", b"un\rdeux\rtrois\r")
    target = write_bytes(tmp_path / "a.en", b"one\rtwo\rthree\r")
    with pytest.raises(DataError, match=rf"{source}.*carriage return.*tr '\\r' '\\n'"):
        _read(source, target)
    # One side only: the line counts differ, but the line endings are the cause to name.
    lf_target = write_bytes(tmp_path / "lf.en", b"one\ntwo\nthree\n")
    with pytest.raises(DataError, match=rf"{source}.*carriage return"):
        check_parallel_files(source, lf_target)
    with pytest.raises(DataError, match=r"carriage return"):
        list(read_tsv(write_bytes(tmp_path / "t.tsv.gz", b"un\tone\rdeux\ttwo\rx\ty\r"),
                      SplitReport()))
    # A first line holding carriage returns, among many ordinary lines, is only text.
    title = write_bytes(tmp_path / "title.fr", b"Titre\rSous-titre\rCorps\n" + b"un\n" * 20)
    other = write_bytes(tmp_path / "title.en", b"Title\n" + b"one\n" * 20)
    pairs, _ = _read(title, other)
    assert pairs[0] == ("Titre\rSous-titre\rCorps", "Title") and len(pairs) == 21
    # A carriage return inside one sentence of an ordinary file is only a character.
    source = write_bytes(tmp_path / "b.fr", b"un\rdeux\ntrois\n")
    target = write_bytes(tmp_path / "b.en", b"one\ntwo\n")
    pairs, _ = _read(source, target)
    assert pairs[1] == ("trois", "two")


def test_invalid_utf8_is_rejected_with_file_and_line(tmp_path):
    source = write_bytes(tmp_path / "a.fr", b"un\ncaf\xe9\n")  # Latin-1
    target = write_lines(tmp_path / "a.en", ["one", "coffee"])
    with pytest.raises(DataError, match=rf"{source}:2: invalid UTF-8 \(byte 0xe9"):
        _read(source, target)


def test_tsv_line_without_exactly_one_tab_is_rejected_with_file_and_line(tmp_path):
    path = write_lines(tmp_path / "t.tsv", ["un\tone", "", "deux\ttwo\textra"])
    with pytest.raises(DataError, match=rf"{path}:3: expected exactly one tab .* found 2"):
        list(read_tsv(path, SplitReport()))
    path = write_lines(tmp_path / "u.tsv", ["un\tone", "no tab here"])
    with pytest.raises(DataError, match=rf"{path}:2: .* found 0"):
        list(read_tsv(path, SplitReport()))


def test_tsv_line_ending_in_a_tab_is_told_it_has_an_empty_column(tmp_path):
    # An empty trailing column (a spreadsheet's third column) was told "A tab inside a
    # sentence must be removed first", which it is not.
    path = write_lines(tmp_path / "t.tsv", ["un\tone", "deux\ttwo\t"])
    with pytest.raises(DataError, match=rf"{path}:2: .*found 2.*ends with a tab"):
        list(read_tsv(path, SplitReport()))
    path = write_lines(tmp_path / "u.tsv", ["un\tone\tdeux\t"])  # a column more than that
    with pytest.raises(DataError, match=r"found 3\. A tab inside a sentence"):
        list(read_tsv(path, SplitReport()))


def test_tsv_written_with_csv_quoting_is_refused_not_trained_on_its_quotes(tmp_path):
    # pandas' or Excel's TSV quotes a field holding a quote and doubles the quote inside:
    # `"The boy says: ""yes"""` was trained as written, quotes and doubled quotes included.
    quoted = 'Le garçon dit : « oui »\t"The boy says: ""yes"""'
    path = write_lines(tmp_path / "t.tsv", ["un\tone", quoted])
    with pytest.raises(DataError, match=rf"{path}:2: .*CSV quoting"):
        list(read_tsv(path, SplitReport()))
    # Quotes a sentence holds are text: at the start, at the end, around the whole of it.
    plain = ['"Oui", dit-il.\t"Yes," he said.', '« Oui »\t"Yes"', 'Il a dit "oui"\tHe said "yes"',
             '"Oui" "non"\t"Yes" and "no"']
    path = write_lines(tmp_path / "plain.tsv", plain)
    assert [pair[1] for pair in read_tsv(path, SplitReport())] == [
        '"Yes," he said.', '"Yes"', 'He said "yes"', '"Yes" and "no"']


def test_tsv_blank_lines_and_empty_sides_are_counted(tmp_path):
    path = write_bytes(tmp_path / "t.tsv.gz", b"un\tone\r\n\n\tx\ny\t\ndeux\ttwo\n")
    report = SplitReport()
    assert list(read_tsv(path, report)) == [("un", "one"), ("deux", "two")]
    assert report.dropped == {"blank": 1, "empty_source": 1, "empty_target": 1, "too_long": 0}
    assert report.repaired["crlf"] == 1
    source = TsvSource({"train": path}, "fr", "en")
    assert list(source.pairs("train")) == [("un", "one"), ("deux", "two")]


def test_missing_file_is_named(tmp_path):
    with pytest.raises(DataError, match="nope.fr"):
        FileSource({"train": [tmp_path / "nope.fr", tmp_path / "nope.en"]}).check(["train"])


def test_a_failed_atomic_json_write_leaves_no_file(tmp_path):
    # A value JSON cannot write left `config.json.tmp` behind, and the run directory then
    # refused every later start ("holds other files").
    from keras_transformer.data.readers import write_json_atomically

    with pytest.raises(TypeError):
        write_json_atomically(tmp_path / "config.json", {"path": tmp_path})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("damage", ["truncated", "not_gzip"])
def test_a_damaged_gz_file_is_named(tmp_path, damage):
    # A half-downloaded train.fr.gz ended in EOFError's traceback ("Compressed file ended
    # before the end-of-stream marker"), a plain file named .gz in "Not a gzipped file
    # (b'un')": neither named the file.
    import gzip

    raw = gzip.compress(b"un chien\n" * 20_000)
    source = tmp_path / "train.fr.gz"  # written as is (write_bytes would compress it)
    source.write_bytes(raw[:-30] if damage == "truncated" else b"un chien\n" * 5)
    target = write_lines(tmp_path / "train.en.gz", ["a dog"] * 20_000)
    with pytest.raises(DataError, match=rf"{source}.*gzip"):
        FileSource({"train": (source, target)}).check(["train"])
    with pytest.raises(DataError, match=rf"{source}.*gzip"):
        _read(source, target)


def test_a_utf16_file_is_named_as_such(tmp_path):
    # Windows' "Unicode" text is UTF-16: its byte order mark failed as "invalid UTF-8 (byte
    # 0xff)" with Latin-1's advice, which turns the file into NUL-riddled text; without a
    # mark its ASCII decodes as UTF-8 with a NUL after every letter and trained silently.
    target = write_lines(tmp_path / "a.en", ["a dog", "a cat"])
    for name, raw in (("bom.fr", "un chien\r\nun chat\r\n".encode("utf-16")),
                      ("plain.fr", "un chien\nun chat\n".encode("utf-16-le"))):
        source = write_bytes(tmp_path / name, raw)
        with pytest.raises(DataError, match=rf"{source}:1: .*UTF-16.*iconv -f utf-16"):
            _read(source, target)
    # A stray NUL in UTF-8 text (a crawled corpus) is not UTF-16: read as before.
    source = write_bytes(tmp_path / "nul.fr", b"un chien\nun\x00 chat noir qui dort\n")
    assert _read(source, target)[0] == [("un chien", "a dog"),
                                        ("un\x00 chat noir qui dort", "a cat")]


def test_tsv_test_sets_are_read_through_when_checked(tmp_path, toy_corpus):
    # Only their existence was checked: a test set with a stray tab or no line at all
    # failed at `evaluate`, after the whole training.
    news = write_lines(tmp_path / "news.tsv", ["un\tone", "deux\ttwo\tthree"])
    empty = write_bytes(tmp_path / "empty.tsv", b"")
    source = TsvSource({"train": toy_corpus["tsv"]["train"], "news": news, "other": empty},
                       "fr", "en")
    with pytest.raises(DataError, match=rf"{news}:2: expected exactly one tab"):
        source.check(["news"])
    with pytest.raises(DataError, match=rf"{empty}"):
        source.check(["other"])
    source.check(["train"])


def test_a_tsv_whose_quotes_are_plain_text_keeps_a_field_that_looks_csv_quoted(tmp_path):
    # A code corpus: `"""Return x."""` is how a CSV writer quotes `"Return x."`, and the
    # whole run was refused for it, though the file's other quotes (`print("hi")`) show it
    # was not written in CSV quoting (a CSV writer quotes every field holding a quote).
    lines = ['Gib x zurück.\t"""Return x."""', 'Drucke hallo.\tprint("hi")']
    for order in (lines, lines[::-1]):
        path = write_lines(tmp_path / "code.tsv", order)
        assert sorted(pair[1] for pair in read_tsv(path, SplitReport())) == [
            '"""Return x."""', 'print("hi")']
    # A file whose every quoted field is CSV-quoted is still refused, at its first one.
    path = write_lines(tmp_path / "csv.tsv", ['un\t"""One"""', "deux\ttwo",
                                              'trois\t"Three, ""3"""'])
    with pytest.raises(DataError, match=rf"{path}:1: .*CSV quoting"):
        list(read_tsv(path, SplitReport()))
    # An empty cell as CSV writes it (`""`) says nothing of the file's quoting.
    path = write_lines(tmp_path / "empty.tsv", ['un\t"""One"""', '""\t"x"'])
    with pytest.raises(DataError, match=rf"{path}:1: .*CSV quoting"):
        list(read_tsv(path, SplitReport(), keep_all=True))
    # A read that stops early (`train_subset`, an evaluation's limit) judges the lines read.
    path = write_lines(tmp_path / "long.tsv", ['un\t"""One"""'] + ["deux\ttwo"] * 30
                       + ['trois\t"Three" he said'])
    for reader in (read_tsv(path, SplitReport(), limit=5),
                   TsvSource({"train": path}, "fr", "en").pairs("train", limit=5)):
        with pytest.raises(DataError, match=rf"{path}:1: .*CSV quoting"):
            list(reader)
    assert len(list(read_tsv(path, SplitReport()))) == 32  # the whole file: plain quotes

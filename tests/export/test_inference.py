"""`keras_transformer.export.inference`: ExportedTranslator, read_lines and the metrics."""

import io
import sys

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.export import (
    ExportedTranslator,
    evaluate_export,
    evaluate_translations,
    read_lines,
)
from tests.export.conftest import EXPORT_BEAM_SIZE

REFERENCES = [
    "A man in an orange hat starring at something.",
    "Two young, White males are outside near many bushes.",
    "A little girl climbing into a wooden playhouse.",
]


def test_read_lines_keeps_empty_lines_and_unicode_separators(tmp_path):
    path = tmp_path / "text.txt"
    # CRLF, an empty line, U+2028 (LINE SEPARATOR) inside a line, an invalid byte.
    path.write_bytes(b"one\r\n\ntwo\xe2\x80\xa8still two\nbad \xff byte\n")
    assert read_lines(path) == ["one", "", "two\u2028still two", "bad \ufffd byte"]
    (tmp_path / "no_newline.txt").write_text("a\nb")
    assert read_lines(tmp_path / "no_newline.txt") == ["a", "b"]
    (tmp_path / "empty.txt").write_text("")
    assert read_lines(tmp_path / "empty.txt") == []


def test_read_lines_drops_a_byte_order_mark(tmp_path):
    # Windows editors start UTF-8 files with a BOM; training repairs it, the references of
    # `evaluate --src/--ref` kept it in their first sentence (BLEU 10.64 against 11.58).
    path = tmp_path / "ref.en"
    path.write_bytes(b"\xef\xbb\xbfA dog runs.\r\nTwo men talk.\n")
    assert read_lines(path) == ["A dog runs.", "Two men talk."]
    path.write_bytes(b"A dog\xef\xbb\xbf runs.\n")  # inside a line it is text: kept
    assert read_lines(path) == ["A dog\ufeff runs."]


def test_read_lines_refuses_utf16_even_where_bad_bytes_are_replaced(tmp_path):
    # `translate --input doc.txt` on Windows' "Unicode" text translated a line per NUL-laced
    # fragment: 3 output lines for 2 input lines, garbage in each.
    path = tmp_path / "doc.txt"
    for raw in ("A dog.\nTwo men.\n".encode("utf-16"), "A dog.\n".encode("utf-16-le")):
        path.write_bytes(raw)
        with pytest.raises(ValueError, match=r"doc\.txt:1: .*UTF-16"):
            read_lines(path)


def test_read_lines_refuses_carriage_return_line_endings(tmp_path, monkeypatch):
    # `translate --input` and `evaluate --src/--ref` of classic Mac OS text translated
    # (and scored) the whole file as one sentence, with no word.
    path = tmp_path / "doc.txt"
    for data in (b"A dog.\rTwo men.\rA cat.\r", b"A dog.\rTwo men.\rA cat.\n"):
        path.write_bytes(data)
        with pytest.raises(ValueError, match=r"doc\.txt.*carriage return.*< .*doc\.txt"):
            read_lines(path)
    # A first line holding carriage returns, among many ordinary lines, is only text.
    path.write_bytes(b"Title\rSubtitle\rBody\n" + b"A dog.\n" * 20)
    assert len(read_lines(path)) == 21
    # CR CR LF line ends (CRLF written again in Windows' text mode), whatever the length of
    # the first bytes judged: a sample cut between a line's CR and its LF was refused.
    for count in (700, 701, 1500, 2000):
        path.write_bytes(b"abc\r\r\n" * count)
        assert len(read_lines(path)) == count
        gz = tmp_path / "doc.txt.gz"
        gz.write_bytes(__import__("gzip").compress(b"abc\r\r\n" * count))
        assert len(read_lines(gz)) == count
    # From stdin, the advice is a pipe.
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"A dog.\rTwo men.\r")))
    with pytest.raises(ValueError, match=r"<stdin>.*\| tr '\\r' '\\n' \|"):
        read_lines("-")


def test_a_line_with_nul_bytes_is_read_not_taken_for_utf16(tmp_path):
    # A stray NUL in a short UTF-8 line ("ab\x00c": a quarter of its bytes) counted as UTF-16
    # and stopped `translate` (and `evaluate`) in the middle of the file. UTF-16 shows from
    # the first line (its byte order mark or NUL-laced letters); later lines are sentences.
    path = tmp_path / "doc.txt"
    path.write_bytes(b"A dog.\nab\x00c\n\x00\nTwo men.\n")
    expected = ["A dog.", "ab\x00c", "\x00", "Two men."]
    assert read_lines(path) == expected
    assert read_lines(path, strict=True) == expected
    # UTF-16 without a byte order mark whose first line is empty shows on its next line.
    path.write_bytes("\nA dog.\n".encode("utf-16-le"))
    for strict in (False, True):
        with pytest.raises(ValueError, match=r"doc\.txt:2: .*UTF-16"):
            read_lines(path, strict)


def test_surrogate_escaped_strings_are_translated_not_refused():
    # `sys.stdin` in a C locale reads Latin-1 bytes as lone surrogates ("caf\udce9"), which
    # UTF-8 cannot encode: a UnicodeEncodeError; other invalid bytes become U+FFFD.
    from keras_transformer.export.inference import as_bytes

    assert as_bytes("caf\udce9") == "caf\ufffd".encode("utf-8")
    assert as_bytes("café") == "café".encode("utf-8")


def test_read_lines_dash_reads_stdin(monkeypatch):
    stdin = io.TextIOWrapper(io.BytesIO("Ein Hund.\nZwei Männer.\n".encode("utf-8")))
    monkeypatch.setattr(sys, "stdin", stdin)
    assert read_lines("-") == ["Ein Hund.", "Zwei Männer."]


def test_perfect_hypotheses_score_100():
    result = evaluate_translations(REFERENCES, REFERENCES)
    assert result["bleu"] == pytest.approx(100.0)
    assert result["bleu_lowercase"] == pytest.approx(100.0)
    assert result["chrf"] == pytest.approx(100.0)
    assert result["sentences"] == 3
    assert result["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert "case:lc" in result["bleu_lowercase_signature"]
    assert result["chrf_signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0")


def test_lowercase_bleu_forgives_case():
    mangled = [r.swapcase() if i % 2 == 0 else r.upper() for i, r in enumerate(REFERENCES)]
    result = evaluate_translations(mangled, REFERENCES)
    assert result["bleu_lowercase"] == pytest.approx(100.0)
    assert result["bleu"] < 50.0
    assert result["bleu_lowercase"] >= result["bleu"]
    assert result["chrf"] < 100.0


def test_evaluate_translations_rejects_unpaired_input():
    with pytest.raises(ValueError, match="2 hypotheses and 3 references"):
        evaluate_translations(REFERENCES[:2], REFERENCES)
    with pytest.raises(ValueError, match="Nothing to evaluate"):
        evaluate_translations([], [])


@pytest.mark.slow
def test_exported_translator_batches_and_matches_the_translator(exported, copy_task):
    translator = ExportedTranslator(exported)
    assert translator.path == exported / "1" and translator.version == 1
    assert translator.metadata["decoding"]["beam_size"] == EXPORT_BEAM_SIZE
    sentences = copy_task.held_out[:7] + ["", "Grüße 🐕"]
    results = translator.translate(sentences, batch_size=2)  # 5 calls, the last one short
    assert [set(r) for r in results] == [
        {"translation", "score", "length", "truncated", "unfinished"}] * len(sentences)
    in_process = copy_task.translator(search="beam", beam_size=EXPORT_BEAM_SIZE).translate(
        tf.constant(sentences))
    assert [r["translation"] for r in results] == [
        t.decode() for t in in_process["translation"].numpy().tolist()]
    assert [r["length"] for r in results] == in_process["length"].numpy().tolist()
    np.testing.assert_allclose([r["score"] for r in results], in_process["score"].numpy(),
                               rtol=1e-4, atol=1e-4)
    assert translator(sentences, batch_size=64) == [r["translation"] for r in results]
    assert translator.translate([]) == []
    # A string is an iterable of characters: it would be translated letter by letter.
    for call in (translator.translate, translator, lambda s: list(translator.translate_stream(s))):
        with pytest.raises(TypeError, match="list of sentences"):
            call("A dog runs.")
    # Refused when called, not when the first result is asked for (a generator's body runs
    # late: the mistake surfaced far from the call, or never for an unread stream).
    for wrong in ({"batch_size": 0}, {"sort_buffer_batches": 0}):
        with pytest.raises(ValueError, match=next(iter(wrong))):
            translator.translate_stream(sentences, **wrong)
    with pytest.raises(TypeError, match="list of sentences"):
        translator.translate_stream("A dog runs.")
    with pytest.raises(ValueError, match="no signature 'nope'"):
        ExportedTranslator(exported, signature="nope")
    with pytest.raises(FileNotFoundError):
        ExportedTranslator(exported.parent / "missing")


@pytest.mark.slow
def test_evaluate_export_on_the_copy_task(exported, copy_task):
    sources = copy_task.held_out[:20]
    result = evaluate_export(exported, sources, sources, batch_size=8,
                             signature="translate_greedy")
    assert result["sentences"] == 20 and len(result["translations"]) == 20
    assert result["bleu"] > 70.0  # the tiny model copies (almost) perfectly
    assert result["chrf"] > 80.0
    assert result["sentences_per_second"] > 0 and result["seconds"] > 0
    assert result["signature"] == "translate_greedy"
    assert result["model_path"] == str(exported / "1")
    assert evaluate_translations(result["translations"], sources)["bleu"] == result["bleu"]


def test_iter_lines_and_count_lines_agree_with_read_lines(tmp_path):
    from keras_transformer.export.inference import count_lines, iter_lines

    cases = {"crlf.txt": b"one\r\n\ntwo\xe2\x80\xa8still two\nbad \xff byte\n",
             "no_newline.txt": b"a\nb", "empty.txt": b"", "blank.txt": b"\n\n"}
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        assert list(iter_lines(path)) == read_lines(path), name
        assert count_lines(path) == len(read_lines(path)), name
    # Compressed, as `train` reads its files: the same lines, not the compressed bytes.
    import gzip

    with gzip.open(tmp_path / "crlf.txt.gz", "wb") as stream:
        stream.write(cases["crlf.txt"])
    assert read_lines(tmp_path / "crlf.txt.gz") == read_lines(tmp_path / "crlf.txt")
    assert count_lines(tmp_path / "crlf.txt.gz") == count_lines(tmp_path / "crlf.txt")


def test_the_translator_loads_neither_the_data_package_nor_tensorflow_datasets():
    # It reads files with keras_transformer.textfiles; keras_transformer.data would load
    # TensorFlow Datasets (seconds, and memory) into every process that only translates.
    from tests.module_loading import modules_loaded_by

    assert modules_loaded_by("keras_transformer.export.inference",
                             ("tensorflow_datasets", "keras_transformer.data")) == "[]"


def test_progress_bar_counts_to_the_total_and_ends_its_line():
    from keras_transformer.export.inference import ProgressBar

    stream = io.StringIO()
    bar = ProgressBar(10, stream=stream, min_interval=0.0)
    for _ in range(5):
        bar.update(2)
    bar.close()
    text = stream.getvalue()
    assert text.count("\r") == 5 and text.endswith("\n")
    assert text.rsplit("\r", 1)[1].startswith("10/10 sentences 100.0%")


def test_a_progress_bar_counts_its_eta_past_a_day():
    # 27.75 hours left showed "ETA 03:45:00": the clock format wrapped every 24 hours.
    from keras_transformer.export.inference import ProgressBar

    stream = io.StringIO()
    bar = ProgressBar(10_000_000, stream=stream, min_interval=0.0)
    bar.done = 10_000
    bar._draw(100.0)  # 100/s: 99,900 s left
    assert stream.getvalue().endswith("ETA 27:45:00"), stream.getvalue()


def test_a_progress_bar_without_a_total_counts_and_ends_its_line():
    # `translate --progress < file` (stdin: no total) showed nothing.
    from keras_transformer.export.inference import ProgressBar

    stream = io.StringIO()
    bar = ProgressBar(None, stream=stream, min_interval=60.0)
    bar.update(3)  # drawn: the first
    bar.update(4)  # not drawn before a minute, but by close()
    bar.close()
    text = stream.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n")
    assert text.rsplit("\r", 1)[1].startswith("7 sentences ") and "%" not in text


def test_translate_by_length_refuses_a_batch_size_below_one():
    # A negative batch size returned [None, None]; 0 was range()'s "arg 3 must not be zero".
    from keras_transformer.export.inference import translate_by_length

    for wrong in (0, -1, 1.5, None):
        with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
            translate_by_length(["a", "b"], wrong, lambda batch: batch)
    assert translate_by_length(["bb", "a"], 1, lambda batch: batch) == ["bb", "a"]


def test_a_signature_that_does_not_translate_text_is_refused_by_name(tmp_path):
    # `translate --signature metadata` (no input) or `translate_seeded` (a seed per
    # sentence as well) failed with a TypeError traceback on the first batch.
    from keras_transformer.export.inference import ExportedTranslator

    class Export(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def translate(self, text):
            return {"translation": text, "score": tf.zeros_like(text, tf.float32),
                    "length": tf.zeros_like(text, tf.int32)}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string),
                                      tf.TensorSpec([None], tf.int64)])
        def translate_seeded(self, text, seed):
            return self.translate(text)

        @tf.function(input_signature=[])
        def metadata(self):
            return {"source_lang": tf.constant("en")}

    module = Export()
    tf.saved_model.save(module, str(tmp_path / "1"), signatures={
        "translate": module.translate, "translate_seeded": module.translate_seeded,
        "metadata": module.metadata})
    assert ExportedTranslator(tmp_path, "translate").translate(["a"])[0]["translation"] == "a"
    for name in ("translate_seeded", "metadata"):
        with pytest.raises(ValueError, match=rf"'{name}' .*text.*translate"):
            ExportedTranslator(tmp_path, name)


def test_references_the_vocabulary_normalizes_are_counted_and_scored_both_ways():
    # The model writes SentencePiece-normalized (NFKC) text: Chinese full-width punctuation
    # comes out as ASCII, and BLEU against the references as given fell with no word why.
    references = ["一只狗在草地上奔跑，很快！", "两个男人在说话。"]
    hypotheses = ["一只狗在草地上奔跑,很快!", "两个男人在说话。"]  # what the model can write
    result = evaluate_translations(hypotheses, references, target_lang="zh")
    assert result["references_changed_by_normalization"] == 1
    assert result["bleu_normalized_references"] == pytest.approx(100.0)
    assert result["bleu"] < 100.0
    # Text the vocabulary leaves alone (whitespace aside) has nothing to report.
    plain = evaluate_translations(REFERENCES, [r + "  " for r in REFERENCES])
    assert plain["references_changed_by_normalization"] == 0
    assert plain["bleu_normalized_references"] == plain["bleu"]
    # A vocabulary trained with `--set normalization=identity` writes them as given.
    identity = evaluate_translations(references, references, target_lang="zh",
                                     normalization="identity")
    assert identity["references_changed_by_normalization"] == 0
    assert identity["normalization"] == "identity" and result["normalization"] == "nmt_nfkc"


def test_evaluating_an_export_normalizes_references_with_its_vocabulary_rule(tmp_path,
                                                                             monkeypatch):
    from keras_transformer.export import inference

    seen = {}

    class Exported:
        path = tmp_path

        def __init__(self, path, signature):
            pass

        def translate(self, sentences, batch_size=64, on_batch=None):
            return [{"translation": s, "truncated": False, "unfinished": False}
                    for s in sentences]

        @property
        def metadata(self):  # as ExportedTranslator's
            return inference.read_export_metadata(self.path)

    def evaluate(hypotheses, references, target_lang=None, normalization="nmt_nfkc"):
        seen["normalization"] = normalization
        return {}

    monkeypatch.setattr(inference, "ExportedTranslator", Exported)
    monkeypatch.setattr(inference, "evaluate_translations", evaluate)
    monkeypatch.setattr(inference, "read_export_metadata", lambda path: {
        "training_config": {"normalization": "nfkc"}})
    inference.evaluate_export(tmp_path, ["a"], ["a"])
    assert seen["normalization"] == "nfkc"
    # Exports from before the setting: the rule every vocabulary then had.
    monkeypatch.setattr(inference, "read_export_metadata", lambda path: {})
    inference.evaluate_export(tmp_path, ["a"], ["a"])
    assert seen["normalization"] == "nmt_nfkc"
    # An export made in Python (no training config): the rule its target vocabulary holds.
    from keras_transformer.text import train_sentencepiece

    sentences = [f"word{i} and more words {i * 7}" for i in range(200)]
    train_sentencepiece(sentences, tmp_path / "assets" / "tokenizer.model", vocab_size=300,
                        normalization_rule_name="identity")
    inference.evaluate_export(tmp_path, ["a"], ["a"])
    assert seen["normalization"] == "identity"
    train_sentencepiece(sentences, tmp_path / "assets" / "target.model", vocab_size=300,
                        normalization_rule_name="nfkc")  # separate vocabularies
    inference.evaluate_export(tmp_path, ["a"], ["a"])
    assert seen["normalization"] == "nfkc"


@pytest.mark.parametrize("recorded", ["top_level", "training_config", "given"])
def test_evaluating_an_export_tokenizes_bleu_for_the_language_it_records(tmp_path,
                                                                         monkeypatch,
                                                                         recorded):
    # `evaluate_export` scored a Japanese export with `13a` (BLEU 0.0 where the command
    # line, reading the export's language, gave 22.52 with `char`).
    from keras_transformer.export import inference

    class Exported:
        path = tmp_path

        def __init__(self, path, signature):
            pass

        def translate(self, sentences, batch_size=64, on_batch=None):
            return [{"translation": "猫がいる", "truncated": False, "unfinished": False}
                    for _ in sentences]

        @property
        def metadata(self):
            return inference.read_export_metadata(self.path)

    metadata = {"top_level": {"source_lang": "en", "target_lang": "ja"},
                "training_config": {"training_config": {"target_lang": "ja"}},
                "given": {"target_lang": "de"}}[recorded]
    monkeypatch.setattr(inference, "ExportedTranslator", Exported)
    monkeypatch.setattr(inference, "read_export_metadata", lambda path: metadata)
    given = {"target_lang": "ja"} if recorded == "given" else {}
    result = inference.evaluate_export(tmp_path, ["a cat"], ["猫がいます"], **given)
    assert "tok:char" in result["bleu_signature"]
    assert result["bleu"] > 0


def test_evaluating_one_string_or_the_translators_records_is_refused():
    # One string was scored character by character (BLEU 0.0, no error); the records of
    # `ExportedTranslator.translate` failed inside sacreBLEU; normalization=None failed in
    # SentencePiece ("no model is specified").
    with pytest.raises(TypeError, match="list of sentences"):
        evaluate_translations("the cat", "the cat")
    with pytest.raises(TypeError, match=r'\["translation"\]'):
        evaluate_translations([{"translation": "the cat"}], ["the cat"])
    with pytest.raises(ValueError, match="normalization must be one of"):
        evaluate_translations(["the cat"], ["the cat"], normalization=None)


def test_standard_input_that_pauses_says_so_and_its_lines_are_translated_at_once(monkeypatch):
    # `translate` with lines typed at the terminal, or written one at a time by a program
    # waiting for each translation, printed nothing before 1,024 lines or the end of input.
    import os
    import threading

    from keras_transformer.export import inference

    read, write = os.pipe()
    with open(read, "rb", buffering=0) as stream:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(stream))
        lines = inference.iter_lines("-", idle_seconds=0.05)
        os.write(write, b"a dog\nhalf a li")
        assert next(lines) == "a dog"
        assert next(lines) is inference.IDLE  # nothing more for 0.05 s
        threading.Timer(0.2, lambda: (os.write(write, b"ne\n"), os.close(write))).start()
        assert list(lines) == ["half a line"]

    calls = []
    translator = object.__new__(inference.ExportedTranslator)
    translator._translate_batch = lambda batch: calls.append(batch) or [
        {"translation": b.decode().upper()} for b in batch]
    results = translator.translate_stream(iter(["a", inference.IDLE, "b", "c"]), batch_size=8)
    assert next(results)["translation"] == "A" and calls == [[b"a"]]  # before "b" is read
    assert [r["translation"] for r in results] == ["B", "C"] and calls[1] == [b"b", b"c"]


def test_a_pipe_named_as_the_input_that_pauses_is_translated_as_its_lines_come(tmp_path):
    # `--input /dev/stdin`, `--input <(prog)` or a FIFO: only `--input -` translated on a
    # pause; a named pipe was read ahead 16 batches (or to its end) first.
    import os
    import threading

    from keras_transformer.export import inference

    fifo = tmp_path / "lines"
    os.mkfifo(fifo)
    go_on = threading.Event()

    def writer():
        with open(fifo, "wb", buffering=0) as stream:
            stream.write(b"a dog\nhalf a li")
            go_on.wait(10)
            stream.write(b"ne\n")

    threading.Thread(target=writer, daemon=True).start()
    # (0.5 s: a writer thread woken late on a busy machine is not a pause.)
    lines = inference.iter_lines(fifo, idle_seconds=0.5)
    assert next(lines) == "a dog"
    assert next(lines) is inference.IDLE  # nothing more for 0.5 s
    go_on.set()
    assert list(lines) == ["half a line"]

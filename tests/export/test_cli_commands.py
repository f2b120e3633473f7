"""`keras-transformer translate | evaluate | export` as a user meets them, on the tiny copy model.

The quiet start-up is checked in a subprocess (TensorFlow's C++ start-up lines are written
while TensorFlow is imported, so only a fresh process shows them); the rest calls
`keras_transformer.cli.main` in this process, which shares the session's exported model.
"""

import io
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from keras_transformer import cli
from keras_transformer.export import ExportedTranslator
from tests.export.closed_pipe import ClosedPipe

# Lines TensorFlow's C++ side writes while it starts (seen with TF 2.21 on a CPU machine).
STARTUP_NOISE = re.compile(
    r"absl::InitializeLog|oneDNN custom operations|oneDNN supports|cudart_stub|cpu_feature_guard"
    r"|To enable the following instructions|cuInit|cuda_platform|cuda drivers"
)


def _run_cli(*args, stdin=None):
    env = dict(os.environ)
    for name in ("TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL"):
        env.pop(name, None)  # as a user's shell has it
    return subprocess.run(
        [sys.executable, "-m", "keras_transformer", *args], input=stdin, capture_output=True,
        text=True, timeout=600, env=env,
    )


@pytest.mark.slow
def test_commands_hide_tensorflow_startup_lines_unless_verbose(exported, copy_task):
    stdin = "\n".join(copy_task.held_out[:2]) + "\n"
    quiet = _run_cli("translate", "--export", str(exported), stdin=stdin)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert len(quiet.stdout.splitlines()) == 2
    noise = [line for line in quiet.stderr.splitlines() if STARTUP_NOISE.search(line)]
    assert not noise, noise

    verbose = _run_cli("--verbose", "translate", "--export", str(exported), stdin=stdin)
    assert verbose.returncode == 0, verbose.stderr[-3000:]
    assert verbose.stdout == quiet.stdout
    # Where this TensorFlow build prints start-up lines at all, --verbose lets them through
    # (a process of its own tells, when --verbose printed none).
    if not STARTUP_NOISE.search(verbose.stderr):
        probe = subprocess.run([sys.executable, "-c", "import tensorflow"], capture_output=True,
                               text=True, timeout=300,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"})
        assert not STARTUP_NOISE.search(probe.stderr), verbose.stderr[-2000:]


def test_verbose_is_accepted_before_and_after_the_command():
    parser = cli.build_parser()
    assert parser.parse_args(["--verbose", "translate", "--export", "e"]).verbose
    assert parser.parse_args(["translate", "--export", "e", "--verbose"]).verbose
    assert not parser.parse_args(["translate", "--export", "e"]).verbose


def _lines(count, copy_task):
    # Sentences of very different lengths in a mixed order, so length sorting reorders them.
    sentences = copy_task.held_out[:count]
    return [s if i % 3 else " ".join([s] * 3) for i, s in enumerate(sentences)]


def test_translate_progress_from_a_pipe_counts_without_a_total(monkeypatch):
    # `translate --progress < file` has no total (stdin is read once): the flag was ignored
    # silently. Without the flag a pipe still shows nothing.
    import argparse

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    asked = argparse.Namespace(progress=True, output=None)
    assert cli._progress_bar(asked, None) is not None
    assert cli._progress_bar(argparse.Namespace(progress=None, output="out.txt"), None) is None


@pytest.mark.slow
def test_translate_file_keeps_the_input_order_and_shows_progress(
        exported, copy_task, tmp_path, capsys):
    sentences = _lines(11, copy_task)
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    cli.main(["translate", "--export", str(exported), "--input", str(source), "--output",
              str(output), "--batch-size", "3", "--progress"])
    translator = ExportedTranslator(exported)
    expected = [translator([s])[0] for s in sentences]  # one at a time
    assert output.read_text(encoding="utf-8").splitlines() == expected
    err = capsys.readouterr().err
    assert "11/11" in err, err


@pytest.mark.slow
def test_translate_says_which_lines_were_cut(copy_task, tmp_path, capsys):
    # A line past the export's max_input_length is cut: translate says which, on stderr.
    from keras_transformer.export import export_translator

    short_export = export_translator(copy_task.translator(max_input_length=6),
                                     tmp_path / "export")
    long = "bal dor fen gim hut sel tam vin"
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text(f"ka\n{long}\nlo\n{long}\n", encoding="utf-8")
    cli.main(["translate", "--export", str(short_export), "--input", str(source),
              "--output", str(output)])
    err = capsys.readouterr().err
    assert "2 of 4 lines" in err and "lines 2, 4" in err and "max_input_length" in err
    # evaluate too: its BLEU scores the translations of the cut sources.
    scores = tmp_path / "scores.json"
    cli.main(["evaluate", "--export", str(short_export), "--src", str(source), "--ref",
              str(source), "--json", str(scores)])
    err = capsys.readouterr().err
    assert "2 of 4 lines" in err and "lines 2, 4" in err and "max_input_length" in err
    assert json.loads(scores.read_text())["truncated_lines"] == [2, 4]
    source.write_text("ka\nlo\n", encoding="utf-8")
    cli.main(["translate", "--export", str(short_export), "--input", str(source),
              "--output", str(output)])
    assert "max_input_length" not in capsys.readouterr().err


def test_translate_streams_batches_as_they_finish(exported, copy_task):
    translator = ExportedTranslator(exported)
    calls = []
    function = translator._function

    def counting(**inputs):
        calls.append(int(inputs["text"].shape[0]))
        return function(**inputs)

    translator._function = counting
    sentences = _lines(12, copy_task)
    stream = translator.translate_stream(iter(sentences), batch_size=2, sort_buffer_batches=2)
    first = next(stream)
    # Only the first buffer (2 batches of 2) was translated before the first line came out.
    assert sum(calls) == 4 and first["translation"] == translator([sentences[0]])[0]
    rest = list(stream)
    assert len(rest) == 11 and max(calls) <= 2


@pytest.mark.slow
def test_length_sorted_batches_restore_the_order(exported, copy_task):
    translator = ExportedTranslator(exported)
    batches = []
    function = translator._function

    def recording(**inputs):
        batches.append([t.decode() for t in inputs["text"].numpy().tolist()])
        return function(**inputs)

    translator._function = recording
    sentences = _lines(9, copy_task)
    results = translator.translate(sentences, batch_size=3)
    assert [r["translation"] for r in results] == [translator([s])[0] for s in sentences]
    lengths = [len(s.encode()) for batch in batches[:3] for s in batch]
    assert lengths == sorted(lengths), batches


def test_evaluate_refuses_files_of_different_lengths_before_translating(tmp_path, capsys):
    src, ref = tmp_path / "test.en", tmp_path / "test.de"
    src.write_text("one\ntwo\nthree\n")
    ref.write_text("eins\nzwei\n")
    with pytest.raises(SystemExit) as error:
        # No export exists: the check must come before the model is loaded.
        cli.main(["evaluate", "--export", str(tmp_path / "missing"), "--src", str(src),
                  "--ref", str(ref)])
    message = str(error.value)
    assert str(src) in message and str(ref) in message, message
    assert f"{src} has 3 lines but {ref} has 2" in message, message


@pytest.mark.slow
def test_evaluate_keeps_the_first_call_out_of_the_timing(exported, copy_task, tmp_path,
                                                          monkeypatch, capsys):
    sentences = copy_task.held_out[:6]
    src, ref = tmp_path / "held_out.src", tmp_path / "held_out.ref"
    src.write_text("\n".join(sentences) + "\n")
    ref.write_text("\n".join(sentences) + "\n")
    translate = ExportedTranslator.translate
    first_call_seconds = 2.0
    seen = []

    def slow_first_call(self, *args, **kwargs):
        if not seen:  # as tracing and graph optimization make the first call slow
            time.sleep(first_call_seconds)
        seen.append(1)
        return translate(self, *args, **kwargs)

    monkeypatch.setattr(ExportedTranslator, "translate", slow_first_call)
    scores = tmp_path / "scores.json"
    cli.main(["evaluate", "--export", str(exported), "--src", str(src), "--ref", str(ref),
              "--batch-size", "3", "--json", str(scores)])
    figures = json.loads(scores.read_text())
    seconds = figures["sentences"] / figures["sentences_per_second"]
    assert seconds < first_call_seconds, figures
    assert figures["bleu"] > 50.0
    out = capsys.readouterr().out
    assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in out, out


@pytest.fixture
def run_without_best(copy_task, tmp_path):
    """A run directory whose training ended without a best checkpoint (only model.keras)."""
    run = tmp_path / "run"
    (run / "tokenizer").mkdir(parents=True)
    copy_task.model.save(run / "model.keras")
    shutil.copy(copy_task.tokenizer.model_path, run / "tokenizer" / "tokenizer.model")
    return run


@pytest.mark.slow
def test_export_says_which_checkpoint_it_exported(run_without_best, tmp_path, capsys,
                                                  monkeypatch):
    out_dir = tmp_path / "export"
    monkeypatch.chdir(tmp_path)  # the run named relative to the exporting shell
    cli.main(["export", "--model", "run", "--out", str(out_dir), "--search",
              "greedy", "--checkpoint", "best", "--max-output-length", "16"])
    captured = capsys.readouterr()
    assert "model.keras" in captured.out and "final" in captured.out, captured.out
    assert "no best" in captured.err, captured.err
    metadata = ExportedTranslator(out_dir).metadata
    assert metadata["checkpoint"] == "final", metadata
    assert metadata["checkpoint_requested"] == "best"
    # Where the model came from, readable from any directory.
    assert metadata["run_dir"] == str(run_without_best.resolve())
    assert metadata["checkpoint_path"] == str(run_without_best.resolve() / "model.keras")


@pytest.mark.slow
def test_a_run_without_its_config_is_exported_without_a_direction(run_without_best, tmp_path,
                                                                  capsys):
    # Its direction and data were recorded as Multi30K English->German: the `metadata`
    # signature told clients a wrong direction, and `evaluate --split` read en-de.
    from keras_transformer.export import DecodingConfig, export_run

    path = export_run(run_without_best, tmp_path / "export",
                      decoding=DecodingConfig.for_export(search="greedy", max_output_length=16))
    metadata = ExportedTranslator(path).metadata
    assert (metadata["source_lang"], metadata["target_lang"], metadata["data"]) == ("", "", "")
    assert "has no config.json" in capsys.readouterr().err


@pytest.mark.slow
def test_a_run_exported_from_python_records_what_the_command_records(run_without_best,
                                                                     tmp_path):
    # export/README's Python example (export_translator of a Translator) wrote an export
    # without the run's data source and direction: `evaluate --split` refused it, and its
    # `metadata` signature named no languages.
    import json

    from keras_transformer.export import DecodingConfig, export_run

    config = {"data": "files", "source_lang": "fr", "target_lang": "en",
              "data_files": {"train": ["/d/train.fr", "/d/train.en"]}}
    (run_without_best / "config.json").write_text(json.dumps(config))
    path = export_run(run_without_best, tmp_path / "export",
                      decoding=DecodingConfig.for_export(search="greedy", max_output_length=16))
    assert path == tmp_path / "export" / "1"
    metadata = ExportedTranslator(path).metadata
    assert {key: metadata[key] for key in ("data", "source_lang", "target_lang", "checkpoint",
                                          "checkpoint_requested", "dtype")} == {
        "data": "files", "source_lang": "fr", "target_lang": "en", "checkpoint": "final",
        "checkpoint_requested": "best", "dtype": "float32"}
    assert metadata["training_config"] == config
    assert metadata["data_files"] == config["data_files"]
    import tensorflow as tf

    languages = tf.saved_model.load(str(path)).signatures["metadata"]()
    assert (languages["source_lang"].numpy(), languages["target_lang"].numpy()) == (b"fr", b"en")


def _matmul_dtypes(base_dir):
    """The dtypes (attr `T`) of every MatMul node in an export's graphs and functions."""
    from tensorflow.core.protobuf import saved_model_pb2
    from tensorflow.python.framework import dtypes

    (path,) = base_dir.glob("*/saved_model.pb")
    saved_model = saved_model_pb2.SavedModel()
    saved_model.ParseFromString(path.read_bytes())
    found = set()
    for graph in (meta.graph_def for meta in saved_model.meta_graphs):
        for nodes in [graph.node] + [f.node_def for f in graph.library.function]:
            found.update(dtypes.as_dtype(node.attr["T"].type).name
                         for node in nodes if node.op in ("MatMul", "BatchMatMulV2"))
    return found


@pytest.mark.slow
def test_export_computes_in_float32_whatever_the_run_trained_in(copy_task, tmp_path):
    """A run trained under mixed_bfloat16 (its layers save that policy) exports float32 by
    default, and bfloat16 only when asked."""
    from keras_transformer.model import with_dtype_policy

    run = tmp_path / "run"
    (run / "tokenizer").mkdir(parents=True)
    with_dtype_policy(copy_task.model, "mixed_bfloat16").save(run / "model.keras")
    shutil.copy(copy_task.tokenizer.model_path, run / "tokenizer" / "tokenizer.model")
    translations = {}
    for dtype in (None, "bfloat16"):
        out_dir = tmp_path / f"export-{dtype}"
        cli.main(["export", "--model", str(run), "--out", str(out_dir), "--search", "greedy",
                  "--checkpoint", "final", "--max-output-length", "16"]
                 + (["--dtype", dtype] if dtype else []))
        assert _matmul_dtypes(out_dir) == ({"float32"} if dtype is None else
                                           {"float32", "bfloat16"}), dtype
        exported = ExportedTranslator(out_dir)
        assert exported.metadata["dtype"] == (dtype or "float32")
        translations[dtype] = [t["translation"] for t in exported.translate(copy_task.held_out)]
    # The copy task is learned well enough for bfloat16's rounding to change few outputs.
    same = sum(a == b for a, b in zip(translations[None], translations["bfloat16"]))
    assert same >= 0.8 * len(copy_task.held_out), translations


class _Upper:
    """A stand-in export: the "translation" is the line in capitals; `fail_after` lines
    translated, the next one raises `KeyboardInterrupt` (Ctrl-C), or with `signal` set the
    process gets that signal (`kill`, `timeout`, a scheduler's SIGTERM)."""

    fail_after = None
    signal = None

    def __init__(self, export, signature=None):
        self.path = export  # the version a real one loads

    def translate_stream(self, lines, batch_size=32, on_batch=None):
        for number, line in enumerate(lines):
            if number == self.fail_after:
                if self.signal is None:
                    raise KeyboardInterrupt
                os.kill(os.getpid(), self.signal)
            yield {"translation": line.upper(), "truncated": False, "unfinished": False}


def test_translate_writes_a_gz_output_compressed(tmp_path, monkeypatch):
    # `--input` files ending in .gz are read compressed; `--output hyp.de.gz` was written as
    # plain text under that name, and reading it back failed with "Not a gzipped file".
    import gzip

    from keras_transformer.export import inference

    monkeypatch.setattr(inference, "ExportedTranslator", _Upper)
    source = tmp_path / "in.en.gz"
    with gzip.open(source, "wt", encoding="utf-8") as stream:
        stream.write("a dog\nüber\n")
    output = tmp_path / "out.de.gz"
    cli.main(["translate", "--export", "e", "--input", str(source), "--output", str(output)])
    with gzip.open(output, "rt", encoding="utf-8") as stream:
        assert stream.read() == "A DOG\nÜBER\n"
    # The header's name is the one `gunzip -N` restores: it named the hidden partial file
    # the translation was written to (`.partial-PID-out.de`).
    assert _gzip_header_name(output) == "out.de"


def _gzip_header_name(path):
    header = path.read_bytes()
    assert header[:2] == b"\x1f\x8b" and header[3] & 0x08, "no name in the gzip header"
    return header[10:header.index(b"\0", 10)].decode("latin-1")


def test_translate_reads_a_pipe_given_as_its_input_once(tmp_path, monkeypatch):
    # `--input /dev/stdin` or `--input <(zcat f.gz)`: the lines were counted first (for a
    # progress bar), which used the pipe up; the output was empty, and nothing was said.
    import threading

    from keras_transformer.export import inference

    monkeypatch.setattr(inference, "ExportedTranslator", _Upper)
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)

    def write():
        with open(pipe, "w", encoding="utf-8") as stream:
            stream.write("a dog\na cat\ntwo men\n")

    def close_a_second_reader():  # only a second open of the pipe waits for this writer
        try:
            os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass  # no reader waiting

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    unblock = threading.Timer(3, close_a_second_reader)
    unblock.daemon = True
    unblock.start()
    output = tmp_path / "out.txt"
    cli.main(["translate", "--export", "e", "--input", str(pipe), "--output", str(output)])
    unblock.cancel()
    assert output.read_text(encoding="utf-8") == "A DOG\nA CAT\nTWO MEN\n"


@pytest.mark.parametrize("how", ["ctrl_c", "sigterm", "sighup"])
@pytest.mark.parametrize("name", ["out.txt", "out.txt.gz"])
def test_an_interrupted_translate_leaves_its_output_as_it_was_and_its_lines_beside_it(
        tmp_path, monkeypatch, capsys, how, name):
    # Ctrl-C left --output holding the first lines only under its final name; SIGTERM
    # (`timeout`, `kill`, a scheduler) or SIGHUP did too, without a word, and a .gz one
    # was cut mid-stream. An existing --output was emptied first.
    import gzip
    import signal

    from keras_transformer.export import inference

    monkeypatch.setattr(inference, "ExportedTranslator", _Upper)
    monkeypatch.setattr(_Upper, "fail_after", 2)
    monkeypatch.setattr(_Upper, "signal", {"ctrl_c": None, "sigterm": signal.SIGTERM,
                                           "sighup": signal.SIGHUP}[how])
    source, output = tmp_path / "in.txt", tmp_path / name
    source.write_text("a dog\na cat\ntwo men\n", encoding="utf-8")
    output.write_bytes(b"earlier translations\n")
    # As a terminal's process has them (a test run under `nohup` inherits SIGHUP ignored,
    # which the translation leaves ignored).
    inherited = {signum: signal.signal(signum, signal.SIG_DFL)
                 for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with pytest.raises((SystemExit, KeyboardInterrupt)):
            cli.main(["translate", "--export", "e", "--input", str(source), "--output",
                      str(output)])
        restored = signal.getsignal(signal.SIGTERM)
    finally:
        for signum, handler in inherited.items():
            signal.signal(signum, handler)
    error = capsys.readouterr().err
    partial = tmp_path / (name.replace(".gz", "") + ".partial" + (".gz" if ".gz" in name else ""))
    assert f"{partial} holds the translations of the first 2 of 3 lines" in error, error
    assert f"{output} is left as it was" in error
    assert output.read_bytes() == b"earlier translations\n"
    read = gzip.open if name.endswith(".gz") else open
    with read(partial, "rt", encoding="utf-8") as stream:
        assert stream.read() == "A DOG\nA CAT\n"
    assert restored is signal.SIG_DFL  # given back
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["in.txt", name, partial.name])


def test_a_translate_refused_at_its_first_line_leaves_an_existing_output(tmp_path, monkeypatch):
    # A UTF-16 --input (refused when its first line is read) emptied the --output file,
    # which had been opened, and truncated, first.
    from keras_transformer.export import inference

    monkeypatch.setattr(inference, "ExportedTranslator", _Upper)
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_bytes("a dog\n".encode("utf-16"))
    output.write_text("earlier translations\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="UTF-16"):
        cli.main(["translate", "--export", "e", "--input", str(source), "--output",
                  str(output)])
    assert output.read_text(encoding="utf-8") == "earlier translations\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]


def test_translate_writes_into_an_output_that_is_not_a_plain_file(tmp_path, monkeypatch):
    # Written beside and renamed over it, a symbolic link became a file (its target left as
    # it was), a FIFO or a device a regular file (as root, `--output /dev/null` would have
    # replaced the system's), and a file's mode was lost.
    from keras_transformer.export import inference

    monkeypatch.setattr(inference, "ExportedTranslator", _Upper)
    source = tmp_path / "in.txt"
    source.write_text("a dog\n", encoding="utf-8")
    real, link = tmp_path / "real.txt", tmp_path / "link.txt"
    real.write_text("old\n", encoding="utf-8")
    real.chmod(0o600)
    link.symlink_to(real)
    cli.main(["translate", "--export", "e", "--input", str(source), "--output", str(link)])
    assert link.is_symlink() and real.read_text(encoding="utf-8") == "A DOG\n"
    assert real.stat().st_mode & 0o777 == 0o600
    cli.main(["translate", "--export", "e", "--input", str(source), "--output", os.devnull])
    assert os.path.exists(os.devnull) and not os.path.isfile(os.devnull)
    (tmp_path / "a_directory").mkdir()
    with pytest.raises(SystemExit, match="is a directory"):
        cli.main(["translate", "--export", "e", "--input", str(source), "--output",
                  str(tmp_path / "a_directory")])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a_directory", "in.txt", "link.txt", "real.txt"]


def test_translate_into_a_hard_linked_or_linked_gz_output(tmp_path, monkeypatch):
    # A file with a second hard link was written in place: a UTF-16 input refused at its
    # first line emptied both names. A symbolic link named .gz to a .txt file was written
    # as plain text (the target's name chose).
    import gzip

    from keras_transformer.export import inference

    monkeypatch.setattr(inference, "ExportedTranslator", _Upper)
    source, output, other = tmp_path / "in.txt", tmp_path / "out.txt", tmp_path / "other.txt"
    output.write_text("earlier\n", encoding="utf-8")
    os.link(output, other)
    source.write_bytes("a dog\n".encode("utf-16"))
    with pytest.raises(SystemExit, match="UTF-16"):
        cli.main(["translate", "--export", "e", "--input", str(source), "--output",
                  str(output)])
    assert other.read_text(encoding="utf-8") == "earlier\n"
    source.write_text("a dog\n", encoding="utf-8")
    cli.main(["translate", "--export", "e", "--input", str(source), "--output", str(output)])
    assert other.read_text(encoding="utf-8") == "A DOG\n" and os.path.samefile(output, other)

    real, link = tmp_path / "real.txt", tmp_path / "link.gz"
    link.symlink_to(real)
    cli.main(["translate", "--export", "e", "--input", str(source), "--output", str(link)])
    with gzip.open(link, "rt", encoding="utf-8") as stream:
        assert stream.read() == "A DOG\n"


def test_an_output_in_a_missing_directory_is_refused_before_the_model_loads(
        tmp_path, monkeypatch):
    # The error came after counting the input and loading the model, naming a hidden file.
    from keras_transformer.export import inference

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(inference, "ExportedTranslator", never)
    source = tmp_path / "in.txt"
    source.write_text("a dog\n", encoding="utf-8")
    with pytest.raises(SystemExit, match=r"--output .*nodir/out.txt: the directory .* does "
                                         r"not exist") as error:
        cli.main(["translate", "--export", "e", "--input", str(source), "--output",
                  str(tmp_path / "nodir" / "out.txt")])
    assert ".partial" not in str(error.value)


def test_translate_into_a_fifo_whose_reader_left_ends_quietly(tmp_path, monkeypatch, capsys):
    # "fifo holds the translations of the first 3 lines only" and a Broken pipe error: a
    # FIFO holds nothing; as stdout, a reader that went away ends the command quietly.
    import threading

    from keras_transformer.export import inference

    monkeypatch.setattr(inference, "ExportedTranslator", _Upper)
    source, fifo = tmp_path / "in.txt", tmp_path / "fifo"
    source.write_text("a dog\n" * 100_000, encoding="utf-8")
    os.mkfifo(fifo)

    def read_a_little():
        with open(fifo, "rb") as stream:
            stream.read(10)

    reader = threading.Thread(target=read_a_little, daemon=True)
    reader.start()
    with pytest.raises(SystemExit) as stopped:
        cli.main(["translate", "--export", "e", "--input", str(source), "--output", str(fifo)])
    assert stopped.value.code == 141
    assert "holds" not in capsys.readouterr().err


def test_an_ignored_hangup_does_not_stop_a_translation(tmp_path, monkeypatch):
    # `nohup keras-transformer translate ...`: the translation's own SIGHUP handler ended it.
    import signal

    from keras_transformer.export import inference

    monkeypatch.setattr(inference, "ExportedTranslator", _Upper)
    monkeypatch.setattr(_Upper, "fail_after", 1)
    monkeypatch.setattr(_Upper, "signal", signal.SIGHUP)
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        source, output = tmp_path / "in.txt", tmp_path / "out.txt"
        source.write_text("a dog\na cat\n", encoding="utf-8")
        cli.main(["translate", "--export", "e", "--input", str(source), "--output",
                  str(output)])
        assert output.read_text(encoding="utf-8") == "A DOG\nA CAT\n"
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_a_translation_whose_output_cannot_be_closed_leaves_no_hidden_file(
        tmp_path, monkeypatch, capsys):
    # A full disk at the last write (the close) left `.partial-PID-out.txt` and no word.
    from keras_transformer import textfiles
    from keras_transformer.export import inference

    monkeypatch.setattr(inference, "ExportedTranslator", _Upper)

    class FullDisk(io.StringIO):
        def close(self):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(textfiles, "open_text_output",
                        lambda path, compress=None, name=None: FullDisk())
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("a dog\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="No space left"):
        cli.main(["translate", "--export", "e", "--input", str(source), "--output",
                  str(output)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_translate_output_dash_is_the_standard_output(tmp_path, monkeypatch, capsys):
    # `--output -` (as `--input -` reads stdin) wrote a file named "-".
    from keras_transformer.export import inference

    monkeypatch.setattr(inference, "ExportedTranslator", _Upper)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.txt").write_text("a dog\n", encoding="utf-8")
    cli.main(["translate", "--export", "e", "--input", "in.txt", "--output", "-"])
    assert capsys.readouterr().out == "A DOG\n"
    assert not (tmp_path / "-").exists()


class _LineBreaks(_Upper):
    """A stand-in export whose "translations" hold line breaks (an undertrained or sampling
    model can emit SentencePiece's byte pieces <0x0A> and <0x0D>)."""

    def translate_stream(self, lines, batch_size=32, on_batch=None):
        for line in lines:
            yield {"translation": line.upper().replace(" ", "\r\n").replace("O", "\u2028O")
                   + "\n", "truncated": False, "unfinished": False}


def test_a_translation_holding_line_breaks_is_written_on_its_one_line(tmp_path, monkeypatch):
    # Each line break inside a translation added lines to the output: every later line was
    # written beside the wrong input line.
    from keras_transformer.export import inference

    monkeypatch.setattr(inference, "ExportedTranslator", _LineBreaks)
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("a dog\ntwo men\n", encoding="utf-8")
    cli.main(["translate", "--export", "e", "--input", str(source), "--output", str(output)])
    # Line separators other than CR and LF stay: the reader splits lines at LF only.
    assert output.read_text(encoding="utf-8").split("\n") == ["A D\u2028OG", "TW\u2028O MEN", ""]


def test_translate_into_a_closed_pipe_ends_quietly(tmp_path, monkeypatch, capsys):
    # `keras-transformer translate ... | head -1`: "[Errno 32] Broken pipe" and status 1.
    from keras_transformer.export import inference

    monkeypatch.setattr(inference, "ExportedTranslator", _Upper)
    source = tmp_path / "in.txt"
    source.write_text("a dog\na cat\n", encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    with pytest.raises(SystemExit) as stopped:
        cli.main(["translate", "--export", "e", "--input", str(source)])
    assert stopped.value.code == 141  # 128 + SIGPIPE, as a shell reports a killed reader
    assert capsys.readouterr().err == ""


def test_translate_names_the_cut_lines_with_the_settings_of_the_version_it_used(
        tmp_path, monkeypatch, capsys):
    # The report looked the latest version up again at the end: a version exported during a
    # long translation had its max_input_length quoted for lines the older one had cut.
    from keras_transformer.export import inference

    base = tmp_path / "export"
    for version, limit in ((1, 11), (2, 99)):
        record = base / str(version) / inference.METADATA_PATH
        record.parent.mkdir(parents=True)
        (base / str(version) / "saved_model.pb").write_bytes(b"")
        record.write_text(json.dumps({"decoding": {"max_input_length": limit}}))

    class Cutting(_Upper):
        def __init__(self, export, signature=None):
            self.path = base / "1"  # the version loaded; version 2 appears afterwards

        def translate_stream(self, lines, batch_size=32, on_batch=None):
            for line in lines:
                yield {"translation": line.upper(), "truncated": True, "unfinished": False}

    monkeypatch.setattr(inference, "ExportedTranslator", Cutting)
    source = tmp_path / "in.txt"
    source.write_text("a dog\n", encoding="utf-8")
    cli.main(["translate", "--export", str(base), "--input", str(source), "--output",
              str(tmp_path / "out.txt")])
    error = capsys.readouterr().err
    assert "max_input_length (11 tokens)" in error, error
    # That version deleted while it translated: the report without its figures, no error.
    shutil.rmtree(base / "1")
    cli.main(["translate", "--export", str(base), "--input", str(source), "--output",
              str(tmp_path / "out.txt")])
    error = capsys.readouterr().err
    assert "1 of 1 lines were longer than the export's max_input_length (its tokens)" in error


def test_translate_says_which_lines_were_not_utf8(tmp_path, monkeypatch, capsys):
    # A whole file in cp1251 was translated as replacement characters into fluent nonsense,
    # exit code 0, nothing said (cut and unfinished lines are reported; these were not).
    from keras_transformer.export import inference

    monkeypatch.setattr(inference, "ExportedTranslator", _Upper)
    source = tmp_path / "in.ru"
    source.write_bytes("Наш сосед\n".encode("cp1251") + "ok\n".encode() +
                       "Дом\n".encode("cp1251"))
    cli.main(["translate", "--export", "e", "--input", str(source)])
    captured = capsys.readouterr()
    assert captured.out.count("\n") == 3
    assert "2 of 3 input lines" in captured.err and "not UTF-8" in captured.err
    assert "1, 3" in captured.err and "iconv" in captured.err
    source.write_text("ok\nда\n", encoding="utf-8")
    cli.main(["translate", "--export", "e", "--input", str(source)])
    assert "UTF-8" not in capsys.readouterr().err


def test_translate_from_a_named_pipe_translates_each_line_as_it_comes(tmp_path, monkeypatch):
    # `translate --input /dev/stdin` (or `<(prog)`, a FIFO) read ahead 16 batches of lines
    # before translating any: only `--input -` said when its input paused (`IDLE`), which
    # has the lines read so far translated at once.
    import threading

    from keras_transformer.export import inference

    fifo, output = tmp_path / "lines", tmp_path / "out.txt"
    os.mkfifo(fifo)
    seen = []

    class Recording(_Upper):
        def translate_stream(self, lines, batch_size=32, on_batch=None):
            for line in lines:
                seen.append(line)
                if line is not inference.IDLE:
                    yield {"translation": line.upper(), "truncated": False,
                           "unfinished": False}

    def writer():
        with open(fifo, "wb", buffering=0) as stream:
            stream.write(b"a dog\n")
            time.sleep(1.0)  # a program waiting for the first translation
            stream.write(b"a cat\n")

    monkeypatch.setattr(inference, "ExportedTranslator", Recording)
    monkeypatch.setattr(inference, "IDLE_SECONDS", 0.2)
    threading.Thread(target=writer, daemon=True).start()
    cli.main(["translate", "--export", "e", "--input", str(fifo), "--output", str(output)])
    # A late writer thread may add pauses of its own; the one that matters is between.
    assert [line for line in seen if line is not inference.IDLE] == ["a dog", "a cat"], seen
    assert inference.IDLE in seen[seen.index("a dog"):seen.index("a cat")], seen
    assert output.read_text(encoding="utf-8") == "A DOG\nA CAT\n"

"""`keras-transformer train | export | evaluate` on the user's own files, French->English:
the direction comes from the file names, travels in the export, and `evaluate` reads it."""

import json
import re
import subprocess
import sys

import pytest

from keras_transformer.cli import _data_overrides, build_parser


def _cli(*args, cwd):
    completed = subprocess.run(
        [sys.executable, "-m", "keras_transformer", *args], capture_output=True, text=True,
        timeout=600, cwd=cwd,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout


@pytest.mark.slow
def test_train_export_evaluate_french_to_english_from_files(toy_corpus, tmp_path):
    files = toy_corpus["files"]
    out = _cli("train", "--preset", "tiny", "--output", "run",
               "--train", *files["train"], "--valid", *files["val"],
               "--test", f"toy={files['test'][0]},{files['test'][1]}",
               "--set", "vocab_size=290", "steps_per_epoch=null", "train_subset=null",
               "bleu_sentences=0", cwd=tmp_path)
    assert "Data: files fr->en" in out and "train: 96 pairs read, 96 kept" in out
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (config["data"], config["source_lang"], config["target_lang"]) == ("files", "fr", "en")

    _cli("export", "--model", "run", "--out", "export", "--search", "greedy",
         "--max-output-length", "20", cwd=tmp_path)
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    loaded = tf.saved_model.load(str(tmp_path / "export" / "1"))
    metadata = {k: v.numpy().decode() for k, v in loaded.signatures["metadata"]().items()}
    assert metadata == {"source_lang": "fr", "target_lang": "en", "data": "files"}

    # No --source-lang/--target-lang: the direction and the test set come from the export.
    out = _cli("evaluate", "--export", "export", "--split", "toy", "--json", "scores.json",
               cwd=tmp_path)
    assert "Evaluating on files fr->en [toy]" in out
    assert json.loads((tmp_path / "scores.json").read_text())["sentences"] == 12
    # --src/--ref: the files' sentences, BLEU tokenized for the export's target language.
    out = _cli("evaluate", "--export", "export", "--src", files["val"][0], "--ref",
               files["val"][1], cwd=tmp_path)
    assert f"Evaluating on {files['val'][0]} -> {files['val'][1]}" in out, out
    assert re.search(rf"^{len(toy_corpus['splits']['val'])} sentences in ", out, re.M), out
    assert re.search(r"^BLEU \(cased, detokenized\): \d+\.\d\d$", out, re.M), out


def _train_args(*extra):
    return build_parser().parse_args(["train", "--output", "x", *extra])


def test_train_data_flags(toy_corpus):
    files, tsv = toy_corpus["gz"], toy_corpus["tsv"]
    overrides = _data_overrides(_train_args("--train", *files["train"], "--valid", *files["val"]))
    assert overrides["data"] == "files" and overrides["source_lang"] == "fr"
    assert overrides["data_files"]["validation"] == files["val"]
    overrides = _data_overrides(_train_args(
        "--train", tsv["train"], "--test", f"t1={tsv['test']}", "--source-lang", "fr",
        "--target-lang", "en"))
    assert overrides["data"] == "tsv" and overrides["data_files"]["t1"] == tsv["test"]
    with pytest.raises(SystemExit, match="--source-lang"):
        _data_overrides(_train_args("--train", tsv["train"]))
    with pytest.raises(SystemExit, match="NAME=SRC,TGT"):
        _data_overrides(_train_args("--train", *files["train"], "--test", "nofiles"))
    overrides = _data_overrides(_train_args("--data", "tfds:ted_hrlr_translate/pt_to_en"))
    assert overrides == {"data": "tfds:ted_hrlr_translate/pt_to_en", "source_lang": None,
                         "target_lang": None}
    assert _data_overrides(_train_args("--source-lang", "fr", "--target-lang", "en")) == {
        "source_lang": "fr", "target_lang": "en"}
    # One file with --data files, two with --data tsv: a KeyError's traceback, and a
    # second file dropped silently (then "expected exactly one tab" in the first).
    with pytest.raises(SystemExit, match="--data files.*SRC TGT"):
        _data_overrides(_train_args("--data", "files", "--train", files["train"][0]))
    with pytest.raises(SystemExit, match="--data tsv.*one file"):
        _data_overrides(_train_args("--data", "tsv", "--train", *files["train"],
                                    "--source-lang", "fr", "--target-lang", "en"))


def test_languages_from_set_or_a_config_file_go_with_train_files(toy_corpus, tmp_path):
    # `--set source_lang=fr target_lang=en` (or a --config file saying so) with a TSV file
    # was refused ("a TSV file does not say its languages"); with parallel files the names'
    # languages replaced them, without the check --source-lang gets.
    from keras_transformer.cli import _load_config

    files, tsv = toy_corpus["files"], toy_corpus["tsv"]
    config_file = tmp_path / "fr-en.json"
    config_file.write_text(json.dumps({"source_lang": "fr", "target_lang": "en"}))
    for languages in (["--set", "source_lang=fr", "target_lang=en"],
                      ["--config", str(config_file)]):
        config = _load_config(_train_args("--train", tsv["train"], *languages))
        assert (config.data, config.source_lang, config.target_lang) == ("tsv", "fr", "en")
        config = _load_config(_train_args("--train", *files["train"], *languages))
        assert (config.data, config.source_lang, config.target_lang) == ("files", "fr", "en")
    with pytest.raises(SystemExit, match="source file first"):
        _load_config(_train_args("--train", *files["train"][::-1], "--set", "source_lang=fr",
                                 "target_lang=en"))
    # A config's languages (a run's config.json reused for other data) do not relabel files
    # named otherwise, nor a TFDS dataset's keys: they only fill in for a TSV file.
    other = tmp_path / "en-de.json"
    other.write_text(json.dumps({"source_lang": "en", "target_lang": "de"}))
    config = _load_config(_train_args("--train", *files["train"], "--config", str(other)))
    assert (config.source_lang, config.target_lang) == ("fr", "en")
    config = _load_config(_train_args("--data", "tfds:ted_hrlr_translate/pt_to_en",
                                      "--config", str(other)))
    assert (config.source_lang, config.target_lang) == (None, None)


@pytest.mark.slow
def test_a_run_is_not_resumed_on_training_files_whose_content_changed(toy_corpus, tmp_path):
    # The same paths with other sentences (here upper-cased: the same size) were trained on
    # with the first files' vocabulary, silently.
    import os
    import shutil

    train = [shutil.copy(path, tmp_path) for path in toy_corpus["files"]["train"]]
    args = ["train", "--preset", "tiny", "--output", "run", "--train", *train,
            "--valid", *toy_corpus["files"]["val"], "--set", "vocab_size=290",
            "bleu_sentences=0"]
    _cli(*args, cwd=tmp_path)
    original = open(train[1], "rb").read()
    open(train[1], "wb").write(original.upper())
    completed = subprocess.run(
        [sys.executable, "-m", "keras_transformer", *args, "--epochs", "2"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert completed.returncode != 0
    assert train[1] in completed.stderr and "changed" in completed.stderr, completed.stderr
    # The same content again, written later (a copy, a new checkout): the run continues.
    open(train[1], "wb").write(original)
    os.utime(train[1], ns=(1, 1))
    assert "Continuing after epoch 1 of 2" in _cli(*args, "--epochs", "2", cwd=tmp_path)

"""A user's mistakes on the command line end in one clear message, never a traceback, and
nothing is lost: each case is refused before a model loads or a file is written."""

import importlib.util

import pytest

from keras_transformer.cli import main


def _refused(argv, *expected):
    """Runs the command, which must exit with a message (str) containing `expected`."""
    with pytest.raises(SystemExit) as error:
        main(argv)
    message = str(error.value.code)
    assert not message.isdigit(), f"exit code {message} without a message"
    for part in expected:
        assert part in message, message
    return message


def test_an_unknown_preset_or_field_is_one_message(tmp_path):
    run = str(tmp_path / "run")
    _refused(["train", "--preset", "Quick", "--output", run], "Unknown preset", "quick")
    _refused(["train", "--preset", "tiny", "--output", run, "--set", "dmodel=128"],
             "dmodel", "d_model")
    _refused(["train", "--preset", "tiny", "--output", run, "--set", "num_heads=3"],
             "num_heads")
    assert not (tmp_path / "run").exists()


def test_a_missing_or_malformed_config_file_is_one_message(tmp_path):
    run = str(tmp_path / "run")
    _refused(["train", "--config", str(tmp_path / "missing.yaml"), "--output", run],
             "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("d_model: [256\n")
    _refused(["train", "--config", str(bad), "--output", run], "bad.yaml")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{\"d_model\": }")
    _refused(["train", "--config", str(bad_json), "--output", run], "bad.json")


def test_set_values_of_the_wrong_type_are_refused(tmp_path):
    run = str(tmp_path / "run")
    # Not JSON, so kept as a string: it would have become ('8', ',', '1', '6').
    _refused(["train", "--preset", "tiny", "--output", run, "--set", "bucket_boundaries=8,16"],
             "bucket_boundaries", "[8, 16]")
    _refused(["train", "--preset", "tiny", "--output", run, "--set",
              "time_budget_minutes=55m"], "time_budget_minutes")


def test_files_the_user_names_that_do_not_exist_are_one_message(tmp_path):
    missing = str(tmp_path / "missing")
    _refused(["export", "--model", missing, "--out", str(tmp_path / "out")], missing)
    source = tmp_path / "in.txt"
    source.write_text("A dog runs.\n")
    _refused(["translate", "--export", missing, "--input", str(source)], missing)
    _refused(["translate", "--export", missing, "--input", str(tmp_path / "nope.txt")],
             "nope.txt")
    _refused(["evaluate", "--export", missing, "--split", "test"], missing)


def test_translate_refuses_to_write_over_its_input(tmp_path):
    document = tmp_path / "doc.txt"
    document.write_text("A dog runs.\nTwo men talk.\n")
    # No export is needed: the check comes first.
    _refused(["translate", "--export", str(tmp_path / "missing"), "--input", str(document),
              "--output", str(document)], "doc.txt is the --input file")
    assert document.read_text() == "A dog runs.\nTwo men talk.\n"


def test_translate_refuses_to_write_over_its_standard_input(tmp_path, monkeypatch):
    # `translate --output doc.txt < doc.txt` emptied the document before reading it.
    import sys

    document = tmp_path / "doc.txt"
    document.write_text("A dog runs.\nTwo men talk.\n")
    with open(document, encoding="utf-8") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        _refused(["translate", "--export", str(tmp_path / "missing"), "--output",
                  str(document)], "doc.txt is the standard input")
    assert document.read_text() == "A dog runs.\nTwo men talk.\n"


def test_evaluate_refuses_a_json_path_it_cannot_write_before_translating(tmp_path):
    # `--json nodir/scores.json` failed after the whole translation and the printed scores.
    f = _corpus(tmp_path)
    _refused(["evaluate", "--export", str(tmp_path / "missing"), "--src", f("test.fr"),
              "--ref", f("test.en"), "--json", str(tmp_path / "nodir" / "s.json")], "nodir")


def test_a_negative_show_is_refused_by_the_parser(capsys):
    # `evaluate --show -1` printed every example but the last (a slice to -1).
    with pytest.raises(SystemExit) as error:
        main(["evaluate", "--export", "e", "--show", "-1"])
    assert error.value.code == 2 and "must be >= 0" in capsys.readouterr().err


def test_export_refuses_an_existing_version_as_its_base_directory(tmp_path):
    version = tmp_path / "exports" / "1"
    version.mkdir(parents=True)
    (version / "saved_model.pb").write_bytes(b"")
    # It would have written exports/1/1, which `translate --export exports/1` never reads.
    _refused(["export", "--model", str(tmp_path / "run"), "--out", str(version)],
             str(version), "--out")


def test_export_refuses_a_version_that_exists_before_loading_the_model(tmp_path):
    (tmp_path / "exports" / "3").mkdir(parents=True)
    # Said only after the model had loaded, a minute later on a real run.
    _refused(["export", "--model", str(tmp_path / "run"), "--out", str(tmp_path / "exports"),
              "--version", "3"], "exports/3 exists; pass another --version")
    _refused(["export", "--model", str(tmp_path / "run"), "--out", str(tmp_path / "exports"),
              "--version", "0"], "version must be a positive integer")


@pytest.mark.parametrize("argv", [
    ["evaluate", "--export", "e", "--limit", "0"],
    ["evaluate", "--export", "e", "--limit", "-5"],
    ["evaluate", "--export", "e", "--batch-size", "0"],
    ["translate", "--export", "e", "--batch-size", "0"],
    ["launch", "--local-workers", "0", "--", "train", "--preset", "tiny", "--output", "r"],
])
def test_counts_below_one_are_refused_by_the_parser(argv, capsys):
    with pytest.raises(SystemExit) as error:
        main(argv)
    assert error.value.code == 2  # argparse's usage error
    assert "must be >= 1" in capsys.readouterr().err


def test_launch_without_a_train_command_is_one_message():
    _refused(["launch", "--local-workers", "2"], "train")


def test_evaluate_refuses_a_split_of_an_export_that_records_no_data(tmp_path):
    # An export written from Python without metadata records neither its data nor its
    # direction: `--split test` scored it against Multi30K en->de, whatever it translates.
    import json

    version = tmp_path / "export" / "1"
    (version / "assets.extra").mkdir(parents=True)
    (version / "saved_model.pb").write_bytes(b"")
    (version / "assets.extra" / "translator.json").write_text(
        json.dumps({"decoding": {"search": "beam"}, "exported_at": "2026-11-27T00:00:00Z"}))
    _refused(["evaluate", "--export", str(tmp_path / "export"), "--split", "test"],
             "records no data source", "--src")

    # Languages alone (a Translator's metadata, which the record now holds) name no data
    # source: they had been read as Multi30K's, scoring an own-data model on Multi30K.
    (version / "assets.extra" / "translator.json").write_text(json.dumps(
        {"decoding": {}, "source_lang": "fr", "target_lang": "en"}))
    _refused(["evaluate", "--export", str(tmp_path / "export"), "--split", "test"],
             "records no data source")
    # A record of its data source, or Multi30K's languages named, gets as far as loading the
    # (empty, so unloadable) SavedModel.
    for record, flags in (({"data": "multi30k", "source_lang": "en", "target_lang": "de"}, []),
                          ({"decoding": {}}, ["--source-lang", "en", "--target-lang", "de"])):
        (version / "assets.extra" / "translator.json").write_text(json.dumps(record))
        message = _refused(["evaluate", "--export", str(tmp_path / "export"), "--split", "test",
                            *flags], "keras-transformer evaluate")
        assert "records no data source" not in message and "SavedModel" in message


def _corpus(tmp_path, lines=6):
    for split, count in (("train", lines), ("val", 3), ("test", 3)):
        for lang in ("fr", "en"):
            (tmp_path / f"{split}.{lang}").write_text(
                "".join(f"{split} {lang} {i}\n" for i in range(count)))
    return lambda name: str(tmp_path / name)


def test_test_sets_named_like_the_training_or_validation_split_are_refused(tmp_path):
    # `--test train=...` replaced the training data by the test files, silently.
    f = _corpus(tmp_path)
    base = ["train", "--preset", "tiny", "--output", str(tmp_path / "run"),
            "--train", f("train.fr"), f("train.en"), "--valid", f("val.fr"), f("val.en")]
    for name in ("train", "validation"):
        _refused(base + ["--test", f"{name}={f('test.fr')},{f('test.en')}"],
                 f"--test {name}=", "reserved")
    _refused(base + ["--test", f"news={f('test.fr')},{f('test.en')}",
                     "--test", f"news={f('val.fr')},{f('val.en')}"], "news", "twice")
    assert not (tmp_path / "run").exists()


def test_test_files_are_checked_before_training(tmp_path):
    # A missing or unaligned --test pair surfaced only at `evaluate`, after the training.
    f = _corpus(tmp_path)
    (tmp_path / "short.en").write_text("one line\n")
    base = ["train", "--preset", "tiny", "--output", str(tmp_path / "run"),
            "--train", f("train.fr"), f("train.en")]
    _refused(base + ["--test", f"news={f('test.fr')},{f('nothere.en')}"], "nothere.en")
    _refused(base + ["--test", f"news={f('test.fr')},{f('short.en')}"], "short.en",
             "line counts")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_the_same_file_for_both_sides_is_refused(tmp_path):
    f = _corpus(tmp_path)
    _refused(["train", "--preset", "tiny", "--output", str(tmp_path / "run"), "--train",
              f("train.fr"), f("train.fr"), "--source-lang", "fr", "--target-lang", "en"],
             "train.fr", "both sides")


def test_a_new_run_in_a_directory_of_other_files_is_refused(tmp_path):
    # Once `train` had written into a user's folder, `--overwrite` took it for a run and
    # deleted the user's files with it.
    f = _corpus(tmp_path)
    project = tmp_path / "project"
    project.mkdir()
    (project / "important.txt").write_text("keep me")
    _refused(["train", "--preset", "tiny", "--output", str(project), "--train",
              f("train.fr"), f("train.en")], str(project), "not a run")
    assert sorted(p.name for p in project.iterdir()) == ["important.txt"]


def test_ctrl_c_is_one_line_with_the_way_to_resume(monkeypatch, tmp_path, capsys):
    # Ctrl-C during training printed ~60 lines of KeyboardInterrupt traceback.
    import keras_transformer.training.trainer as trainer

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "train", interrupted)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as error:
        main(["train", "--preset", "tiny", "--output", str(run)])
    assert error.value.code == 130  # the shell's code for an interrupt
    message = capsys.readouterr().err
    assert "Interrupted" in message and "same command" in message and str(run) in message
    assert "Traceback" not in message
    # Run again with --overwrite, the same command would delete the run it interrupted.
    with pytest.raises(SystemExit):
        main(["train", "--preset", "tiny", "--output", str(run), "--overwrite"])
    assert "same command without --overwrite" in capsys.readouterr().err
    monkeypatch.setattr("keras_transformer.cli.cmd_translate", interrupted)
    with pytest.raises(SystemExit) as error:
        main(["translate", "--export", str(tmp_path)])
    assert error.value.code == 130 and "Interrupted" in capsys.readouterr().err


def test_ctrl_c_while_overwrite_deletes_does_not_advise_resuming_the_old_run(
        monkeypatch, tmp_path, capsys):
    # Interrupted while --overwrite deleted checkpoints/, the message said to run the
    # command without --overwrite to resume: that resumed the old run from its backup, its
    # best and epoch checkpoints gone.
    import shutil

    from keras_transformer.training import get_preset

    run = tmp_path / "run"
    (run / "backup").mkdir(parents=True)
    (run / "checkpoints").mkdir()
    get_preset("tiny").to_file(run / "config.json")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "rmtree", interrupted)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(SystemExit) as error:
        main(["train", "--preset", "tiny", "--output", str(run), "--overwrite"])
    assert error.value.code == 130
    message = capsys.readouterr().err
    assert "without --overwrite" not in message and "resume" not in message
    assert "Interrupted while --overwrite deleted" in message
    assert "same command again to start over" in message and str(run) in message


def test_a_cluster_failure_is_one_line_with_the_way_to_resume(monkeypatch, tmp_path, capsys):
    # A worker whose peer died ended in 30-60 lines of TensorFlow traceback.
    import tensorflow as tf

    import keras_transformer.training.trainer as trainer

    def peer_died(*args, **kwargs):
        raise tf.errors.UnavailableError(
            None, None, "Collective ops is aborted by: ...\nThe following tasks are unhealthy "
            "(stopped sending heartbeats):\n/job:worker/replica:0/task:1")

    monkeypatch.setattr(trainer, "train", peer_died)
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["h0:1"]}, "task": {"type": '
                       '"worker", "index": 0}}')
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as error:
        main(["train", "--preset", "tiny", "--output", str(run)])
    message = str(error.value)
    assert message.startswith("keras-transformer train: UnavailableError: Collective ops is "
                              "aborted by: ..."), message
    assert "another worker" in message and "same command" in message and str(run) in message
    assert "Traceback" not in capsys.readouterr().err


def test_a_chief_leaves_a_changed_config_to_the_workers_agreement(monkeypatch, tmp_path):
    # The chief refused a run resumed with other settings before the cluster formed: the
    # other workers, which never check the chief's directory, waited for it until their
    # --cluster-timeout (30 minutes) and ended with no reason. `train` refuses it inside
    # the agreement, on every worker at once.
    import json

    import keras_transformer.training.trainer as trainer
    from keras_transformer.training import get_preset
    from keras_transformer.training.launcher import free_ports

    run = tmp_path / "run"
    run.mkdir()
    get_preset("tiny").to_file(run / "config.json")
    (run / "tokenizer").mkdir()
    (run / "history.json").write_text(json.dumps({"epoch_seconds": [1.0]}))
    ports = free_ports(2)
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": [f"localhost:{port}" for port in ports]},
        "task": {"type": "worker", "index": 0}}))
    calls = []
    monkeypatch.setattr(trainer, "train", lambda *args, **kwargs: calls.append(args)
                        or (_ for _ in ()).throw(trainer.ConfigMismatchError("d_model")))
    with pytest.raises(SystemExit):
        main(["train", "--preset", "tiny", "--output", str(run), "--set", "d_model=32"])
    assert len(calls) == 1
    # One machine: refused at once, as before.
    monkeypatch.delenv("TF_CONFIG")
    calls.clear()
    with pytest.raises(SystemExit, match="d_model"):
        main(["train", "--preset", "tiny", "--output", str(run), "--set", "d_model=32"])
    assert not calls


def test_languages_that_contradict_the_file_names_are_refused(tmp_path):
    # train.fr train.en with --source-lang en --target-lang fr was labelled en->fr while the
    # model learned fr->en from the files' order.
    f = _corpus(tmp_path)
    _refused(["train", "--preset", "tiny", "--output", str(tmp_path / "run"), "--train",
              f("train.fr"), f("train.en"), "--source-lang", "en", "--target-lang", "fr"],
             "train.fr", "source_lang='en'", "source file first")
    assert not (tmp_path / "run").exists()


def test_valid_or_test_files_without_train_files_are_refused(tmp_path):
    # `train --output RUN --test news=SRC,TGT` (adding a test set to a run, or a forgotten
    # --train) trained without them, silently; `evaluate --split news` failed afterwards.
    f = _corpus(tmp_path)
    base = ["train", "--preset", "tiny", "--output", str(tmp_path / "run")]
    for extra in (["--test", f"news={f('test.fr')},{f('test.en')}"],
                  ["--valid", f("val.fr"), f("val.en")]):
        _refused(base + extra, "go with --train", "evaluate --export")
    assert not (tmp_path / "run").exists()


def test_export_flags_the_chosen_search_would_ignore_are_refused(tmp_path):
    # `export --search greedy --beam-size 8` exported greedy search and dropped the flag, as
    # did --jit-max-rows without --jit.
    base = ["export", "--model", str(tmp_path / "run"), "--out", str(tmp_path / "export")]
    for search in ("greedy", "sample"):
        for flag, value in (("--beam-size", "8"), ("--alpha", "1.0"),
                            ("--beam-stopping", "exact"), ("--length-penalty-form", "power")):
            _refused(base + ["--search", search, flag, value], flag, "--search beam")
    _refused(base + ["--jit-max-rows", "8"], "--jit-max-rows", "--jit")
    # The cache and finished-sentence flags change beam search's regular (not XLA) search
    # only: the same SavedModel was written with or without them.
    for search in ("greedy", "sample", "greedy_uncached"):
        _refused(base + ["--search", search, "--growing-cache"], "--growing-cache",
                 "--search beam")
    for flag in ("--growing-cache", "--keep-finished"):
        _refused(base + ["--jit", "--jit-max-rows", "0", flag], flag, "--jit-max-rows 0")
    assert not (tmp_path / "export").exists()


def test_export_refuses_versions_tf_serving_cannot_number_and_a_file_as_base(tmp_path):
    # TF Serving reads versions as int64: a larger one was written and then taken as the
    # latest by translate/evaluate, never by a server. A file as --out failed after the
    # model had loaded ("[Errno 17] File exists").
    base = ["export", "--model", str(tmp_path / "run"), "--out", str(tmp_path / "exports")]
    _refused(base + ["--version", str(2**63)], "int64")
    (tmp_path / "exports" / str(2**63 - 1)).mkdir(parents=True)
    _refused(base, "int64")
    (tmp_path / "a_file").write_text("")
    _refused(["export", "--model", str(tmp_path / "run"), "--out", str(tmp_path / "a_file")],
             "a_file", "is a file")


@pytest.mark.parametrize("url", ["gs://my-bucket/models/translator", "s3://b/m",
                                 "file:///srv/models"])
def test_export_refuses_a_url_as_its_base_directory(tmp_path, monkeypatch, url):
    # `--out gs://bucket/...` wrote a local directory named `gs:` (the path's `//` became
    # `/`) and exited 0: a server watching the bucket found no version.
    from keras_transformer.export.saved_model import check_base_dir

    monkeypatch.chdir(tmp_path)
    _refused(["export", "--model", str(tmp_path / "run"), "--out", url], "URL")
    if importlib.util.find_spec("ctranslate2"):
        _refused(["export-ctranslate2", "--model", str(tmp_path / "run"), "--out", url], "URL")
    with pytest.raises(ValueError, match="a URL"):
        check_base_dir(url)
    assert not list(tmp_path.iterdir())


def test_evaluate_refuses_files_that_are_not_utf8(tmp_path):
    # A Latin-1 reference file was read with U+FFFD for every accented letter: BLEU fell
    # and nothing said why (training refuses such a file, naming the line).
    from keras_transformer.cli import _read_parallel

    (tmp_path / "test.fr").write_text("une maison\nun chien\n", encoding="utf-8")
    (tmp_path / "test.de").write_bytes("ein Haus\nein Hund läuft\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"test\.de:2.*UTF-8.*iconv"):
        _read_parallel(tmp_path / "test.fr", tmp_path / "test.de")


def test_evaluate_reads_blank_lines_at_the_end_of_one_file_as_training_does(tmp_path):
    # Training accepts an editor's blank lines at the end of one file; evaluate --src/--ref
    # refused them ("30 lines but ... 32"). They are no sentences: left out of the count.
    from keras_transformer.cli import _read_parallel

    (tmp_path / "test.fr").write_text("une maison\nun chien\n", encoding="utf-8")
    (tmp_path / "test.de").write_text("ein Haus\nein Hund\n\n  \n", encoding="utf-8")
    expected = (["une maison", "un chien"], ["ein Haus", "ein Hund"])
    assert _read_parallel(tmp_path / "test.fr", tmp_path / "test.de") == expected
    assert _read_parallel(tmp_path / "test.de", tmp_path / "test.fr") == expected[::-1]
    (tmp_path / "more.de").write_text("ein Haus\nein Hund\n\nnoch\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="2 lines but .*more.de has 4"):
        _read_parallel(tmp_path / "test.fr", tmp_path / "more.de")


def test_evaluate_refuses_split_options_with_its_own_files(tmp_path):
    # With --src/--ref, --split, --data-dir and --tfds-dir were ignored (`evaluate --src a
    # --ref b --split news` scored a and b).
    f = _corpus(tmp_path)
    base = ["evaluate", "--export", str(tmp_path / "export"), "--src", f("test.fr"),
            "--ref", f("test.en")]
    for extra in (["--split", "news"], ["--data-dir", "x"], ["--tfds-dir", "x"]):
        message = _refused(base + extra, extra[0], "--src/--ref")
        assert "choose(s)" not in message


def test_a_run_without_a_test_set_is_told_how_to_evaluate(tmp_path):
    # `evaluate` without --split on a run trained without --test said "files fr->en has no
    # split 'test'; it has ['train']", naming a split the user never typed.
    from keras_transformer.export.run import read_split

    f = _corpus(tmp_path)
    spec = {"data": "files", "data_files": {"train": [f("train.fr"), f("train.en")]},
            "source_lang": "fr", "target_lang": "en"}
    with pytest.raises(ValueError, match=r"no test set.*--split validation.*--src/--ref"):
        read_split(spec, "test")
    with pytest.raises(ValueError, match="no split 'news'"):
        read_split(spec, "news")


def test_valid_or_test_files_named_the_other_way_round_are_refused(tmp_path):
    # Only --train's order was checked: --valid dev.en dev.fr for a fr->en run chose
    # best.keras on en->fr pairs, and `evaluate --split news` fed the model English.
    f = _corpus(tmp_path)
    base = ["train", "--preset", "tiny", "--output", str(tmp_path / "run"),
            "--train", f("train.fr"), f("train.en")]
    _refused(base + ["--valid", f("val.en"), f("val.fr")], "val.en", "source file first")
    _refused(base + ["--test", f"news={f('test.en')},{f('test.fr')}"], "test.en",
             "source file first")
    assert not (tmp_path / "run").exists()


def test_evaluate_refuses_a_direction_other_than_the_exports(tmp_path):
    # `evaluate --src test.en --ref test.fr` on a fr->en export, or `--split test
    # --source-lang de --target-lang en` on an en->de one, fed the model the language it
    # translates into and printed a BLEU near 0 without a word.
    import json

    f = _corpus(tmp_path)
    version = tmp_path / "export" / "1"
    (version / "assets.extra").mkdir(parents=True)
    (version / "saved_model.pb").write_bytes(b"")
    record = version / "assets.extra" / "translator.json"
    export = str(tmp_path / "export")
    record.write_text(json.dumps({"data": "files", "source_lang": "fr", "target_lang": "en"}))
    _refused(["evaluate", "--export", export, "--src", f("test.en"), "--ref", f("test.fr")],
             "test.en", "fr->en")
    message = _refused(["evaluate", "--export", export, "--src", f("test.fr"), "--ref",
                        f("test.en")], "SavedModel")
    assert "fr->en" not in message
    # With --src/--ref the languages are checked as with a split: --target-lang de on this
    # export tokenized BLEU as German, unchecked (en on a Chinese export: BLEU near 0), and
    # even the export's own --source-lang was refused as "a split" option.
    files = ["evaluate", "--export", export, "--src", f("test.fr"), "--ref", f("test.en")]
    _refused(files + ["--target-lang", "de"], "fr->en", "--target-lang de")
    _refused(files + ["--source-lang", "en"], "fr->en", "--source-lang en")
    message = _refused(files + ["--source-lang", "fr", "--target-lang", "en"], "SavedModel")
    assert "fr->en" not in message
    record.write_text(json.dumps({"data": "files"}))  # an export naming no languages
    _refused(files + ["--source-lang", "fr"], "--source-lang has no use")
    record.write_text(json.dumps({"data": "multi30k", "source_lang": "en",
                                  "target_lang": "de"}))
    _refused(["evaluate", "--export", export, "--split", "test", "--source-lang", "de",
              "--target-lang", "en"], "en->de", "--source-lang de")
    _refused(["evaluate", "--export", export, "--split", "test", "--target-lang", "fr"],
             "en->de", "--target-lang fr")


def test_several_workers_without_a_preset_or_config_are_refused(tmp_path, monkeypatch):
    # Each worker builds its model from the configuration it is given: without --preset or
    # --config a new run silently trained `quick`, and continuing a run failed with a
    # ConfigMismatchError whose advice was to leave out --preset and --config.
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["h0:1", "h1:1"]}, "task": '
                                    '{"type": "worker", "index": 0}}')
    _refused(["train", "--output", str(tmp_path / "run"), "--epochs", "2"],
             "--preset", "--config", "every worker")
    assert not (tmp_path / "run").exists()


def test_exporting_a_run_directory_that_does_not_exist_says_so(tmp_path):
    # `export --model runs/nope` said "No best model in runs/nope (looked for ...)", as if
    # the run were there without its model.
    from keras_transformer.export.run import model_path

    with pytest.raises(FileNotFoundError, match=r"nope: no such run directory"):
        model_path(tmp_path / "nope")
    (tmp_path / "a_file").write_text("")
    with pytest.raises(FileNotFoundError, match=r"a_file is a file, not a run directory"):
        model_path(tmp_path / "a_file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"No best model in .*empty"):
        model_path(tmp_path / "empty")


def test_a_test_set_given_as_two_words_is_told_the_comma(tmp_path):
    # `--test news=test.fr test.en` (as --train takes its files) failed with argparse's
    # "unrecognized arguments: test.en".
    f = _corpus(tmp_path)
    base = ["train", "--preset", "tiny", "--output", str(tmp_path / "run"),
            "--train", f("train.fr"), f("train.en")]
    _refused(base + ["--test", f"news={f('test.fr')}", f("test.en")],
             f"--test news={f('test.fr')},{f('test.en')}", "comma")
    # Two test sets after one --test: each its own --test, not one joined by a comma.
    _refused(base + ["--test", f"news={f('test.fr')},{f('test.en')}",
                     f"web={f('val.fr')},{f('val.en')}"],
             f"--test news={f('test.fr')},{f('test.en')} --test web=")
    assert not (tmp_path / "run").exists()


def test_evaluate_refuses_a_tsv_given_as_its_source(tmp_path, monkeypatch):
    # `evaluate --src test.tsv --ref test.tsv` translated "source<TAB>reference" lines and
    # scored them: the reference was in the model's input, and nothing was said.
    from keras_transformer import cli

    tsv = tmp_path / "test.tsv"
    tsv.write_text("un chien\ta dog\nune maison\ta house\n", encoding="utf-8")
    monkeypatch.setattr(cli, "_read_parallel", lambda src, ref: (
        ["un chien\ta dog", "une maison\ta house"], ["un chien\ta dog", "une maison\ta house"]))
    args = cli.build_parser().parse_args(["evaluate", "--export", str(tmp_path),
                                          "--src", str(tsv), "--ref", str(tsv)])
    with pytest.raises(SystemExit) as error:
        cli._evaluation_pairs(args, {})
    assert "TSV" in str(error.value) and "cut -f1" in str(error.value)
    # Blank lines alone, or one line holding a tab, are no TSV file: read on (here, to the
    # export's missing record).
    for sources in (["", "  "], ["un chien\ta dog"]):
        monkeypatch.setattr(cli, "_read_parallel", lambda src, ref, s=sources: (s, s))
        with pytest.raises((SystemExit, FileNotFoundError, OSError)) as error:
            cli._evaluation_pairs(args, {})
        assert "TSV" not in str(error.value)


def test_a_worker_index_outside_the_workers_names_the_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "")
    _refused(["train", "--preset", "tiny", "--output", str(tmp_path / "run"),
              "--workers", "a:1,b:1", "--worker-index", "2"],
             "--worker-index 2", "0 or 1", "2 addresses of --workers")
    _refused(["train", "--preset", "tiny", "--output", str(tmp_path / "run"),
              "--workers", "a:1,b:1,a:1", "--worker-index", "0"], "a:1 twice")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_a_single_process_strategy_in_a_cluster_writes_nothing(tmp_path, monkeypatch,
                                                                strategy):
    # Refused, but only after the worker had made its directory: an empty
    # RUN/workertemp_1 stayed behind.
    monkeypatch.setenv("TF_CONFIG", "")
    _refused(["train", "--preset", "tiny", "--output", str(tmp_path / "run"),
              "--strategy", strategy, "--workers", "a:1,b:1", "--worker-index", "1"],
             f"'{strategy}'", "'auto' or 'multi_worker'")
    assert not (tmp_path / "run").exists()

"""A run's life from the command line: `--overwrite` safety, `make run` resumes and
reuses, `average`, `launch` arguments."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from keras_transformer.cli import _overwrite, build_parser, main

_ROOT = pathlib.Path(__file__).resolve().parent.parent


def _train_args(output, *extra):
    return ["train", "--preset", "tiny", "--output", str(output), *extra]


def test_overwrite_refuses_a_directory_that_is_not_a_run(tmp_path):
    precious = tmp_path / "notes.txt"
    precious.write_text("keep me")
    with pytest.raises(SystemExit, match="not a run directory"):
        main(_train_args(tmp_path, "--overwrite"))
    assert precious.read_text() == "keep me"


def test_overwrite_of_the_working_directory_is_refused(tmp_path, monkeypatch):
    (tmp_path / "setup.py").write_text("")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="not a run directory"):
        main(_train_args(".", "--overwrite"))
    assert (tmp_path / "setup.py").exists()


def test_overwrite_deletes_a_run_but_other_workers_directories(tmp_path):
    for name in ("config.json", "history.json", "model.keras"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "workertemp_1").mkdir()
    (tmp_path / "workertemp_1" / "history.json").write_text("{}")
    _overwrite(tmp_path, worker_index=None)
    assert sorted(os.listdir(tmp_path)) == ["workertemp_1"]  # its worker deletes it
    _overwrite(tmp_path, worker_index=1)
    # Its contents: the directory is what that worker holds while it trains.
    assert os.listdir(tmp_path) == ["workertemp_1"]
    assert os.listdir(tmp_path / "workertemp_1") == []
    _overwrite(tmp_path / "missing", worker_index=None)  # nothing to delete is fine


def test_overwrite_of_a_directory_holding_only_other_workers_directories(tmp_path):
    # A worker makes its RUN/workertemp_i before the cluster forms; a first start that
    # failed or was interrupted left only that, and every later `--overwrite` was refused
    # ("not a run directory") until the user deleted it by hand.
    (tmp_path / "workertemp_1" / "backup").mkdir(parents=True)
    _overwrite(tmp_path, worker_index=None)
    assert os.listdir(tmp_path) == ["workertemp_1"]  # its worker deletes it
    (tmp_path / "notes.txt").write_text("keep me")  # anything else is still the user's
    with pytest.raises(SystemExit, match="not a run directory"):
        _overwrite(tmp_path, worker_index=None)


def test_overwrite_names_the_exports_it_deletes_with_the_run(tmp_path, capsys):
    # The README exports into the run (`--out runs/fr-en/export`); --overwrite deleted that
    # SavedModel with the run, a TF Serving base path pointed there included, and said nothing.
    for name in ("config.json", "history.json", "model.keras"):
        (tmp_path / name).write_text("{}")
    for version in ("export/1", "export/2", "serving/7"):
        (tmp_path / version).mkdir(parents=True)
        (tmp_path / version / "saved_model.pb").write_bytes(b"")
    _overwrite(tmp_path, worker_index=None)
    out = capsys.readouterr().out
    assert os.listdir(tmp_path) == []
    assert "export/1, export/2, serving/7" in out and "SavedModel" in out
    for name in ("config.json", "history.json"):
        (tmp_path / name).write_text("{}")
    _overwrite(tmp_path, worker_index=None)  # a run without exports: nothing to name
    assert "SavedModel" not in capsys.readouterr().out


def test_an_interrupted_overwrite_can_be_run_again(tmp_path, monkeypatch):
    # Ctrl-C (or an OSError) while --overwrite deleted a run, after its config.json was gone,
    # left a directory that --overwrite refused as "not a run directory" and a plain rerun
    # as a directory of other files: config.json, what marks a run, now goes last.
    for name in ("config.json", "history.json", "model.keras"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "checkpoints").mkdir()
    order = ["config.json", "history.json", "model.keras", "checkpoints"]  # markers first
    listed = pathlib.Path.iterdir
    monkeypatch.setattr(pathlib.Path, "iterdir", lambda self: iter(
        sorted(listed(self), key=lambda entry: order.index(entry.name))))
    removed = shutil.rmtree

    def interrupted(path, *args, **kwargs):
        monkeypatch.setattr(shutil, "rmtree", removed)
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "rmtree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _overwrite(tmp_path, worker_index=None)
    assert (tmp_path / "config.json").exists() and (tmp_path / "history.json").exists()
    _overwrite(tmp_path, worker_index=None)
    assert os.listdir(tmp_path) == []


def test_an_overwrite_interrupted_before_training_keeps_the_recipe_it_starts(
        tmp_path, monkeypatch, capsys):
    # --overwrite deleted the run's config.json with the rest; interrupted before training
    # wrote the new one (Ctrl-C while TensorFlow started, a data file refused), the next
    # `train --output RUN --overwrite` found no recipe and trained the default preset.
    import keras_transformer.training.trainer as trainer
    from keras_transformer.cli import _load_config
    from keras_transformer.training import TrainingConfig, get_preset
    from keras_transformer.training.trainer import is_run_directory

    monkeypatch.delenv("TF_CONFIG", raising=False)
    old = get_preset("tiny").replace(epochs=5)
    old.to_file(tmp_path / "config.json")
    for name in ("history.json", "model.keras"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "checkpoints").mkdir()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "train", interrupted)
    with pytest.raises(SystemExit, match="130"):  # Ctrl-C, as `main` reports it
        main(_train_args(tmp_path, "--overwrite", "--set", "epochs=3"))
    started = get_preset("tiny").replace(epochs=3)
    assert os.listdir(tmp_path) == ["config.json"]  # the old run's files are gone
    assert is_run_directory(tmp_path)  # a start cut short: resumable, deletable
    capsys.readouterr()
    again = build_parser().parse_args(["train", "--output", str(tmp_path), "--overwrite"])
    assert _load_config(again) == started  # the recipe it had started, not 'quick'
    assert "its own configuration" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="130"):  # and a plain rerun resumes that start
        main(["train", "--output", str(tmp_path)])
    assert TrainingConfig.from_file(tmp_path / "config.json") == started


def test_a_kill_while_overwrite_writes_the_new_recipe_leaves_a_run(tmp_path):
    # Review: --overwrite now writes the new config.json in place of the old one; a kill
    # before the rename leaves the partial file beside it, and a directory holding it was
    # "not a run directory" for --overwrite and "holds other files" for a plain rerun.
    from keras_transformer.training import get_preset
    from keras_transformer.training.trainer import _check_new_run_directory, is_run_directory

    get_preset("tiny").to_file(tmp_path / "config.json")
    (tmp_path / ".partial-4000000-config.json").write_text('{"vocab_')  # killed mid-write
    assert is_run_directory(tmp_path)
    _check_new_run_directory(tmp_path)  # a plain rerun starts
    _overwrite(tmp_path, worker_index=None, config=get_preset("tiny").replace(epochs=3))
    assert os.listdir(tmp_path) == ["config.json"]  # the partial file deleted with the run
    # A new run killed in its first write of config.json leaves only the partial file.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / ".partial-4000000-config.json").write_text("{")
    _overwrite(fresh, worker_index=None, config=get_preset("tiny"))
    assert os.listdir(fresh) == []  # was refused as "not a run directory"


def test_an_overwrite_that_cannot_write_the_new_recipe_keeps_no_old_one(tmp_path, monkeypatch):
    # Review: a full disk while --overwrite wrote the new config.json left the old one alone
    # in the directory, and `--overwrite` alone then started the old recipe over silently.
    import keras_transformer.data.readers as readers
    from keras_transformer.training import get_preset

    get_preset("tiny").to_file(tmp_path / "config.json")
    (tmp_path / "history.json").write_text("{}")

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(readers, "write_json_atomically", full)
    with pytest.raises(OSError, match="No space left"):
        _overwrite(tmp_path, worker_index=None, config=get_preset("tiny").replace(epochs=3))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("cluster, task, temp", [
    ({"worker": ["a:1", "b:2"]}, {"type": "worker", "index": 1}, "workertemp_1"),
    # With a `chief` task, worker 0 is not the chief: its directory is workertemp_0.
    ({"chief": ["c:0"], "worker": ["a:1"]}, {"type": "worker", "index": 0}, "workertemp_0"),
], ids=["worker-1", "worker-0-beside-a-chief"])
def test_overwrite_on_a_worker_named_by_tf_config_deletes_only_its_own_directory(
        cluster, task, temp, monkeypatch, tmp_path):
    # A cluster manager (Kubeflow's TFJob) sets TF_CONFIG, not --worker-index: every
    # worker but the chief must still leave the chief's run directory alone.
    import json

    import keras_transformer.training.trainer as trainer

    def reached(*args, **kwargs):
        raise AssertionError("train() was called")

    monkeypatch.setattr(trainer, "train", reached)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": task}))
    for name in ("config.json", "history.json", "model.keras"):
        (tmp_path / name).write_text("{}")
    (tmp_path / temp).mkdir()
    (tmp_path / temp / "history.json").write_text("{}")
    with pytest.raises(AssertionError, match="train\\(\\) was called"):
        main(_train_args(tmp_path, "--overwrite"))
    assert sorted(os.listdir(tmp_path)) == ["config.json", "history.json", "model.keras", temp]
    assert os.listdir(tmp_path / temp) == []  # its own directory, emptied


def test_resuming_with_another_config_is_refused(tmp_path):
    from keras_transformer.training import get_preset

    get_preset("tiny").to_file(tmp_path / "config.json")
    # A run that trained an epoch (before one, only the vocabulary's settings must stay).
    (tmp_path / "history.json").write_text('{"epoch_seconds": [1.0]}')
    with pytest.raises(SystemExit, match="d_model: 16 in the run, 32 now"):
        main(_train_args(tmp_path, "--set", "d_model=32"))


def test_starting_a_run_over_keeps_its_recipe_on_one_worker_and_says_when_it_cannot(
        tmp_path, monkeypatch, capsys):
    # Review of the --overwrite change: a one-worker TF_CONFIG (launch --local-workers 1)
    # still trained the default preset silently; an unreadable config.json stopped
    # --overwrite without saying how to go on; a run directory without config.json (an
    # --overwrite interrupted before training wrote it) trained `quick` without a word.
    from keras_transformer.cli import _load_config
    from keras_transformer.training import get_preset

    def load(*extra):
        return _load_config(build_parser().parse_args(["train", "--output", str(tmp_path), *extra]))

    tiny = get_preset("tiny").replace(epochs=3)
    tiny.to_file(tmp_path / "config.json")
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker", "index": 0}}))
    assert load("--overwrite") == tiny
    monkeypatch.delenv("TF_CONFIG")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(SystemExit, match="--preset or --config"):
        load("--overwrite")
    (tmp_path / "config.json").unlink()
    capsys.readouterr()
    assert load("--overwrite") == get_preset("quick")
    assert "the default preset 'quick'" in capsys.readouterr().out
    new = tmp_path / "new"
    _load_config(build_parser().parse_args(["train", "--output", str(new)]))
    assert "default preset" not in capsys.readouterr().out  # a new run: nothing to say


def test_another_data_source_drops_the_configs_data_files(tmp_path, monkeypatch):
    # --data multi30k on a run of the user's own files kept the files' `data_files` in the
    # new configuration (reachable since --overwrite reuses the run's own config.json).
    from keras_transformer.cli import _load_config
    from keras_transformer.training import get_preset

    monkeypatch.delenv("TF_CONFIG", raising=False)
    (tmp_path / "train.en").write_text("a\n")
    (tmp_path / "train.de").write_text("b\n")
    files = get_preset("tiny").replace(
        data="files", data_files={"train": [str(tmp_path / "train.en"),
                                            str(tmp_path / "train.de")]})
    run = tmp_path / "run"
    run.mkdir()
    files.to_file(run / "config.json")
    config = _load_config(build_parser().parse_args(
        ["train", "--output", str(run), "--overwrite", "--data", "multi30k"]))
    assert config.data == "multi30k" and config.data_files is None


def test_a_run_continues_with_its_own_config_without_preset(tmp_path, monkeypatch, capsys):
    from keras_transformer.cli import _load_config
    from keras_transformer.training import get_preset

    monkeypatch.delenv("TF_CONFIG", raising=False)
    tiny = get_preset("tiny").replace(epochs=3)
    tiny.to_file(tmp_path / "config.json")

    def load(*extra):
        return _load_config(build_parser().parse_args(["train", "--output", str(tmp_path), *extra]))

    assert load() == tiny
    assert "its own configuration" in capsys.readouterr().out
    assert load("--epochs", "5") == tiny.replace(epochs=5)
    assert load("--preset", "quick") == get_preset("quick")  # asked for: checked on resume
    # Starting over keeps the run's recipe: `--overwrite` alone trained the default preset
    # instead, without a word (a `multi30k` run started over as a 2-epoch `quick` one).
    assert load("--overwrite") == tiny
    assert "over with its own configuration" in capsys.readouterr().out
    assert load("--overwrite", "--epochs", "5") == tiny.replace(epochs=5)
    assert load("--overwrite", "--preset", "quick") == get_preset("quick")
    empty = tmp_path / "new"
    assert _load_config(build_parser().parse_args(["train", "--output", str(empty)])) == (
        get_preset("quick"))
    # Several workers may not share a file system: the run's file is not read (a worker
    # whose directory lacks it would train another model), nor the default preset taken.
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1", "b:2"]}}')
    with pytest.raises(ValueError, match="need --preset or --config"):
        load()
    assert load("--preset", "tiny") == get_preset("tiny")


def test_worker_flags_set_tf_config(monkeypatch, tmp_path):
    from keras_transformer.cli import _set_worker_tf_config

    # Set (not only deleted) so that monkeypatch removes what the call writes afterwards.
    monkeypatch.setenv("TF_CONFIG", "")
    args = build_parser().parse_args(
        _train_args(tmp_path, "--worker-index", "1", "--workers", "a:1,b:2"))
    assert _set_worker_tf_config(args) == 1
    assert os.environ["TF_CONFIG"] == (
        '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}')
    with pytest.raises(SystemExit, match="go together"):
        _set_worker_tf_config(build_parser().parse_args(_train_args(tmp_path, "--workers", "a:1")))


@pytest.mark.parametrize("cluster", ["flags", "tf_config"])
def test_several_workers_train_the_budgeted_preset(cluster, monkeypatch, tmp_path):
    # The `multi30k` preset trains for a time budget, which several workers share (they
    # record the slowest worker's epoch times): the command reaches the trainer.
    import keras_transformer.training.trainer as trainer

    def reached(config, *args, **kwargs):
        raise AssertionError(f"train() was called, budget {config.time_budget_minutes}")

    monkeypatch.setattr(trainer, "train", reached)
    monkeypatch.setenv("TF_CONFIG", "")
    args = ["train", "--preset", "multi30k", "--output", str(tmp_path / "run")]
    if cluster == "flags":
        args += ["--worker-index", "0", "--workers", "a:1,b:2"]
    else:
        monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1", "b:2"]}, '
                                        '"task": {"type": "worker", "index": 1}}')
    with pytest.raises(AssertionError, match="train\\(\\) was called, budget 55"):
        main(args)


def test_the_tfjob_example_passes_the_workers_checks(monkeypatch):
    # docs/tfjob.yaml's command, run by each of its workers, reaches the trainer.
    import json

    import yaml

    import keras_transformer.training.trainer as trainer

    job = yaml.safe_load((_ROOT / "docs" / "tfjob.yaml").read_text())
    workers = job["spec"]["tfReplicaSpecs"]["Worker"]
    command = workers["template"]["spec"]["containers"][0]["command"]
    assert command[0] == "keras-transformer" and workers["replicas"] > 1

    def reached(*args, **kwargs):
        raise AssertionError("train() was called")

    monkeypatch.setattr(trainer, "train", reached)
    from keras_transformer.training.launcher import free_ports

    port = free_ports(1)[0]  # this task's port is probed: one nothing listens on
    hosts = [f"worker-{i}:{port}" for i in range(workers["replicas"])]
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": 1}}))
    with pytest.raises(AssertionError, match="train\\(\\) was called"):
        main(command[1:])


def test_launch_and_average_parse():
    args = build_parser().parse_args(
        ["launch", "--local-workers", "2", "--", "train", "--preset", "tiny", "--output", "r"])
    assert args.local_workers == 2 and args.train_args[-4:] == ["--preset", "tiny", "--output", "r"]
    args = build_parser().parse_args(["average", "--model", "r", "--last", "3"])
    assert (args.model, args.last) == ("r", 3)
    args = build_parser().parse_args(["export", "--model", "r", "--out", "o", "--checkpoint",
                                      "averaged"])
    assert args.checkpoint == "averaged"


def _make(*args):
    return subprocess.run(["make", "-C", str(_ROOT), *args], capture_output=True, text=True,
                          timeout=900)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_run_does_not_overwrite_unless_fresh():
    dry = _make("-n", "run", "STAMP=")
    assert dry.returncode == 0, dry.stderr
    assert "--overwrite" not in dry.stdout
    assert "--overwrite" in _make("-n", "run", "STAMP=", "FRESH=1").stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_run_exports_again_after_an_interrupted_export(tmp_path):
    # An export killed or interrupted left RUN/export without a version inside, newer than
    # model.keras: every later `make run` reused it and its evaluation failed.
    run = tmp_path / "run"
    (run / "export" / ".tmp-1-123").mkdir(parents=True)
    (run / "model.keras").write_text("")
    os.utime(run / "model.keras", ns=(1, 1))
    made = _make("run", "PY=true", "STAMP=", f"RUN_DIR={run}")
    assert made.returncode == 0, made.stderr
    assert "Reusing the export" not in made.stdout and "export --model" in made.stdout
    (run / "export" / "1").mkdir(parents=True)
    (run / "evaluation.txt").write_text("BLEU")
    assert "Reusing the export" in _make("run", "PY=true", "STAMP=", f"RUN_DIR={run}").stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_run_adds_a_version_to_the_export_a_server_reads(tmp_path):
    # A retrained model's `make run` deleted RUN/export, the directory
    # export/docker-compose.yml serves, and exported version 1 again: a server polling then
    # had no model, and one that had loaded version 1 never saw the new one.
    run = tmp_path / "run"
    (run / "export" / "1").mkdir(parents=True)
    (run / "export" / "1" / "saved_model.pb").write_bytes(b"")
    (run / "evaluation.txt").write_text("BLEU of version 1")
    os.utime(run / "export", ns=(1, 1))
    (run / "model.keras").write_text("")  # trained after the export
    made = _make("run", "PY=true", "STAMP=", f"RUN_DIR={run}")
    assert made.returncode == 0, made.stderr
    assert "export --model" in made.stdout and "rm -rf" not in made.stdout
    assert (run / "export" / "1" / "saved_model.pb").exists()
    # The old version's evaluation is not reused: the new version is evaluated (`PY=true`
    # writes an empty one).
    assert (run / "evaluation.txt").read_text() != "BLEU of version 1"
    assert "evaluate --export" in made.stdout


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_run_reuses_a_finished_run(tmp_path):
    run = tmp_path / "run"
    variables = [f"PY={sys.executable}", "STAMP=", f"RUN_DIR={run}", "PRESET=tiny",
                 f"TRAIN_ARGS=--tfds-dir {tmp_path / 'tfds'}",
                 f"EVAL_ARGS=--limit 10 --tfds-dir {tmp_path / 'tfds'}"]
    first = _make("run", *variables)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "Trained 1 epoch(s)" in first.stdout and "BLEU (cased" in first.stdout
    modified = {p: p.stat().st_mtime_ns for p in (run / "model.keras", run / "export")}

    again = _make("run", *variables)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Reusing the finished run" in again.stdout
    assert "Reusing the export" in again.stdout and "Reusing the evaluation" in again.stdout
    assert again.stdout.count("SRC: ") == first.stdout.count("SRC: ") > 0
    assert {p: p.stat().st_mtime_ns for p in modified} == modified


def test_a_resumed_run_says_how_many_epochs_this_call_trained(tmp_path, monkeypatch, capsys):
    # A run interrupted after epoch 1 and resumed printed "Trained 4 epoch(s) in <the whole
    # run's minutes>" when the resumed call had trained 3.
    import keras_transformer.training.trainer as trainer

    monkeypatch.delenv("TF_CONFIG", raising=False)
    history = {"loss": [4.0, 3.0, 2.0, 1.0]}

    def trained(epochs):
        def train(config, output, **kwargs):
            return trainer.TrainingRun(model=None, source_tokenizer=None, target_tokenizer=None,
                                    config=config, output_dir=output, history=history,
                                    train_seconds=240.0, epochs_trained=epochs)
        return train

    monkeypatch.setattr(trainer, "train", trained(3))
    main(_train_args(tmp_path / "run"))
    out = capsys.readouterr().out
    assert "Trained 3 epoch(s) (epochs 2-4 of the run, which took 4.0 min in all)" in out, out
    monkeypatch.setattr(trainer, "train", trained(4))
    main(_train_args(tmp_path / "run2"))
    assert "Trained 4 epoch(s) in 4.0 min; run directory" in capsys.readouterr().out

"""Checkpoint averaging: the averaged model's weights are the mean of the checkpoints."""

import json
import pathlib

import keras
import numpy as np
import pytest

from keras_transformer.checkpoint_files import average_record_path
from keras_transformer.export.run import load_run, model_path
from keras_transformer.model import build_transformer
from keras_transformer.training.averaging import average_checkpoints, average_run


def _tiny_model():
    return build_transformer(vocab_size=40, d_model=8, num_heads=2, ff_dim=16, num_layers=1,
                             max_length=16)


def _write_checkpoint(path, weights):
    np.savez(path, *weights)


@pytest.fixture
def run_dir(tmp_path):
    """A run directory with a final model and 4 epoch checkpoints of random weights."""
    model = _tiny_model()
    model.save(tmp_path / "model.keras")
    (tmp_path / "checkpoints").mkdir()
    rng = np.random.default_rng(0)
    for epoch in range(1, 5):
        weights = [rng.normal(size=w.shape).astype(w.dtype) for w in model.get_weights()]
        _write_checkpoint(tmp_path / "checkpoints" / f"epoch-{epoch:03d}.weights.npz", weights)
    (tmp_path / "config.json").write_text(json.dumps({"d_model": 8}))
    return tmp_path


def _stored(path):
    with np.load(path) as stored:
        return [stored[f"arr_{i}"] for i in range(len(stored.files))]


def test_averaged_weights_are_the_mean_of_the_last_n(run_dir):
    path, used = average_run(run_dir, last=3)
    assert [p.rsplit("/", 1)[-1] for p in used] == [
        "epoch-002.weights.npz", "epoch-003.weights.npz", "epoch-004.weights.npz"]
    averaged = keras.saving.load_model(path, compile=False).get_weights()
    checkpoints = [_stored(p) for p in used]
    for i, weight in enumerate(averaged):
        expected = np.mean([c[i] for c in checkpoints], axis=0)
        np.testing.assert_allclose(weight, expected, rtol=1e-6, atol=1e-7)


def test_export_loads_the_averaged_checkpoint(run_dir, monkeypatch):
    with pytest.raises(FileNotFoundError, match="keras-transformer average"):
        model_path(run_dir, "averaged")
    path, _ = average_run(run_dir, last=2)
    assert model_path(run_dir, "averaged") == path
    loaded = keras.saving.load_model(path, compile=False)
    import keras_transformer.export.run as run_module

    monkeypatch.setattr(run_module, "load_tokenizers", lambda directory: (None, None))
    model, _, _, config = load_run(run_dir, "averaged")
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert config == {"d_model": 8}


def test_average_of_one_checkpoint_is_itself(run_dir):
    used = sorted((run_dir / "checkpoints").glob("epoch-*.npz"))[-1:]
    average, stored = average_checkpoints(used), _stored(used[0])
    assert len(average) == len(stored) > 0
    for a, b in zip(average, stored):
        np.testing.assert_array_equal(a, b)


def test_no_checkpoints_says_how_to_keep_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="keep_checkpoints"):
        average_run(tmp_path, last=5)


def test_a_run_directory_that_does_not_exist_is_told_so(tmp_path):
    # `average --model runs/typo` advised training with keep_checkpoints.
    with pytest.raises(FileNotFoundError, match=r"typo: no such run directory"):
        average_run(tmp_path / "typo", last=5)
    (tmp_path / "a_file").write_text("")
    with pytest.raises(FileNotFoundError, match=r"a_file is a file, not a run directory"):
        average_run(tmp_path / "a_file", last=5)


def test_an_average_older_than_the_runs_epochs_is_not_exported(run_dir):
    # A run continued after `average`: --checkpoint averaged exported epochs 3-4 of a
    # 5-epoch run, silently.
    path, _ = average_run(run_dir, last=2)
    newer = run_dir / "checkpoints" / "epoch-005.weights.npz"
    _write_checkpoint(newer, _tiny_model().get_weights())
    _age(newer, 10)  # whatever the files' times say
    with pytest.raises(ValueError, match=r"epoch-003.*epoch-004.*later epoch checkpoints "
                                         r"\(epoch-005.*keras-transformer average"):
        model_path(run_dir, "averaged")
    average_run(run_dir, last=2)
    assert model_path(run_dir, "averaged") == path


def test_a_run_that_trained_past_its_last_checkpoint_is_not_averaged_or_exported(run_dir):
    # A run continued with keep_checkpoints=0 kept no checkpoint of its later epochs:
    # `average --last 3` averaged epochs 2-4 of a 6-epoch run, and export took it.
    path, _ = average_run(run_dir, last=3)  # the run's 4 epochs: current
    assert model_path(run_dir, "averaged") == path
    (run_dir / "model.keras.json").write_text('{"epoch": 6}')  # it trained on to 6
    with pytest.raises(ValueError, match=r"epoch-004.*final model holds 6 epochs.*"
                                         r"keep_checkpoints"):
        model_path(run_dir, "averaged")
    with pytest.raises(ValueError, match=r"newest epoch checkpoint is epoch-004.*6 epochs"):
        average_run(run_dir, last=3)


def test_an_unfinished_run_is_averaged_from_its_last_checkpoint(run_dir):
    # A run stopped before model.keras (killed, or still training): its epoch checkpoints
    # were refused ("the run has not finished").
    (run_dir / "model.keras").rename(run_dir / "checkpoints" / "last.keras")
    path, used = average_run(run_dir, last=2)
    assert len(used) == 2 and path.is_file()
    with pytest.raises(FileNotFoundError, match="model.keras nor checkpoints/last.keras"):
        (run_dir / "checkpoints" / "last.keras").unlink()
        average_run(run_dir, last=2)


def _age(path, seconds):
    import os

    stamp = path.stat().st_mtime_ns - seconds * 10**9
    os.utime(path, ns=(stamp, stamp))


def test_a_copied_run_exports_its_current_average(run_dir):
    # `cp -r` (no -p) gives every file the copy's time, in the order it copies them:
    # checkpoints/averaged.keras came out older than epoch-00N and export refused a
    # current average.
    path, _ = average_run(run_dir, last=2)
    _age(path, 10)
    assert model_path(run_dir, "averaged") == path


def test_an_average_of_epochs_trained_again_is_not_exported(run_dir):
    # A run shortened and trained again (its epoch 4 checkpoint rewritten after the
    # average) with file times that do not tell: the average is of the old epoch 4.
    path, _ = average_run(run_dir, last=2)
    epoch_4 = run_dir / "checkpoints" / "epoch-004.weights.npz"
    _write_checkpoint(epoch_4, _tiny_model().get_weights())
    _age(epoch_4, 10)
    with pytest.raises(ValueError, match=r"epoch-004.*content changed.*keras-transformer "
                                         r"average --model RUN --last 2"):
        model_path(run_dir, "averaged")


def test_an_average_stays_current_when_its_checkpoints_are_deleted(run_dir):
    # Deleting the epoch checkpoints after averaging (to save space) leaves the average
    # exportable.
    path, used = average_run(run_dir, last=2)
    for checkpoint in (run_dir / "checkpoints").glob("epoch-*.npz"):
        checkpoint.unlink()
    assert model_path(run_dir, "averaged") == path


def test_an_average_without_its_record_falls_back_to_file_times(run_dir):
    # Averages written before the record existed: their age is all there is to go on.
    path, _ = average_run(run_dir, last=2)
    pathlib.Path(average_record_path(path)).unlink()
    _write_checkpoint(run_dir / "checkpoints" / "epoch-005.weights.npz",
                      _tiny_model().get_weights())
    _age(path, 10)
    with pytest.raises(ValueError, match=r"older than.*epoch-005"):
        model_path(run_dir, "averaged")


def test_an_average_of_epochs_a_resumed_run_dropped_is_not_exported(run_dir):
    # A run killed after its epoch-4 checkpoint but before its backup of epoch 4 resumes
    # from epoch 3 and drops epoch 4's checkpoint (`drop_epoch_checkpoints_after`): an
    # average taken in between holds weights the run threw away.
    from keras_transformer.training.callbacks import drop_epoch_checkpoints_after

    path, _ = average_run(run_dir, last=2)
    drop_epoch_checkpoints_after(run_dir / "checkpoints", 3)
    with pytest.raises(ValueError, match=r"epoch-004.*no longer has.*--last 2"):
        model_path(run_dir, "averaged")


def test_the_record_names_the_averaged_checkpoints_and_their_content(run_dir):
    from keras_transformer.textfiles import file_digest

    path, used = average_run(run_dir, last=2)
    record = json.loads(pathlib.Path(average_record_path(path)).read_text())
    assert record == {"averaged": [
        {"epoch": epoch, "name": f"epoch-{epoch:03d}.weights.npz",
         "blake2b": file_digest(run_dir / "checkpoints" / f"epoch-{epoch:03d}.weights.npz")}
        for epoch in (3, 4)]}


@pytest.mark.parametrize("content", [
    "{", '{"averaged": []}', '{"averaged": [{"epoch": 3}]}',
    '{"averaged": [{"epoch": "3", "name": "epoch-003.weights.npz", "blake2b": "x"}]}',
    '{"averaged": [{"epoch": 3, "name": "../epoch-003.weights.npz", "blake2b": "x"}]}',
])
def test_an_unreadable_record_says_to_average_again(run_dir, content):
    path, _ = average_run(run_dir, last=2)
    pathlib.Path(average_record_path(path)).write_text(content)
    with pytest.raises(ValueError, match=r"cannot be read.*keras-transformer average"):
        model_path(run_dir, "averaged")


def test_reading_a_run_directory_loads_no_training_or_data_code():
    # `export` and `evaluate` read run directories (export/run.py); the averaged model's
    # check must not pull training's modules (and with them TensorFlow Datasets) in. The
    # package loads the modules of what a saved model holds (loss, metric, optimizer,
    # schedule: Keras and TensorFlow only), so that its `.keras` files load.
    import ast

    from tests.module_loading import modules_loaded_by

    assert modules_loaded_by("keras_transformer.export.run", (
        "tensorflow_datasets", "keras_transformer.data")) == "[]"
    training = ast.literal_eval(modules_loaded_by("keras_transformer.export.run", (
        "keras_transformer.training",)))
    assert set(training) <= {"keras_transformer.training"} | {
        f"keras_transformer.training.{name}"
        for name in ("losses", "metrics", "optimizers", "schedules")}, training


def test_average_to_another_file_does_not_point_export_at_the_run(run_dir, capsys):
    # `average --out FILE` said "export it with --checkpoint averaged", which exports the
    # run's own checkpoints/averaged.keras, not FILE.
    from keras_transformer.cli import main

    main(["average", "--model", str(run_dir), "--last", "2",
          "--out", str(run_dir / "elsewhere.keras")])
    said = capsys.readouterr().out
    assert "elsewhere.keras" in said and "export it with" not in said
    assert "load_model" in said
    main(["average", "--model", str(run_dir), "--last", "2"])
    assert "export it with `keras-transformer export" in capsys.readouterr().out


def test_the_export_command_average_suggests_runs_as_printed(run_dir, capsys):
    # `average` said "export it with `keras-transformer export --model RUN --checkpoint
    # averaged`", which export refused: its --out is required.
    import shlex
    import shutil

    from keras_transformer.cli import build_parser, main

    def suggested(run):
        """The arguments of the export command `average` prints for `run`."""
        main(["average", "--model", str(run), "--last", "2"])
        said = capsys.readouterr().out
        command = shlex.split(said.split("export it with `", 1)[1].split("`", 1)[0])
        assert command[:2] == ["keras-transformer", "export"]
        return build_parser().parse_args(command[1:])

    args = suggested(run_dir)
    assert (args.model, args.checkpoint) == (str(run_dir), "averaged") and args.out
    # A run whose path has a space: the printed command still pastes as one.
    spaced = run_dir.parent / "my run"
    shutil.copytree(run_dir, spaced)
    args = suggested(spaced)
    assert args.model == str(spaced) and args.out == str(spaced / "export")


def test_an_average_killed_while_saving_leaves_no_partial_model_behind(run_dir):
    # A kill -9 during `keras-transformer average` left `.partial-PID-averaged.keras` (a whole
    # model) in checkpoints/ until the next training start; the next average removes it.
    import subprocess
    import sys
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    left = run_dir / "checkpoints" / f".partial-{child.pid}-averaged.keras"
    left.write_bytes(b"half a model")
    # Another machine's training (a shared volume) writing its epoch: its process id means
    # nothing here, so only the average's own partial files are removed.
    other = run_dir / "checkpoints" / f".partial-{child.pid}-epoch-005.weights.npz"
    other.write_bytes(b"half an epoch")
    average_run(run_dir, last=2)
    assert not left.exists() and other.exists()
    assert (run_dir / "checkpoints" / "averaged.keras").is_file()


def test_an_average_is_written_only_as_a_keras_model_file(run_dir, tmp_path):
    # `--out avg` failed with "The filename must end in `.weights.h5`", naming a temporary
    # file; `--out avg.weights.h5` wrote weights alone, which `load_model` cannot read,
    # and was announced as a Keras model file.
    (tmp_path / "a_directory").mkdir()
    for out in ("avg", "avg.weights.h5", "avg.h5", "a_directory"):
        with pytest.raises(ValueError, match=r"\.keras"):
            average_run(run_dir, last=2, output=tmp_path / out)
        assert not list(tmp_path.glob("*avg*"))
    with pytest.raises(ValueError, match="does not exist"):
        average_run(run_dir, last=2, output=tmp_path / "missing" / "avg.keras")
    path, _ = average_run(run_dir, last=2, output=tmp_path / "avg.keras")
    assert keras.saving.load_model(path, compile=False).count_params() > 0


def test_average_says_when_the_run_kept_fewer_epochs_than_asked(run_dir, capsys):
    # `average --last 6` on a run that kept 4 said "Averaged 4 checkpoint(s)" and nothing of
    # the two missing.
    from keras_transformer.cli import main

    main(["average", "--model", str(run_dir), "--last", "6"])
    out = capsys.readouterr().out
    assert "Averaged 4 checkpoint(s)" in out and "kept 4 of the 6" in out
    main(["average", "--model", str(run_dir), "--last", "2"])
    assert "kept" not in capsys.readouterr().out


def _keep_epochs(run_dir, epochs, final_epochs):
    """Leaves the epoch checkpoints `epochs` (renamed from the fixture's) and records the
    final model as holding `final_epochs`."""
    directory = run_dir / "checkpoints"
    existing = sorted(directory.glob("epoch-*.weights.npz"))
    for path in existing:
        path.rename(directory / ("old-" + path.name))
    for epoch, path in zip(epochs, sorted(directory.glob("old-*"))):
        path.rename(directory / f"epoch-{epoch:03d}.weights.npz")
    for path in directory.glob("old-*"):
        path.unlink()
    (run_dir / "model.keras.json").write_text(json.dumps({"epoch": final_epochs}))


def test_an_average_of_epochs_with_a_gap_is_refused(run_dir, capsys):
    # A continuation with keep_checkpoints=0 (epochs 5-6), then one with 3 again, kept
    # epochs 4, 7 and 8: `--last 3` averaged epoch 4 with 7 and 8 and said nothing.
    from keras_transformer.cli import main

    _keep_epochs(run_dir, [4, 7, 8], final_epochs=8)
    with pytest.raises(ValueError, match=r"(?s)epoch-004.*epoch-007.*not consecutive.*--last 2"):
        average_run(run_dir, last=3)
    with pytest.raises(SystemExit, match="not consecutive"):
        main(["average", "--model", str(run_dir), "--last", "5"])
    assert not (run_dir / "checkpoints" / "averaged.keras").exists()
    path, used = average_run(run_dir, last=2)
    assert [pathlib.Path(p).name for p in used] == ["epoch-007.weights.npz",
                                                     "epoch-008.weights.npz"]


def test_an_average_written_across_a_gap_is_not_exported(run_dir):
    # Averages written before the refusal above: their record names epochs 4, 7 and 8.
    from keras_transformer.checkpoint_files import average_record, check_average_is_current

    _keep_epochs(run_dir, [4, 7, 8], final_epochs=8)
    path, _ = average_run(run_dir, last=2)
    checkpoints = sorted((run_dir / "checkpoints").glob("epoch-*.weights.npz"))
    record = average_record([(int(p.name[6:9]), str(p)) for p in checkpoints])
    pathlib.Path(average_record_path(path)).write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"(?s)not consecutive.*average --model RUN --last"):
        check_average_is_current(path)


@pytest.mark.parametrize("name", ["model.keras", "checkpoints/best.keras",
                                  "checkpoints/last.keras"])
def test_an_average_never_overwrites_the_runs_own_models(run_dir, name):
    # `average --out RUN/model.keras` replaced the final model and its epoch record: a
    # continuation then restarted the optimizer (step 0, no moments) with one warning.
    target = run_dir / name
    keras_file = target.exists()
    if not keras_file:
        _tiny_model().save(target)
    before = target.read_bytes()
    with pytest.raises(ValueError, match=r"a run's own"):
        average_run(run_dir, last=2, output=target)
    assert target.read_bytes() == before



def test_an_average_never_overwrites_another_runs_models(run_dir, tmp_path):
    other = tmp_path / "other_run"
    (other / "checkpoints").mkdir(parents=True)
    (other / "config.json").write_text("{}")
    (other / "history.json").write_text("{}")
    # A folder of another tool's, with a config.json, is not a run.
    (tmp_path / "hub_model").mkdir()
    (tmp_path / "hub_model" / "config.json").write_text("{}")
    path, _ = average_run(run_dir, last=2, output=tmp_path / "hub_model" / "model.keras")
    assert path.is_file()
    for name in ("model.keras", "checkpoints/best.keras", "checkpoints/last.keras"):
        with pytest.raises(ValueError, match=r"a run's own"):
            average_run(run_dir, last=2, output=other / name)
    path, _ = average_run(run_dir, last=2, output=other / "averaged_elsewhere.keras")
    assert path.is_file()

"""A run's life on one machine with the real model on the real, shuffled pipeline:
resume after a kill, continue a finished run, refuse a changed configuration."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from keras_transformer.training import get_preset
from keras_transformer.training.callbacks import read_run_history
from keras_transformer.training.callbacks import time_budget_reached
from keras_transformer.training.trainer import (
    ConfigMismatchError,
    check_resumable,
    epoch_seed,
    is_run_directory,
    planned_epochs,
    prepare_tokenizers,
    train,
)

_SCRIPT = os.path.join(os.path.dirname(__file__), "run_child.py")


def _run(output_dir, result, tfds_dir, *extra):
    command = [sys.executable, _SCRIPT, str(output_dir), str(result), "--tfds-dir",
               str(tfds_dir), *map(str, extra)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def _assert_same_state(actual, expected):
    names = [n for n in expected.files if n != "epochs_run"]
    assert sorted(n for n in actual.files if n != "epochs_run") == sorted(names)
    assert any(n.startswith("optimizer_") for n in names)
    for name in names:
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-5, atol=1e-7,
                                   err_msg=name)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, multi30k_tfds_dir):
    """An uninterrupted 3-epoch run."""
    directory = tmp_path_factory.mktemp("reference")
    completed = _run(directory / "run", directory / "result.npz", multi30k_tfds_dir)
    assert completed.returncode == 0, completed.stderr[-4000:]
    (directory / "stderr.txt").write_text(completed.stderr)
    return directory


@pytest.mark.slow
def test_training_warns_of_nothing_it_does_on_purpose(reference):
    # The pipeline shuffles each epoch itself; fit's own `shuffle` would only warn.
    assert "shuffle" not in (reference / "stderr.txt").read_text()


@pytest.mark.slow
def test_killed_run_resumes_exactly(reference, tmp_path, multi30k_tfds_dir):
    run = tmp_path / "run"
    killed = _run(run, tmp_path / "never.npz", multi30k_tfds_dir, "--kill-after-epoch", "1",
                  "--kill-at-batch", "5")  # mid-epoch 2
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-4000:]
    before = read_run_history(run / "history.json")
    assert before["epochs"] == 1

    resumed = _run(run, tmp_path / "resumed.npz", multi30k_tfds_dir)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    expected = np.load(reference / "result.npz")
    actual = np.load(tmp_path / "resumed.npz")
    assert expected["epochs_run"].tolist() == [0, 1, 2]
    assert actual["epochs_run"].tolist() == [1, 2]  # resumed, not restarted
    _assert_same_state(actual, expected)

    # The history and the training time cover the whole run, not the resumed part.
    history = read_run_history(run / "history.json")
    reference_history = read_run_history(reference / "run" / "history.json")
    assert history["epochs"] == 3
    assert history["epoch_seconds"][0] == before["epoch_seconds"][0]
    assert history["train_seconds"] == pytest.approx(sum(history["epoch_seconds"]))
    for key, values in reference_history["history"].items():
        np.testing.assert_allclose(history["history"][key], values, rtol=1e-5, err_msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["backup:2", "final"])
def test_a_kill_while_a_file_is_half_written_loses_nothing(reference, tmp_path,
                                                            multi30k_tfds_dir, moment):
    # The backup was rewritten in place (a half-written one could not be read: only
    # --overwrite got out), and deleted before the final model.keras was written (in place:
    # a kill then left a broken model.keras, or nothing to resume from).
    run = tmp_path / "run"
    killed = _run(run, tmp_path / "never.npz", multi30k_tfds_dir, "--die-writing", moment)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-4000:]
    resumed = _run(run, tmp_path / "resumed.npz", multi30k_tfds_dir)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    actual = np.load(tmp_path / "resumed.npz")
    assert actual["epochs_run"].tolist() == ([1, 2] if moment == "backup:2" else [])
    _assert_same_state(actual, np.load(reference / "result.npz"))
    assert not (run / "backup").exists()
    # The killed process's half-written file (a hidden `.partial-PID-` name beside its
    # target) was left for ever; the resumed run removes it.
    assert not list(run.rglob(".partial-*"))
    again = _run(run, tmp_path / "again.npz", multi30k_tfds_dir)  # model.keras is whole
    assert again.returncode == 0 and "nothing to train" in again.stdout, again.stderr[-4000:]


@pytest.mark.slow
def test_a_run_resumed_to_fewer_epochs_than_its_history_records_keeps_none_of_the_rest(
        reference, tmp_path, multi30k_tfds_dir):
    # Killed after epoch 2's history and checkpoints, before its backup: resumed with
    # --epochs 1, history.json kept 2 epochs (then "a finished run of 2 epochs" held epoch
    # 1's weights) and `average` took epoch 2's checkpoint.
    run = tmp_path / "run"
    killed = _run(run, tmp_path / "never.npz", multi30k_tfds_dir, "--die-writing", "backup:2",
                  "--keep-checkpoints", "3")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-4000:]
    assert read_run_history(run / "history.json")["epochs"] == 2
    finished = _run(run, tmp_path / "one.npz", multi30k_tfds_dir, "--epochs", "1",
                    "--keep-checkpoints", "3")
    assert finished.returncode == 0, finished.stderr[-4000:]
    assert read_run_history(run / "history.json")["epochs"] == 1
    assert sorted(p.name for p in (run / "checkpoints").glob("epoch-*")) == [
        "epoch-001.weights.npz"]


@pytest.mark.slow
def test_finished_run_continues_to_more_epochs(reference, tmp_path, multi30k_tfds_dir):
    run = tmp_path / "run"
    first = _run(run, tmp_path / "two.npz", multi30k_tfds_dir, "--epochs", "2")
    assert first.returncode == 0, first.stderr[-4000:]
    again = _run(run, tmp_path / "again.npz", multi30k_tfds_dir, "--epochs", "2")
    assert again.returncode == 0, again.stderr[-4000:]
    assert "nothing to train" in again.stdout
    assert np.load(tmp_path / "again.npz")["epochs_run"].tolist() == []

    continued = _run(run, tmp_path / "three.npz", multi30k_tfds_dir, "--epochs", "3")
    assert continued.returncode == 0, continued.stderr[-4000:]
    actual = np.load(tmp_path / "three.npz")
    assert actual["epochs_run"].tolist() == [2]
    _assert_same_state(actual, np.load(reference / "result.npz"))
    assert read_run_history(run / "history.json")["epochs"] == 3
    assert json.loads((run / "config.json").read_text())["epochs"] == 3


@pytest.mark.slow
def test_a_continued_run_killed_before_its_first_backup_trains_that_epoch(
        reference, tmp_path, multi30k_tfds_dir):
    # The continuation's history records epoch 3 before its first backup is written; killed
    # between the two, the same command said "a finished run of 3 epochs" and kept the
    # 2-epoch model (or, continued further, skipped an epoch): the model's own record says
    # how far it trained.
    run = tmp_path / "run"
    first = _run(run, tmp_path / "two.npz", multi30k_tfds_dir, "--epochs", "2")
    assert first.returncode == 0, first.stderr[-4000:]
    killed = _run(run, tmp_path / "never.npz", multi30k_tfds_dir, "--epochs", "3",
                  "--die-writing", "backup:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-4000:]
    assert read_run_history(run / "history.json")["epochs"] == 3

    resumed = _run(run, tmp_path / "three.npz", multi30k_tfds_dir, "--epochs", "3")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    actual = np.load(tmp_path / "three.npz")
    assert actual["epochs_run"].tolist() == [2]
    _assert_same_state(actual, np.load(reference / "result.npz"))
    assert read_run_history(run / "history.json")["epochs"] == 3
    assert json.loads((run / "model.keras.json").read_text())["epoch"] == 3


@pytest.mark.slow
def test_time_budget_stops_a_run_that_then_counts_as_finished(reference, tmp_path,
                                                              multi30k_tfds_dir):
    run = tmp_path / "run"
    # Any epoch overruns a budget of a microsecond: the first epoch is the last.
    stopped = _run(run, tmp_path / "one.npz", multi30k_tfds_dir, "--time-budget", "1e-8")
    assert stopped.returncode == 0, stopped.stderr[-4000:]
    assert "Time budget:" in stopped.stdout and "training stops here" in stopped.stdout
    assert np.load(tmp_path / "one.npz")["epochs_run"].tolist() == [0]
    assert (run / "model.keras").is_file() and not (run / "backup").exists()
    assert read_run_history(run / "history.json")["epochs"] == 1

    again = _run(run, tmp_path / "again.npz", multi30k_tfds_dir, "--time-budget", "1e-8")
    assert again.returncode == 0, again.stderr[-4000:]
    assert "time budget" in again.stdout and "nothing to train" in again.stdout
    assert np.load(tmp_path / "again.npz")["epochs_run"].tolist() == []

    # A larger budget continues it, exactly as if it had never stopped.
    continued = _run(run, tmp_path / "three.npz", multi30k_tfds_dir, "--time-budget", "1000")
    assert continued.returncode == 0, continued.stderr[-4000:]
    actual = np.load(tmp_path / "three.npz")
    assert actual["epochs_run"].tolist() == [1, 2]
    _assert_same_state(actual, np.load(reference / "result.npz"))
    assert read_run_history(run / "history.json")["epochs"] == 3


def test_time_budget_predicts_the_next_epoch_by_the_longest():
    assert not time_budget_reached([], 1.0)
    assert not time_budget_reached([600.0] * 5, None)
    assert not time_budget_reached([20.0, 30.0], 1.35)  # 50 s + 30 s = 80 s <= 81 s
    assert time_budget_reached([20.0, 30.0], 1.3)  # 80 s > 78 s
    assert time_budget_reached([10.0, 30.0, 20.0], 1.3)  # the longest, not the last
    assert time_budget_reached([30.0], 0.9)  # one epoch timed: it predicts the next


def test_time_budget_leaves_out_the_first_epoch_once_another_is_timed():
    # The first epoch of an attempt also traces the training step: once a second epoch
    # is timed, the prediction is the longest epoch after the first.
    assert not time_budget_reached([30.0, 20.0], 1.2)  # 50 s + 20 s = 70 s <= 72 s
    assert time_budget_reached([30.0, 20.0], 1.1)  # 70 s > 66 s


def test_time_budget_is_validated():
    with pytest.raises(ValueError, match="time_budget_minutes"):
        get_preset("tiny").replace(time_budget_minutes=0)
    # `--set time_budget_minutes=Infinity` (JSON's) was accepted, then failed after the first
    # epoch: "cannot convert float NaN to integer"; `lr_scale=Infinity` failed in the
    # schedule after the vocabulary and the data were made, naming `scale`.
    for field in ("time_budget_minutes", "lr_scale", "global_clipnorm"):
        for value in (float("inf"), float("nan")):
            with pytest.raises(ValueError, match=field):
                get_preset("tiny").replace(**{field: value})


def test_changed_config_is_refused_listing_the_fields(tmp_path):
    config = get_preset("tiny")
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    (tmp_path / "tokenizer").mkdir()  # a run that got past its start
    (tmp_path / "history.json").write_text(json.dumps({"epoch_seconds": [1.0]}))  # an epoch
    check_resumable(config.replace(epochs=7, keep_checkpoints=2), tmp_path)  # allowed
    with pytest.raises(ConfigMismatchError) as raised:
        check_resumable(config.replace(d_model=32, dropout=0.2, epochs=7), tmp_path)
    message = str(raised.value)
    assert "d_model: 16 in the run, 32 now" in message
    assert "dropout: 0.0 in the run, 0.2 now" in message
    assert "epochs:" not in message


def test_a_run_with_no_epoch_trained_takes_new_settings_its_vocabulary_allows(tmp_path):
    # The multi30k preset on a corpus of more pairs than subword sampling keeps was refused
    # after its vocabulary and data report, advising subword_nbest=1; that retry was then
    # refused as "trained with a different configuration" though no epoch was trained: only
    # --overwrite, training the vocabulary again, got out. Settings the vocabulary does not
    # depend on may change until an epoch is trained (the data report is counted again when
    # its own settings change); the vocabulary's are still refused, it is on disk.
    config = get_preset("tiny").replace(subword_nbest=16)
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    (tmp_path / "tokenizer").mkdir()
    check_resumable(config.replace(subword_nbest=1, d_model=32, max_length=40), tmp_path)
    with pytest.raises(ConfigMismatchError, match="vocab_size"):
        check_resumable(config.replace(vocab_size=500, subword_nbest=1), tmp_path)
    (tmp_path / "history.json").write_text(json.dumps({"epoch_seconds": [1.0]}))
    with pytest.raises(ConfigMismatchError, match="subword_nbest"):
        check_resumable(config.replace(subword_nbest=1), tmp_path)


def test_a_config_naming_no_languages_resumes_a_run_that_recorded_them(tmp_path):
    # A run records the languages its data source chose (Multi30K's en->de); the preset
    # names none: `train --preset quick` again on a killed run was refused.
    config = get_preset("tiny")
    (tmp_path / "config.json").write_text(json.dumps(
        config.replace(source_lang="en", target_lang="de").to_dict()))
    (tmp_path / "tokenizer").mkdir()
    check_resumable(config, tmp_path)
    with pytest.raises(ConfigMismatchError, match="source_lang: 'en' in the run, 'fr' now"):
        check_resumable(config.replace(source_lang="fr", target_lang="de"), tmp_path)


@pytest.mark.slow  # a fresh Python process (TensorFlow imported)
def test_epoch_seeds_differ_per_epoch_and_do_not_depend_on_the_process():
    seeds = [epoch_seed(1234, epoch) for epoch in range(4)]
    assert len(set(seeds)) == 4
    # Another process, with another str hash seed, draws the same seeds (a resumed run
    # shuffles each epoch as the uninterrupted one did).
    script = ("from keras_transformer.training.trainer import epoch_seed; "
              "print([epoch_seed(1234, e) for e in range(4)])")
    env = dict(os.environ, PYTHONHASHSEED="4321")
    out = subprocess.run([sys.executable, "-c", script], env=env, check=True,
                         capture_output=True, text=True, timeout=300).stdout
    assert json.loads(out.strip().splitlines()[-1]) == seeds


def test_run_directory_detection(tmp_path):
    assert not is_run_directory(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    assert not is_run_directory(tmp_path)  # a config alone is not a run
    (tmp_path / "config.json").write_text('{"name": "my project"}')
    assert not is_run_directory(tmp_path)  # another program's config.json
    # A hand-written TrainingConfig (some fields) is not what `train` writes (all of them).
    (tmp_path / "config.json").write_text('{"preset": "quick", "epochs": 3}')
    assert not is_run_directory(tmp_path)
    # `train`'s own config, but beside the user's files: not only a failed run's leftover.
    get_preset("tiny").to_file(tmp_path / "config.json")
    (tmp_path / "corpus.txt").write_text("precious")
    assert not is_run_directory(tmp_path)
    (tmp_path / "corpus.txt").unlink()
    assert is_run_directory(tmp_path)
    (tmp_path / "history.json").write_text("{}")
    assert is_run_directory(tmp_path)


def test_a_run_that_failed_before_its_vocabulary_starts_over_with_other_settings(tmp_path):
    # `train` writes config.json first; a run that failed while training its vocabulary
    # (a vocabulary too large for the corpus, Ctrl-C) holds nothing else. Nothing was
    # trained, so asking again with other settings (the smaller vocab_size the error
    # advised) starts over; it was refused as "trained with a different configuration".
    get_preset("tiny").replace(vocab_size=8000).to_file(tmp_path / "config.json")
    assert is_run_directory(tmp_path)
    check_resumable(get_preset("tiny"), tmp_path)
    (tmp_path / "tokenizer").mkdir()  # a vocabulary: the settings are compared
    with pytest.raises(ConfigMismatchError, match="vocab_size"):
        check_resumable(get_preset("tiny"), tmp_path)
    from keras_transformer.cli import _overwrite

    _overwrite(tmp_path, worker_index=None)  # --overwrite still starts over
    assert list(tmp_path.iterdir()) == []


def test_a_failed_multi_worker_start_is_still_a_run(tmp_path):
    # Worker 1's private directory stays beside the chief's config.json after a failed start
    # of `launch --local-workers 2`: the same command again was refused as "not a run".
    from keras_transformer.training.trainer import _check_new_run_directory

    get_preset("tiny").replace(vocab_size=8000).to_file(tmp_path / "config.json")
    (tmp_path / "workertemp_1").mkdir()
    assert is_run_directory(tmp_path)
    _check_new_run_directory(tmp_path)
    check_resumable(get_preset("tiny"), tmp_path)  # nothing trained: other settings start over


def test_a_new_run_is_not_started_among_other_files(tmp_path):
    (tmp_path / "important.txt").write_text("keep me")
    with pytest.raises(ValueError, match="important.txt.*not a run"):
        train(get_preset("tiny"), tmp_path, strategy="default")
    assert [p.name for p in tmp_path.iterdir()] == ["important.txt"]


@pytest.mark.slow
def test_a_continued_run_says_its_callers_callbacks_start_afresh(
        tmp_path, multi30k_tfds_dir, capsys):
    # An `EarlyStopping(patience=...)` of the caller's counted its patience from zero again
    # in a resumed or continued run (its state is in memory only), so the run trained
    # epochs the uninterrupted one would not have: nothing said so.
    import keras

    config = get_preset("tiny").replace(epochs=1, steps_per_epoch=None, train_subset=48,
                                        bleu_sentences=0)
    train(config, tmp_path / "run", data_dir=multi30k_tfds_dir, strategy="default",
          report_padding=False, verbose=0,
          callbacks=[keras.callbacks.EarlyStopping(monitor="loss", patience=3)])
    assert "start afresh" not in capsys.readouterr().out  # a new run: nothing to restore
    train(config.replace(epochs=2), tmp_path / "run", data_dir=multi30k_tfds_dir,
          strategy="default", report_padding=False, verbose=0,
          callbacks=[keras.callbacks.EarlyStopping(monitor="loss", patience=3)])
    out = capsys.readouterr().out
    assert "EarlyStopping" in out and "start afresh" in out and "after epoch 1" in out
    train(config.replace(epochs=3), tmp_path / "run", data_dir=multi30k_tfds_dir,
          strategy="default", report_padding=False, verbose=0)
    assert "start afresh" not in capsys.readouterr().out  # no callbacks of the caller's


@pytest.mark.slow
def test_budgeted_cooldown_plans_the_schedule_and_a_cooled_run_is_finished(
        tmp_path, multi30k_tfds_dir, capsys):
    config = get_preset("tiny").replace(
        epochs=3, steps_per_epoch=None, train_subset=160, bleu_sentences=0,
        time_budget_minutes=1000.0, lr_cooldown=0.5,
    )
    run = train(config, tmp_path / "run", data_dir=multi30k_tfds_dir, strategy="default",
                report_padding=False, verbose=0)
    # 1000 minutes hold every epoch `epochs` allows: the rate reaches zero at its end.
    optimizer = run.model.optimizer
    total = int(optimizer.iterations)
    assert total == 3 * 20  # 160 pairs, batches of 8
    schedule = optimizer._learning_rate
    assert (schedule.total_steps, schedule.cooldown_steps) == (total, total // 2)
    assert float(schedule(total - 1)) > 0.0 == float(schedule(total))

    # Had its epochs taken 30, 10 and 10 s, a budget of 1.5 minutes would have planned
    # these 3 epochs after the first, and the cooldown had begun by the second. The budget
    # alone would allow a fourth (50 + 30 s <= 90 s), but the rate is already zero.
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    history["epoch_seconds"] = [30.0, 10.0, 10.0]
    (tmp_path / "run" / "history.json").write_text(json.dumps(history))
    config_file = (tmp_path / "run" / "config.json").read_text()
    capsys.readouterr()
    train(config.replace(epochs=5, time_budget_minutes=1.5), tmp_path / "run",
          data_dir=multi30k_tfds_dir, strategy="default", report_padding=False, verbose=0)
    out = capsys.readouterr().out
    assert "cooled down to zero" in out and "nothing to train" in out
    assert read_run_history(tmp_path / "run" / "history.json")["epochs"] == 3
    assert (tmp_path / "run" / "config.json").read_text() == config_file  # nothing written


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["budget", "cooldown"])
def test_a_run_its_budget_ended_whose_final_save_failed_trains_no_more(
        tmp_path, multi30k_tfds_dir, monkeypatch, capsys, stop):
    # The final model.keras save cut short (a full disk, a kill): resumed from its backup, the
    # run trained one more epoch past its budget (after a cooldown, at a rate of 0) and
    # history.json recorded it, so `average --last N` took other epochs than an
    # uninterrupted run's.
    import errno

    from keras_transformer.training.callbacks import FinalModelSaver

    config = get_preset("tiny").replace(
        epochs=3, steps_per_epoch=None, train_subset=160, bleu_sentences=0,
        time_budget_minutes=1e-8 if stop == "budget" else 1000.0,
        lr_cooldown=0.5 if stop == "cooldown" else 0.0,
    )
    run_dir = tmp_path / "run"

    def full_disk(self, logs=None):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(FinalModelSaver, "on_train_end", full_disk)
        with pytest.raises(OSError, match="No space"):
            train(config, run_dir, data_dir=multi30k_tfds_dir, strategy="default",
                  report_padding=False, verbose=0)
    assert (run_dir / "backup").is_dir() and not (run_dir / "model.keras").exists()
    if stop == "cooldown":
        # As in the test above: epochs of 30, 10 and 10 s planned 3 epochs within 1.5
        # minutes; the budget alone would allow a fourth, but the rate is already zero.
        history = json.loads((run_dir / "history.json").read_text())
        history["epoch_seconds"] = [30.0, 10.0, 10.0]
        (run_dir / "history.json").write_text(json.dumps(history))
        config = config.replace(epochs=5, time_budget_minutes=1.5)
    epochs = read_run_history(run_dir / "history.json")["epochs"]
    assert epochs == (1 if stop == "budget" else 3)
    capsys.readouterr()

    resumed = train(config, run_dir, data_dir=multi30k_tfds_dir, strategy="default",
                    report_padding=False, verbose=0)
    assert "nothing to train" in capsys.readouterr().out
    assert resumed.epochs_trained == 0
    assert read_run_history(run_dir / "history.json")["epochs"] == epochs
    # Finished as an uninterrupted run is: its final model saved, its backup gone.
    assert (run_dir / "model.keras").is_file() and not (run_dir / "backup").exists()


def test_a_vocabulary_cut_short_is_trained_again_unless_an_epoch_used_it(tmp_path, capsys):
    # tokenizer.model was written in place: a kill or a full disk during the write left a
    # truncated file, and every later run failed to read it (a SentencePiece RuntimeError, or
    # a misleading "gives the reserved ids other roles").
    from tests.text.conftest import read_lines

    pairs = [{"en": en, "de": de} for en, de in zip(read_lines("train", "en")[:200],
                                                      read_lines("train", "de")[:200])]
    config = get_preset("tiny").replace(source_lang="en", target_lang="de")
    prepare_tokenizers(config, pairs, tmp_path)
    model = tmp_path / "tokenizer" / "tokenizer.model"
    whole = model.read_bytes()

    model.write_bytes(whole[: len(whole) // 2])
    source, _ = prepare_tokenizers(config, pairs, tmp_path)  # nothing trained with it yet
    assert "trained again" in capsys.readouterr().out
    assert model.read_bytes() == whole and source.vocab_size == config.vocab_size

    # Once an epoch was trained, the model's ids are that vocabulary's pieces: refused.
    model.write_bytes(whole[: len(whole) // 2])
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.keras").write_bytes(b"epoch 1")
    with pytest.raises(ValueError, match=r"(?s)tokenizer\.model cannot be read.*--overwrite"):
        prepare_tokenizers(config, pairs, tmp_path)
    assert model.read_bytes() == whole[: len(whole) // 2]


def test_late_dropout_raises_the_rates_after_its_epochs(tmp_path, multi30k_tfds_dir, capsys):
    import keras

    config = get_preset("tiny").replace(
        epochs=2, steps_per_epoch=None, train_subset=160, bleu_sentences=0, dropout=0.1,
        late_dropout=0.3, late_dropout_after=1,
    )
    run = train(config, tmp_path / "run", data_dir=multi30k_tfds_dir, strategy="default",
                report_padding=False, verbose=0)
    rates = {layer.rate for layer in run.model._flatten_layers(include_self=False)
             if isinstance(layer, keras.layers.Dropout)}
    assert rates == {0.0, 0.3}  # the feed-forward layers' inner dropouts stay off
    assert "rate is 0.3 from epoch 2 on" in capsys.readouterr().out

    # A run planned for fewer epochs than late_dropout_min_epochs keeps its dropout.
    short = train(config.replace(late_dropout_min_epochs=3), tmp_path / "short",
                  data_dir=multi30k_tfds_dir, strategy="default", report_padding=False,
                  verbose=0)
    rates = {layer.rate for layer in short.model._flatten_layers(include_self=False)
             if isinstance(layer, keras.layers.Dropout)}
    assert rates == {0.0, 0.1}
    assert "not applied, the run is planned to last 2 epoch(s), fewer than 3" in (
        capsys.readouterr().out)


def test_a_budget_too_small_to_continue_says_how_large_it_must_be():
    # "set a larger time_budget_minutes to continue it", said to a run given a larger
    # budget that still does not hold its next epoch (predicted from the longest).
    from keras_transformer.training.trainer import _nothing_to_train

    config = get_preset("tiny").replace(epochs=5, time_budget_minutes=0.15)
    record = {"epoch_seconds": [7.4], "history": {}}
    message = _nothing_to_train(config, 1, record)
    assert "0.12 min" in message and "time_budget_minutes to 0.25 to continue" in message
    assert _nothing_to_train(config.replace(time_budget_minutes=0.25), 1, record) is None


@pytest.mark.parametrize("seconds, minutes", [
    # The budget stops the run (its next epoch would overrun it).
    ([426.0, 315.0, 337.0, 379.0, 378.0, 402.0, 347.0, 390.0], 55.0),
    # Time is left, but the cooldown, planned after epoch 5, ended the rate after 8.
    ([400.0] * 6 + [100.0] * 2, 55.0),
    # A larger budget is not always enough: 64.65 continues this run, but 66.5 keeps its
    # plan open until the slow seventh epoch shortens it to 8 epochs again (the advice
    # was "at least 64.66" for both).
    ([410.0, 384.0, 366.0, 409.0, 412.0, 361.0, 567.0, 403.0], 55.0),
    ([410.0, 384.0, 366.0, 409.0, 412.0, 361.0, 567.0, 403.0], 66.5),
])
def test_the_budget_said_to_continue_a_cooled_down_run_continues_it(seconds, minutes):
    # With a cooldown the budget must also plan more epochs than were trained: the advice
    # was computed from the next epoch's time alone (56.27 for the first run), and a rerun
    # with it was refused again, as a run whose learning rate had cooled down.
    import re

    from keras_transformer.training.trainer import _nothing_to_train

    config = get_preset("multi30k").replace(time_budget_minutes=minutes)
    record = {"epoch_seconds": seconds, "history": {}}
    message = _nothing_to_train(config, 8, record)
    advised = float(re.search(r"time_budget_minutes to ([0-9.]+) to continue", message)[1])
    assert _nothing_to_train(config.replace(time_budget_minutes=advised), 8, record) is None
    # The least such budget above the one given, to the hundredth.
    assert advised > minutes
    if advised - 0.01 > minutes:
        assert _nothing_to_train(config.replace(time_budget_minutes=advised - 0.01), 8,
                                 record)


def test_planned_epochs_follow_the_budget_and_its_cooldown_plan():
    config = get_preset("tiny").replace(epochs=40)
    assert planned_epochs(config, [10.0] * 12) == 40  # no budget: `epochs`
    budget = config.replace(time_budget_minutes=10.0)
    # 12 epochs of 30 s took 6 of the 10 minutes: 8 more fit.
    assert planned_epochs(budget, [30.0] * 12) == 20
    # Two faster epochs leave time for 9 more 30-s epochs (the longest predicts): 21 in
    # all, but a cooldown plan stays once its cooldown has begun: 20, planned after epoch
    # 10 (half of them done, so the cooldown's half had begun).
    assert planned_epochs(budget, [30.0] * 10 + [5.0] * 2) == 21
    cooled = budget.replace(lr_cooldown=0.5)
    assert planned_epochs(cooled, [30.0] * 10 + [5.0] * 2) == 20


def test_the_vocabulary_keeps_what_its_normalization_setting_keeps(tmp_path):
    # With SentencePiece's default rule (nmt_nfkc) the zero-width non-joiner of Persian
    # became a space and full-width CJK punctuation half-width: the model could never write
    # the references (the audit: BLEU 8.3 where the normalized references gave 91.8).
    from keras_transformer.training.trainer import VOCABULARY_FIELDS
    from tests.text.conftest import read_lines

    persian, chinese = "می\u200cخواهم بنویسم", "你好，世界！"
    pairs = [{"en": en, "fa": f"{persian} {chinese} {de}"}
             for en, de in zip(read_lines("train", "en")[:200], read_lines("train", "de")[:200])]
    config = get_preset("tiny").replace(source_lang="en", target_lang="fa", vocab_size=400)
    kept = {}
    for rule in ("nmt_nfkc", "nfkc", "identity"):
        _, target = prepare_tokenizers(config.replace(normalization=rule), pairs,
                                       tmp_path / rule)
        ids = target.tokenize([f"{persian} {chinese}"])
        kept[rule] = target.detokenize(ids).numpy()[0].decode()
    assert kept["nmt_nfkc"] == "می خواهم بنویسم 你好,世界!"
    assert kept["nfkc"] == "می\u200cخواهم بنویسم 你好,世界!"
    assert kept["identity"] == f"{persian} {chinese}"
    assert {"normalization", "character_coverage"} <= set(VOCABULARY_FIELDS)


def test_rare_characters_can_be_left_to_the_byte_fallback(tmp_path):
    # A corpus of more distinct characters than vocab_size leaves room for (Chinese: ~10,000)
    # was refused with only "train with a larger one"; character_coverage < 1 spells the
    # rarest in bytes.
    import random

    rng = random.Random(0)
    common = [chr(0x4E00 + i) for i in range(100)]
    rare = [chr(0x5000 + i) for i in range(300)]  # once each: ~6% of the text
    text = rng.choices(common, k=5000) + rare
    rng.shuffle(text)
    pairs = [{"en": f"sentence {i}", "zh": "".join(text[i * 12:(i + 1) * 12])}
             for i in range(len(text) // 12)]
    config = get_preset("tiny").replace(source_lang="en", target_lang="zh", vocab_size=500)
    with pytest.raises(ValueError, match=r"character_coverage=0\.9995"):
        prepare_tokenizers(config, pairs, tmp_path / "full")
    # Already below 1: the advice is a lower coverage, not the same one.
    with pytest.raises(ValueError, match=r"character_coverage=0\.9995.*lower, down to 0\.98"):
        prepare_tokenizers(config.replace(character_coverage=0.9995), pairs,
                           tmp_path / "partly")
    _, target = prepare_tokenizers(config.replace(character_coverage=0.98), pairs,
                                   tmp_path / "covered")
    assert target.detokenize(target.tokenize([rare[0]])).numpy()[0].decode() == rare[0]


def test_the_epoch_a_time_budget_ends_the_run_after_is_scored(tmp_path, multi30k_tfds_dir):
    # BLEU every 2 epochs, a budget that ends the run after epoch 1: that epoch, the run's
    # last, was never scored and the run had no best.keras (the export's default) at all.
    config = get_preset("tiny").replace(
        epochs=3, steps_per_epoch=2, bleu_sentences=4, bleu_every_n_epochs=2,
        time_budget_minutes=1e-8)
    train(config, tmp_path / "run", data_dir=multi30k_tfds_dir, strategy="default",
          report_padding=False, verbose=0)
    history = read_run_history(tmp_path / "run" / "history.json")
    assert history["epochs"] == 1 and history["history"]["val_bleu"][0] is not None
    # A score made as `fit` ends (a stop the callback did not foresee) reaches history.json.
    from keras_transformer.training.callbacks import RunHistory

    record = RunHistory(tmp_path / "history.json", initial={
        "history": {"loss": [3.0, 2.0]}, "epoch_seconds": [1.0, 1.0]})
    record.record_late("val_bleu", 1, 12.5)
    assert read_run_history(tmp_path / "history.json")["history"] == {
        "loss": [3.0, 2.0], "val_bleu": [None, 12.5]}
    assert json.loads((tmp_path / "run" / "checkpoints" / "best.keras.json").read_text())[
        "epoch"] == 1


def test_the_epoch_a_cooldown_plan_ends_the_run_after_is_foreseen():
    # Within a budget a cooldown plan ends the run after the epochs it planned while the
    # budget itself would hold one more (later epochs ran faster than the plan's): BLEU's
    # question was the budget's alone, so the preset's 23rd and last epoch went unscored.
    from keras_transformer.training.trainer import budget_ends_after

    class Timed:
        def __init__(self, seconds, elapsed):
            self.epoch_seconds, self._elapsed = seconds, elapsed

        def epoch_elapsed(self):
            return self._elapsed

    config = get_preset("tiny").replace(epochs=40, time_budget_minutes=55.0, lr_cooldown=0.3)
    seconds = [160.0, 160.0] + [125.0] * 21  # 23 epochs: the plan's
    assert not time_budget_reached(seconds, 55.0) and planned_epochs(config, seconds) == 23
    assert budget_ends_after(config, Timed(seconds[:-1], 125.0), epoch=22)
    assert not budget_ends_after(config, Timed(seconds[:-2], 125.0), epoch=21)
    assert not budget_ends_after(config, Timed(seconds[:-1], None), epoch=22)  # not timing
    # Without a cooldown, the budget's own rule.
    plain = config.replace(lr_cooldown=0.0, time_budget_minutes=35.0)
    assert budget_ends_after(plain, Timed([600.0, 660.0], 630.0), epoch=2)  # 31.5 + 11 > 35
    assert not budget_ends_after(plain, Timed([600.0], 660.0), epoch=1)


def test_a_vocabulary_without_its_record_of_training_files_is_trained_again(tmp_path, capsys,
                                                                            monkeypatch):
    # A kill between the vocabulary and `trained_on.json` (or a run directory started by
    # an earlier version) left no record, and the check of changed files was off for good.
    from keras_transformer.data.preparation import data_file_stats

    lines = [f"sentence number {i} with some words" for i in range(300)]
    path = tmp_path / "train.en"
    path.write_text("\n".join(lines) + "\n")
    spec = {"data_files": {"train": [str(path), str(path)]}}
    pairs = [{"en": line, "de": line} for line in lines]
    config = get_preset("tiny").replace(source_lang="en", target_lang="de", vocab_size=290)
    run = tmp_path / "run"
    prepare_tokenizers(config, pairs, run, data_files=data_file_stats(spec, ("train",)))
    record = run / "tokenizer" / "trained_on.json"
    assert json.loads(record.read_text())[str(path)]["stat"][0] == path.stat().st_size
    capsys.readouterr()

    record.unlink()
    prepare_tokenizers(config, pairs, run, data_files=data_file_stats(spec, ("train",)))
    assert "trained on is not recorded" in capsys.readouterr().out and record.is_file()

    # Only touched: kept, and the record takes the new time (not hashed again next time).
    os.utime(path, ns=(10**18, 10**18))
    prepare_tokenizers(config, pairs, run, data_files=data_file_stats(spec, ("train",)))
    assert "trained again" not in capsys.readouterr().out
    assert json.loads(record.read_text())[str(path)]["stat"][1] == 10**18

    record.write_text("[1, 2]")  # not a record
    prepare_tokenizers(config, pairs, run, data_files=data_file_stats(spec, ("train",)))
    assert "cannot be read" in capsys.readouterr().out
    assert isinstance(json.loads(record.read_text()), dict)

    # Killed while training again: the old record does not stay beside what is written.
    from keras_transformer.training import trainer

    path.write_text("\n".join(lines[::-1]) + "\n")
    monkeypatch.setattr(trainer, "train_tokenizers", _killed)
    with pytest.raises(KeyboardInterrupt):
        prepare_tokenizers(config, pairs, run, data_files=data_file_stats(spec, ("train",)))
    assert not record.exists()


def _killed(*args, **kwargs):
    raise KeyboardInterrupt


def test_resuming_with_another_length_says_what_changes_at_the_resumed_update():
    # `epochs` and `time_budget_minutes` may change when a run resumes, but a cooldown is
    # planned over the run's length and late dropout is decided on it: the rate jumped
    # (0.667 -> 0.196 of the schedule) with nothing said.
    from keras_transformer.training.trainer import resume_plan_warning

    def record(seconds):
        return {"epoch_seconds": seconds, "history": {}}

    fixed = get_preset("tiny").replace(epochs=20, lr_cooldown=0.3)
    message = resume_plan_warning(fixed, fixed.replace(epochs=17), record([60.0] * 16))
    assert "epochs 20 -> 17" in message and "0.196" in message and "0.667" in message

    budget = get_preset("tiny").replace(epochs=40, lr_cooldown=0.3, time_budget_minutes=90)
    message = resume_plan_warning(budget, budget.replace(time_budget_minutes=60),
                                  record([600.0] * 5))
    assert "time_budget_minutes 90 -> 60" in message and "0.556" in message
    assert "1.000" in message

    # A larger budget before the cooldown has begun: the plan follows it as it would have.
    assert resume_plan_warning(budget.replace(time_budget_minutes=55),
                               budget.replace(time_budget_minutes=70),
                               record([600.0] * 3)) is None
    # No cooldown: the rate does not depend on the run's length.
    assert resume_plan_warning(fixed.replace(lr_cooldown=0.0),
                               fixed.replace(lr_cooldown=0.0, epochs=17),
                               record([60.0] * 16)) is None
    # Nothing to train with the new value, or the run had ended as planned (its final
    # save cut short): no plan changes mid-run (0.000 against 1.000, 0.909 against 0.000).
    assert resume_plan_warning(budget, budget.replace(time_budget_minutes=45),
                               record([600.0] * 5)) is None
    assert resume_plan_warning(fixed, fixed.replace(epochs=10), record([60.0] * 12)) is None
    preset = get_preset("multi30k")
    ended = record([426.0, 315.0, 337.0, 379.0, 378.0, 402.0, 347.0, 390.0])
    assert resume_plan_warning(preset, preset.replace(time_budget_minutes=70), ended) is None

    message = resume_plan_warning(preset, preset.replace(time_budget_minutes=45),
                                  record([95.0] * 13))
    assert "late dropout" in message.lower() and "0.3" in message
    assert "learning rate" not in message  # the cooldown had not begun under either plan

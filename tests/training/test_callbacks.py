"""BleuCallback and make_callbacks, with a fake translation function and the stand-in model."""

import importlib.util
import json
import math
import os
import re

import keras
import numpy as np
import pytest

from keras_transformer.training.callbacks import (
    BleuCallback,
    EpochCheckpoints,
    RunHistory,
    epoch_checkpoints,
    make_callbacks,
    read_run_history,
)
from keras_transformer.training.losses import MaskedSparseCategoricalCrossentropy
from tests.module_loading import pretend_installed
from tests.training.stand_in import build_stand_in_model

SOURCES = ["ein hund läuft .", "zwei männer sitzen .", "eine frau singt ."]
REFERENCES = ["a dog runs .", "two men are sitting .", "a woman sings ."]


class ScriptedTranslator:
    """Fake `translate_fn`: epoch k returns the k-th scripted list of translations."""

    def __init__(self, outputs_per_call):
        self.outputs_per_call = list(outputs_per_call)
        self.calls = []

    def __call__(self, sources):
        self.calls.append(list(sources))
        return self.outputs_per_call[len(self.calls) - 1]


def _tiny_fit(callbacks, epochs):
    keras.utils.set_random_seed(0)
    model = build_stand_in_model()
    model.compile(optimizer="sgd", loss=MaskedSparseCategoricalCrossentropy())
    rng = np.random.default_rng(0)
    x = {
        "encoder_tokens": rng.integers(1, 11, (4, 3)).astype("int32"),
        "decoder_tokens": rng.integers(1, 11, (4, 3)).astype("int32"),
    }
    y = rng.integers(0, 11, (4, 3)).astype("int32")
    history = model.fit(x, y, epochs=epochs, batch_size=4, verbose=0, callbacks=callbacks)
    return model, history


def test_logs_val_bleu_and_saves_best_only_on_improvement(tmp_path, monkeypatch):
    best_path = str(tmp_path / "best.keras")
    bad = ["a cat .", "one man .", "a man ."]
    good = ["a dog runs .", "two men are sitting .", "a woman sings ."]
    translator = ScriptedTranslator([bad, good, bad])
    callback = BleuCallback(translator, SOURCES, REFERENCES, best_path=best_path)
    saved_epochs = []
    original_save = keras.Model.save

    def recording_save(model, path, *args, **kwargs):
        saved_epochs.append(len(translator.calls))
        return original_save(model, path, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "save", recording_save)
    _, history = _tiny_fit([callback], epochs=3)

    bleu = history.history["val_bleu"]
    assert bleu[1] == pytest.approx(100.0)
    assert bleu[0] < 100.0 and bleu[2] == pytest.approx(bleu[0])
    assert saved_epochs == [1, 2]  # epoch 3 did not improve on epoch 2
    assert callback.best_bleu == pytest.approx(100.0)
    with open(best_path + ".json") as f:
        assert json.load(f) == {"val_bleu": pytest.approx(100.0), "epoch": 2}
    keras.saving.load_model(best_path)  # a loadable .keras file


def test_every_n_epochs_and_batching(tmp_path):
    translator = ScriptedTranslator([["a dog runs ."], ["x ."], ["y ."]] * 2)
    callback = BleuCallback(
        translator, SOURCES, REFERENCES, every_n_epochs=2, batch_size=1,
        best_path=str(tmp_path / "best.weights.h5"),
    )
    _, history = _tiny_fit([callback], epochs=2)
    assert len(history.history["val_bleu"]) == 1  # only logged on epoch 2
    assert translator.calls == [[s] for s in SOURCES]
    assert os.path.exists(tmp_path / "best.weights.h5")


def test_the_last_epoch_is_scored_whatever_every_n_epochs_says(tmp_path):
    # A run of an odd number of epochs at every_n_epochs=2 (the multi30k preset's, when its
    # budget ends at 25) never scored its last epoch, the end of the cooldown: best.keras,
    # the export's default, was an earlier epoch's.
    translator = ScriptedTranslator([["x ."] * 3, SOURCES])
    callback = BleuCallback(translator, SOURCES, SOURCES, every_n_epochs=2,
                            best_path=str(tmp_path / "best.keras"), verbose=0)
    _, history = _tiny_fit([callback], epochs=3)
    bleu = history.history["val_bleu"]
    assert len(translator.calls) == 2 and bleu[-1] == pytest.approx(100.0)
    with open(tmp_path / "best.keras.json") as f:
        assert json.load(f)["epoch"] == 3


def test_an_epoch_the_run_ends_after_is_scored(tmp_path):
    # A time budget stops `fit` before its `epochs`, deciding after this callback: the
    # callback asks `ends_after` whether the epoch now ending is the run's last.
    class StopAfterSecond(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.model.stop_training = epoch == 1

    translator = ScriptedTranslator([SOURCES] * 3)
    asked = []

    def ends_after(epoch):
        asked.append(epoch)
        return epoch == 1

    callback = BleuCallback(translator, SOURCES, SOURCES, every_n_epochs=5,
                            ends_after=ends_after, verbose=0)
    _, history = _tiny_fit([callback, StopAfterSecond()], epochs=6)
    assert asked == [0, 1] and len(translator.calls) == 1
    assert history.history["val_bleu"] == [pytest.approx(100.0)]
    with pytest.raises(ValueError, match="ends_after"):
        BleuCallback(translator, SOURCES, SOURCES, ends_after=2)


def test_a_run_stopped_before_its_epochs_has_its_last_epoch_scored_when_it_ends(tmp_path):
    # Whatever stopped it (a cooldown plan `ends_after` did not foresee, a user's
    # EarlyStopping), the epoch the run ended after is scored as `fit` ends.
    class StopAfterSecond(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.model.stop_training = epoch == 1

    translator = ScriptedTranslator([SOURCES])
    callback = BleuCallback(translator, SOURCES, SOURCES, every_n_epochs=3,
                            best_path=str(tmp_path / "best.keras"), verbose=0,
                            ends_after=lambda epoch: False)
    _tiny_fit([callback, StopAfterSecond()], epochs=6)
    assert len(translator.calls) == 1 and callback.best_bleu == pytest.approx(100.0)
    with open(tmp_path / "best.keras.json") as f:
        assert json.load(f) == {"val_bleu": pytest.approx(100.0), "epoch": 2}
    # The score reaches the run's record through `record_late` (the epoch's logs are gone).
    recorded = []
    translator = ScriptedTranslator([SOURCES])
    callback = BleuCallback(translator, SOURCES, SOURCES, every_n_epochs=3, verbose=0,
                            record_late=lambda epoch, bleu: recorded.append((epoch, bleu)))
    _tiny_fit([callback, StopAfterSecond()], epochs=6)
    assert recorded == [(1, pytest.approx(100.0))]
    # Scored already: not again.
    translator = ScriptedTranslator([SOURCES] * 3)
    callback = BleuCallback(translator, SOURCES, SOURCES, every_n_epochs=2, verbose=0)
    _tiny_fit([callback, StopAfterSecond()], epochs=6)
    assert len(translator.calls) == 1


def test_a_run_stopped_on_a_nan_loss_has_no_last_epoch_scored(tmp_path):
    # TerminateOnNaN (or any stop inside an epoch with a NaN loss): weights not worth a
    # score, and with no best yet they would have become best.keras.
    class NanLoss(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            logs["loss"] = float("nan")
            self.model.stop_training = True

    translator = ScriptedTranslator([SOURCES])
    callback = BleuCallback(translator, SOURCES, SOURCES, every_n_epochs=3, verbose=0,
                            best_path=str(tmp_path / "best.keras"))
    _tiny_fit([NanLoss(), callback], epochs=6)
    assert translator.calls == [] and not os.path.exists(tmp_path / "best.keras")


def test_resumed_run_keeps_earlier_best(tmp_path):
    best_path = str(tmp_path / "best.keras")
    with open(best_path + ".json", "w") as f:
        json.dump({"val_bleu": 50.0, "epoch": 1}, f)
    callback = BleuCallback(ScriptedTranslator([["x ."] * 3]), SOURCES, REFERENCES, best_path=best_path)
    _tiny_fit([callback], epochs=1)
    assert callback.best_bleu == 50.0 and not os.path.exists(best_path)


def _discarded_best(directory, epoch):
    """A best model and its record (BLEU 90) of an `epoch` the resumed run discards."""
    best_path = str(directory / "best.keras")
    with open(best_path, "wb") as f:
        f.write(f"the discarded epoch {epoch}'s model".encode())
    with open(best_path + ".json", "w") as f:
        json.dump({"val_bleu": 90.0, "epoch": epoch}, f)
    return best_path


def test_a_resumed_run_drops_the_best_of_an_epoch_its_backup_did_not_see(tmp_path):
    # Killed after epoch 1's best.keras and its record, before epoch 1's backup: the run
    # trains epoch 1 again, which had to beat the score of the epoch it discarded (and the
    # discarded weights stayed the run's best model).
    best_path = _discarded_best(tmp_path, epoch=1)
    callback = BleuCallback(ScriptedTranslator([["x ."] * 3]), SOURCES, REFERENCES,
                            best_path=best_path, initial_epoch=0, verbose=0)
    _, history = _tiny_fit([callback], epochs=1)
    assert callback.best_bleu == history.history["val_bleu"][0] < 90.0  # the retrained epoch
    with open(best_path + ".json") as f:
        assert json.load(f) == {"val_bleu": history.history["val_bleu"][0], "epoch": 1}
    keras.saving.load_model(best_path)  # the retrained epoch's model


def test_a_resumed_run_drops_the_best_model_of_a_later_epoch_even_untrained(tmp_path):
    # Resumed to no further epoch (fewer --epochs), the discarded epoch's model must not
    # remain the run's best.
    best_path = _discarded_best(tmp_path, epoch=3)
    callback = BleuCallback(ScriptedTranslator([]), SOURCES, REFERENCES, best_path=best_path,
                            initial_epoch=2, verbose=0)
    callback.on_train_begin()
    assert callback.best_bleu is None and os.listdir(tmp_path) == []
    # A record of the epoch resumed after, or an earlier one, is the run's best.
    with open(best_path + ".json", "w") as f:
        json.dump({"val_bleu": 40.0, "epoch": 2}, f)
    callback.on_train_begin()
    assert callback.best_bleu == 40.0


def test_invalid_arguments_raise():
    with pytest.raises(ValueError, match="same length"):
        BleuCallback(lambda s: s, ["a"], [], best_path=None)
    with pytest.raises(ValueError, match="best_path"):
        BleuCallback(lambda s: s, ["a"], ["a"], best_path="best.h5")


TENSORBOARD_INSTALLED = importlib.util.find_spec("tensorboard") is not None


def test_make_callbacks_layout_and_order(tmp_path):
    bleu = BleuCallback(ScriptedTranslator([["a dog runs ."] * 3] * 2), SOURCES, REFERENCES)
    callbacks = make_callbacks(str(tmp_path), bleu_callback=bleu, best_monitor="val_bleu",
                               final_model_path=str(tmp_path / "model.keras"), seed=7)
    kinds = [type(c).__name__ for c in callbacks]
    # The backup restored first (every callback begins from the restored state), saved
    # last (after everything else has handled the epoch).
    expected = ["BackupRestorer", "DropoutSeeds", "BleuCallback", "ModelSaver", "ModelSaver"]
    expected += ["TensorBoard"] * TENSORBOARD_INSTALLED
    expected += ["FinalModelSaver", "AtomicBackupAndRestore"]
    assert kinds == expected
    assert callbacks[0].backup is callbacks[-1]
    assert callbacks[4].monitor == "val_bleu" and callbacks[4].mode == "max"
    assert callbacks[-1].backup_dir == str(tmp_path / "backup")
    _tiny_fit(callbacks, epochs=2)
    assert os.path.exists(tmp_path / "model.keras")
    assert os.path.exists(tmp_path / "checkpoints" / "last.keras")
    assert os.path.exists(tmp_path / "checkpoints" / "best.keras")  # saw val_bleu in logs
    if TENSORBOARD_INSTALLED:
        assert os.listdir(tmp_path / "logs")
    assert not os.path.exists(tmp_path / "backup")  # deleted after a finished run


def test_tensorboard_required_but_missing_raises(tmp_path, monkeypatch, caplog):
    # The package is installed here (setup.py requires it): it is made to look missing.
    pretend_installed(monkeypatch, {"tensorboard": False})
    with pytest.raises(ValueError, match="`tensorboard=True` but the `tensorboard` package"):
        make_callbacks(str(tmp_path), tensorboard=True)
    # Not asked for: a warning, and the run trains without TensorBoard logs.
    with caplog.at_level("WARNING"):
        callbacks = make_callbacks(str(tmp_path))
    assert "no TensorBoard logs" in caplog.text
    assert not any(type(c).__name__ == "TensorBoard" for c in callbacks)


@pytest.mark.skipif(not TENSORBOARD_INSTALLED, reason="the tensorboard package is missing")
def test_tensorboard_logs_under_logs_dir(tmp_path):
    board = next(c for c in make_callbacks(str(tmp_path)) if type(c).__name__ == "TensorBoard")
    assert board.log_dir == str(tmp_path / "logs")


def test_validation_bleu_shows_progress_and_result(capsys):
    sources = SOURCES * 4
    translator = ScriptedTranslator([["a dog runs ."] * 4] * 3)
    callback = BleuCallback(translator, sources, REFERENCES * 4, batch_size=4)
    _tiny_fit([callback], epochs=1)
    out = capsys.readouterr().out
    assert "Validation BLEU: translating 12 sentences" in out
    assert "12/12" in out  # the progress bar reached the end
    assert re.search(r"Epoch 1: val_bleu = \d+\.\d\d \(new best\) on 12 sentences in", out)


def test_run_history_accumulates_over_processes(tmp_path):
    path = tmp_path / "history.json"
    first = RunHistory(str(path))
    _tiny_fit([first], epochs=2)
    written = read_run_history(path)
    assert written["epochs"] == 2 and len(written["history"]["loss"]) == 2
    # A second process resumes after epoch 1 (the backup's), dropping epoch 2's record.
    second = RunHistory(str(path), initial=read_run_history(path, epochs=1))
    _tiny_fit([second], epochs=2)
    resumed = read_run_history(path)
    assert resumed["epochs"] == 3
    assert resumed["history"]["loss"][0] == written["history"]["loss"][0]
    assert resumed["epoch_seconds"][0] == written["epoch_seconds"][0]
    assert resumed["train_seconds"] == pytest.approx(sum(resumed["epoch_seconds"]))


def test_run_history_records_the_time_its_reducer_agrees_on(tmp_path):
    # Several workers each time their epochs; what they record (and plan budgets by) is
    # the slowest worker's time, the same number in every worker's history.
    path = tmp_path / "history.json"
    seen = []

    def slowest(seconds):
        seen.append(seconds)
        return seconds + 100.0  # another worker was 100 s slower

    record = RunHistory(str(path), reduce_seconds=slowest)
    _tiny_fit([record], epochs=2)
    assert len(seen) == 2
    assert read_run_history(path)["epoch_seconds"] == [s + 100.0 for s in seen]
    assert record.train_seconds == pytest.approx(sum(seen) + 200.0)


def test_run_history_pads_metrics_of_some_epochs(tmp_path):
    path = tmp_path / "history.json"
    translator = ScriptedTranslator([["a dog runs ."] * 3] * 2)
    bleu = BleuCallback(translator, SOURCES, REFERENCES, every_n_epochs=2, verbose=0)
    _tiny_fit([bleu, RunHistory(str(path))], epochs=2)
    history = read_run_history(path)["history"]
    assert history["val_bleu"][0] is None and history["val_bleu"][1] is not None



def test_run_history_records_a_stop_only_a_callback_of_the_users_made(tmp_path):
    from keras_transformer.training.callbacks import RecordStop, TimeBudget

    class StopAfterTwo(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.model.stop_training = epoch == 1

    path = tmp_path / "history.json"
    record = RunHistory(str(path))
    _tiny_fit([record, StopAfterTwo(), RecordStop(record)], epochs=5)
    assert read_run_history(path)["stopped"] == {"epochs": 2, "planned": 5}
    # A state resumed before the stop does not keep it.
    assert "stopped" not in read_run_history(path, epochs=1)
    assert read_run_history(path, epochs=2)["stopped"] == {"epochs": 2, "planned": 5}
    # The time budget's stop is the run's settings' to tell again; a run's last epoch is
    # no stop.
    budget = RunHistory(str(tmp_path / "budget.json"))
    _tiny_fit([budget, TimeBudget(1e-9, budget), RecordStop(budget)], epochs=5)
    assert read_run_history(tmp_path / "budget.json")["epochs"] == 1
    assert "stopped" not in read_run_history(tmp_path / "budget.json")
    last = RunHistory(str(tmp_path / "last.json"))
    _tiny_fit([last, StopAfterTwo(), RecordStop(last)], epochs=2)
    assert "stopped" not in read_run_history(tmp_path / "last.json")
    # One record used again by a fit that runs to its end forgets the earlier stop; one
    # that a budget stopped before does not hide a later stop of the user's.
    _tiny_fit([record], epochs=3)
    assert "stopped" not in read_run_history(path)
    _tiny_fit([budget, StopAfterTwo(), RecordStop(budget)], epochs=5)
    assert read_run_history(tmp_path / "budget.json")["stopped"] == {"epochs": 3, "planned": 5}


@pytest.mark.parametrize("verbose", [0, 1, 2])
def test_validation_bleu_prints_as_fit_does(verbose, capsys):
    # `train(verbose=0)` still printed the BLEU progress bar, with `\r` and ANSI codes in a
    # log file under verbose=2: the bar only at 1, the epoch's line at 1 and 2.
    translator = ScriptedTranslator([["a dog runs ."] * 3])
    _tiny_fit([BleuCallback(translator, SOURCES, REFERENCES, verbose=verbose)], epochs=1)
    out = capsys.readouterr().out
    assert ("\r" in out or "\x1b" in out) == (verbose == 1)
    assert ("Epoch 1: val_bleu" in out) == (verbose != 0)


def test_epoch_checkpoints_keep_the_last_n(tmp_path):
    model, _ = _tiny_fit([EpochCheckpoints(str(tmp_path), keep=2)], epochs=3)
    files = epoch_checkpoints(tmp_path)
    assert [os.path.basename(f) for f in files] == [
        "epoch-002.weights.npz", "epoch-003.weights.npz"]
    last = np.load(files[-1])
    for i, weight in enumerate(model.get_weights()):
        np.testing.assert_array_equal(last[f"arr_{i}"], weight)


def test_time_budget_says_nothing_after_the_last_epoch(tmp_path, capsys):
    from keras_transformer.training.callbacks import RunHistory, TimeBudget

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    record = RunHistory(str(tmp_path / "history.json"))
    budget = TimeBudget(1e-9, record)
    model.fit(np.ones((8, 2)), np.ones((8, 1)), epochs=2, initial_epoch=1, verbose=0,
              callbacks=[record, budget])
    # The run ended at its last epoch: nothing was stopped, nothing left to announce.
    assert budget.stopped_epoch is None
    assert "Time budget" not in capsys.readouterr().out


def test_plan_cooldown_follows_the_budget_until_the_cooldown_begins():
    from keras_transformer.training.callbacks import plan_cooldown

    def plan(seconds, minutes=1.0, max_epochs=10):
        return plan_cooldown(seconds, minutes, max_epochs, steps_per_epoch=10, fraction=0.3)

    assert plan([]) == (10, 100, 30)  # nothing timed yet: `epochs` bounds the run
    assert plan([10.0]) == (6, 60, 18)  # 10 s + 5 x 10 s fit in 60 s
    assert plan([10.0], minutes=100.0) == (10, 100, 30)  # at most `epochs`
    assert plan([10.0, 20.0]) == (3, 30, 9)  # replanned by the longest epoch
    # ... after the first, which also traces the step: 30 s + 6 x 10 s fit in 90 s.
    assert plan([20.0, 10.0], minutes=1.5) == (8, 80, 24)
    # The cooldown of the 6-epoch plan began at update 42 (epoch 4.2): it stays, even
    # when the epochs after it would predict another length.
    assert plan([10.0, 10.0, 10.0, 10.0, 10.0, 30.0]) == (6, 60, 18)
    assert plan([10.0, 10.0, 10.0, 10.0, 10.0]) == (6, 60, 18)
    # A slower epoch found before the cooldown: the plan shrinks, and a cooldown that
    # should have begun already begins now, shorter.
    # (8 epochs planned, cooldown from update 56; after 55 s, 84 s hold one 25-s epoch.)
    assert plan([10.0, 10.0, 10.0, 25.0], minutes=1.4) == (5, 50, 10)
    # No epoch left: the run ends here, before any cooldown.
    assert plan([10.0, 10.0, 10.0, 25.0], minutes=1.0) == (4, 40, 0)
    # A cooldown of the whole run is placed once the first epoch is timed.
    assert plan_cooldown([10.0, 10.0], 1.0, 30, steps_per_epoch=10, fraction=1.0) == (6, 60, 50)
    # The epochs planned do not depend on the batches per epoch (the trainer relies on it).
    for seconds in ([10.0], [10.0, 20.0], [10.0, 10.0, 10.0, 25.0], [10.0] * 5 + [30.0]):
        assert len({plan_cooldown(seconds, 1.4, 10, steps, 0.3)[0]
                    for steps in (1, 7, 10, 269)}) == 1


@pytest.mark.parametrize("fraction", [0.3, 0.8, 1.0])
@pytest.mark.parametrize("max_epochs", [2, 3, 5, 40])
def test_the_planned_rate_never_rises_as_the_plan_is_made_again(fraction, max_epochs):
    # The plan made before any epoch is timed (`epochs` long) put a long cooldown's start
    # inside the first epoch; the plan made after it began that cooldown again at 1.0:
    # with fraction 1 and 3 epochs, 0.7 at the first epoch's last update, then 1.0.
    from keras_transformer.training.callbacks import plan_cooldown
    from keras_transformer.training.schedules import cooldown_multiplier

    steps = 10
    for seconds in ([600.0] * 6, [600.0, 300.0, 900.0, 600.0], [300.0] * 6):
        rates = []
        for done in range(len(seconds)):
            epochs, total, cool = plan_cooldown(seconds[:done], 21.0, max_epochs, steps,
                                                fraction)
            if done >= epochs:
                break
            rates += [float(cooldown_multiplier(step, total, cool, "linear", np)) if cool
                      else 1.0 for step in range(done * steps, (done + 1) * steps)]
        assert all(b <= a + 1e-9 for a, b in zip(rates, rates[1:])), (seconds, rates)


class _FakeEpochTimes:
    """A `RunHistory` whose epochs take the given seconds (a slower machine, not measured)."""

    def __new__(cls, path, seconds, initial=None):
        from keras_transformer.training.callbacks import RunHistory

        class Timed(RunHistory):
            def on_epoch_end(self, epoch, logs=None):
                super().on_epoch_end(epoch, logs)
                self.epoch_seconds[-1] = seconds[epoch]

        return Timed(path, initial=initial)


@pytest.mark.parametrize("mirrored", [False, True])
def test_budget_cooldown_ends_the_rate_at_zero_and_stops_there(tmp_path, mirrored):
    import tensorflow as tf

    from keras_transformer.training.callbacks import BudgetCooldown, TimeBudget
    from keras_transformer.training.schedules import TransformerSchedule

    # Faster after the first two epochs: the budget alone would allow a fourth.
    record = _FakeEpochTimes(str(tmp_path / "history.json"), [10.0, 10.0] + [2.0] * 18)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"]) if mirrored else (
        tf.distribute.get_strategy())
    with strategy.scope():
        schedule = TransformerSchedule(d_model=16, warmup_steps=2, total_steps=20 * 4,
                                       cooldown_steps=20)
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(schedule), loss="mse")
    applied = []  # the rate of each update, read from the optimizer after the update
    callbacks = [record, TimeBudget(0.6, record), BudgetCooldown(schedule, 0.5, 0.6, record),
                 keras.callbacks.LambdaCallback(on_train_batch_begin=lambda batch, logs: applied
                                                .append(float(model.optimizer.learning_rate)))]
    # 4 batches per epoch, `epochs` allows 20; 0.6 minutes hold 3 ten-second epochs, the
    # plan after epoch 1, whose cooldown begins in epoch 2 and then stays.
    model.fit(np.ones((16, 2)), np.ones((16, 1)), batch_size=4, epochs=20, verbose=0,
              callbacks=callbacks)
    assert record.record()["epochs"] == 3
    assert (schedule.total_steps, schedule.cooldown_steps) == (12, 6)
    assert int(model.optimizer.iterations.numpy()) == 12
    full = [float(TransformerSchedule(16, 2)(i)) for i in range(12)]
    expected = [rate * min(1.0, (12 - i) / 6) for i, rate in enumerate(full)]
    np.testing.assert_allclose(applied, expected, rtol=1e-5)
    assert float(schedule(12)) == 0.0


def test_budget_cooldown_replans_a_resumed_run_from_its_history(tmp_path, capsys):
    from keras_transformer.training.callbacks import BudgetCooldown
    from keras_transformer.training.schedules import TransformerSchedule

    schedule = TransformerSchedule(16, 2, total_steps=80, cooldown_steps=40)
    # Two epochs of 10 s trained before a restart.
    record = _FakeEpochTimes(str(tmp_path / "history.json"), [10.0, 10.0] + [2.0] * 18,
                             initial={"epoch_seconds": [10.0, 10.0]})
    cooldown = BudgetCooldown(schedule, 0.5, 0.6, record)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(schedule), loss="mse")
    model.fit(np.ones((16, 2)), np.ones((16, 1)), batch_size=4, epochs=20, initial_epoch=2,
              verbose=0, callbacks=[record, cooldown])
    assert (schedule.total_steps, schedule.cooldown_steps) == (12, 6)  # as uninterrupted
    assert record.record()["epochs"] == 3  # the third and last epoch only
    assert "hold 3 epoch(s); the rate falls to zero over the last 6 of 12" in capsys.readouterr().out


@pytest.mark.parametrize("minutes", [math.inf, math.nan, -1.0, 0, "55", True])
def test_budget_callbacks_refuse_a_budget_that_is_not_a_finite_number(tmp_path, minutes):
    # An infinite or NaN budget was taken, then failed after the first epoch ("cannot
    # convert float NaN to integer"); BudgetCooldown checked nothing.
    from keras_transformer.training.callbacks import BudgetCooldown, RunHistory, TimeBudget
    from keras_transformer.training.schedules import TransformerSchedule

    record = RunHistory(str(tmp_path / "history.json"))
    schedule = TransformerSchedule(16, 2, total_steps=80, cooldown_steps=40)
    with pytest.raises(ValueError, match="finite number > 0"):
        TimeBudget(minutes, record)
    with pytest.raises(ValueError, match="finite number > 0"):
        BudgetCooldown(schedule, 0.3, minutes, record)
    with pytest.raises(ValueError, match="finite number > 0"):
        make_callbacks(str(tmp_path), run_history=record, time_budget_minutes=minutes)


def test_budget_cooldown_of_a_finished_run_saved_again_keeps_its_plan(tmp_path, capsys):
    # A run its budget ended, killed during its final save, is run again: `fit` gets no
    # epoch to train (`epochs` = the epochs done). Its cooldown was planned with that as
    # `max_epochs`, 5 epochs where the run had planned 6: the saved model's schedule ended
    # at update 500, and a plan was printed for a run that trained nothing.
    from keras_transformer.training.callbacks import BudgetCooldown
    from keras_transformer.training.schedules import TransformerSchedule

    seconds = [600.0] * 4 + [900.0]
    schedule = TransformerSchedule(16, 2, total_steps=4000, cooldown_steps=1200)
    record = _FakeEpochTimes(str(tmp_path / "history.json"), seconds,
                             initial={"epoch_seconds": seconds})
    cooldown = BudgetCooldown(schedule, 0.3, 60.0, record, max_epochs=40)
    cooldown.set_params({"epochs": 5, "steps": 100})
    cooldown.on_train_begin()
    assert (schedule.total_steps, schedule.cooldown_steps) == (600, 180)  # as uninterrupted
    assert "Learning-rate cooldown" not in capsys.readouterr().out


def test_budget_cooldown_says_so_when_the_budget_leaves_no_cooldown(tmp_path, capsys):
    from keras_transformer.training.callbacks import BudgetCooldown
    from keras_transformer.training.schedules import TransformerSchedule

    schedule = TransformerSchedule(16, 2, total_steps=80, cooldown_steps=40)
    record = _FakeEpochTimes(str(tmp_path / "history.json"), [50.0] * 20)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(schedule), loss="mse")
    model.fit(np.ones((16, 2)), np.ones((16, 1)), batch_size=4, epochs=20, verbose=0,
              callbacks=[record, BudgetCooldown(schedule, 0.5, 1.0, record)])
    assert record.record()["epochs"] == 1
    assert "ends the run after epoch 1, before its cooldown" in capsys.readouterr().out
    assert (schedule.total_steps, schedule.cooldown_steps) == (80, 40)  # untouched


def test_make_callbacks_plans_the_cooldown_only_within_a_budget(tmp_path):
    from keras_transformer.training.callbacks import BudgetCooldown, RunHistory, TimeBudget
    from keras_transformer.training.schedules import TransformerSchedule

    schedule = TransformerSchedule(16, 2, total_steps=80, cooldown_steps=40)
    record = RunHistory(str(tmp_path / "history.json"))
    callbacks = make_callbacks(str(tmp_path), tensorboard=False, run_history=record,
                               time_budget_minutes=5.0, cooldown_schedule=schedule,
                               cooldown_fraction=0.3)
    kinds = [type(c) for c in callbacks]
    assert kinds.index(type(record)) < kinds.index(TimeBudget) < kinds.index(BudgetCooldown)
    assert not any(isinstance(c, BudgetCooldown) for c in make_callbacks(
        str(tmp_path), tensorboard=False, run_history=record, time_budget_minutes=5.0))
    with pytest.raises(ValueError, match="time_budget_minutes"):
        make_callbacks(str(tmp_path), tensorboard=False, run_history=record,
                       cooldown_schedule=schedule, cooldown_fraction=0.3)


def _dropout_probe(strategy=None, rate=0.01):
    """A model whose loss is near 0 at dropout 0.01 and about 4 at 0.5 (seeded)."""
    import tensorflow as tf

    with (strategy or tf.distribute.get_strategy()).scope():
        model = keras.Sequential([
            keras.Input((4,)),
            keras.layers.Dropout(rate, seed=3),
            keras.layers.Dense(1, use_bias=False, kernel_initializer="ones", trainable=False),
        ])
        model.compile(optimizer="sgd", loss="mse")
    return model, np.ones((8, 4)), np.full((8, 1), 4.0)


@pytest.mark.parametrize("mirrored", [False, True])
def test_late_dropout_raises_every_rate_at_its_epoch_and_the_steps_use_it(mirrored, capsys):
    import tensorflow as tf

    from keras_transformer.training.callbacks import LateDropout

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"]) if mirrored else None
    model, x, y = _dropout_probe(strategy)
    history = model.fit(x, y, batch_size=4, epochs=4, verbose=0,
                        callbacks=[LateDropout(0.5, epoch=2)])
    losses = history.history["loss"]
    # The train function traced for epochs 1-2 drops at 0.01: epochs 3-4 drop at 0.5
    # only if the switch made it again.
    assert max(losses[:2]) < 0.3, losses
    assert min(losses[2:]) > 1.0, losses
    assert model.layers[0].rate == 0.5
    assert "Late dropout: every Dropout layer's rate is 0.5 from epoch 3 on" in (
        capsys.readouterr().out)


def test_late_dropout_applies_at_once_to_a_run_resumed_past_its_epoch():
    from keras_transformer.training.callbacks import LateDropout

    model, x, y = _dropout_probe()
    history = model.fit(x, y, batch_size=4, epochs=4, initial_epoch=3, verbose=0,
                        callbacks=[LateDropout(0.5, epoch=2)])
    assert history.history["loss"][0] > 1.0


@pytest.mark.parametrize("planned", [23, 24], ids=["short_run", "long_run"])
def test_late_dropout_only_in_a_run_planned_long_enough(planned, capsys):
    from keras_transformer.training.callbacks import LateDropout

    asked = []

    def planned_epochs(done):
        asked.append(done)
        return planned

    model, x, y = _dropout_probe()
    # Resumed past the switch: decided from the plan after epoch 2, as uninterrupted.
    history = model.fit(x, y, batch_size=4, epochs=4, initial_epoch=3, verbose=0,
                        callbacks=[LateDropout(0.5, epoch=2, min_epochs=24,
                                               planned_epochs=planned_epochs)])
    assert asked == [2]
    switched = planned >= 24
    assert model.layers[0].rate == (0.5 if switched else 0.01)
    assert (history.history["loss"][0] > 1.0) == switched
    out = capsys.readouterr().out
    assert ("rate is 0.5 from epoch 3 on" in out) == switched
    assert ("not applied, the run is planned to last 23 epoch(s), fewer than 24" in out) == (
        not switched)


def test_late_dropout_needs_a_dropout_in_use():
    from keras_transformer.training.callbacks import LateDropout

    model, x, y = _dropout_probe(rate=0.0)
    with pytest.raises(ValueError, match="dropout in use"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[LateDropout(0.3, epoch=0)])


def test_late_dropout_reaches_the_dropouts_inside_the_transformer_layers():
    from keras_transformer.training.callbacks import set_dropout_rate

    from keras_transformer import build_transformer

    model = build_transformer(vocab_size=20, d_model=8, num_heads=2, ff_dim=16, num_layers=1,
                              dropout=0.1, max_length=8)
    dropouts = [layer for layer in model._flatten_layers(include_self=False)
                if isinstance(layer, keras.layers.Dropout)]
    # The shared embedding 1; the encoder block: attention weights, 2 sublayer outputs,
    # feed-forward inner (made with rate 0: not in the paper); the decoder block: 2
    # attentions' weights, 3 sublayer outputs, feed-forward inner.
    assert len(dropouts) == 1 + 4 + 6
    assert set_dropout_rate(model, 0.25) == 1 + 3 + 5
    assert sorted(layer.rate for layer in dropouts) == [0.0] * 2 + [0.25] * 9


def test_late_dropout_rejects_bad_arguments():
    from keras_transformer.training.callbacks import LateDropout

    for rate in (0.0, 1.0):
        with pytest.raises(ValueError, match="rate"):
            LateDropout(rate, epoch=2)
    with pytest.raises(ValueError, match="epoch"):
        LateDropout(0.3, epoch=-1)
    with pytest.raises(ValueError, match="planned_epochs"):
        LateDropout(0.3, epoch=2, min_epochs=10)


def _failing_save(filepath, *args, **kwargs):
    """A save that writes half a file, then fails (a full disk)."""
    with open(filepath, "wb") as stream:
        stream.write(b"half a zip")
    raise OSError("No space left on device")


def _checkpoint(callbacks, name):
    return next(c for c in callbacks if getattr(c, "filepath", "").endswith(name))


def test_a_resumed_run_keeps_its_best_checkpoint_by_val_loss(tmp_path):
    # Without validation BLEU the best model is kept by val_loss. A resumed run's first
    # epoch must beat the best of the epochs before it, not replace it unconditionally.
    history = RunHistory(str(tmp_path / "history.json"),
                         initial={"history": {"val_loss": [2.0, 0.5, 0.7]},
                                  "epoch_seconds": [1.0, 1.0, 1.0]})
    callbacks = make_callbacks(str(tmp_path), best_monitor="val_loss", tensorboard=False,
                               run_history=history)
    best = _checkpoint(callbacks, "best.keras")
    model = build_stand_in_model()
    best.set_model(model)
    best.on_epoch_end(3, {"val_loss": 0.9})  # worse than epoch 2's 0.5
    assert not os.path.exists(tmp_path / "checkpoints" / "best.keras")
    best.on_epoch_end(4, {"val_loss": 0.4})
    assert os.path.exists(tmp_path / "checkpoints" / "best.keras")


def test_a_resumed_run_drops_the_val_loss_best_of_an_epoch_its_backup_did_not_see(tmp_path):
    # Killed after epoch 3's best.keras (val_loss 0.1), before epoch 3's backup: the run
    # resumes after epoch 2 and trains epoch 3 again. The discarded epoch's weights must not
    # stay the run's best model (its 0.1 is in no history for a later epoch to beat).
    history = RunHistory(str(tmp_path / "history.json"),
                         initial={"history": {"val_loss": [2.0, 0.5]},
                                  "epoch_seconds": [1.0, 1.0]})
    callbacks = make_callbacks(str(tmp_path), best_monitor="val_loss", tensorboard=False,
                               run_history=history, initial_epoch=2)
    best = _checkpoint(callbacks, "best.keras")
    best.set_model(build_stand_in_model())
    best.on_epoch_end(2, {"val_loss": 0.3})  # a run before the resume saves its record
    path = tmp_path / "checkpoints" / "best.keras"
    with open(f"{path}.json") as f:
        assert json.load(f) == {"val_loss": 0.3, "epoch": 3}
    path.write_bytes(b"the discarded epoch 3's model")

    best.on_train_begin()  # the resume
    assert not path.exists() and not os.path.exists(f"{path}.json") and best.best is None
    best.on_epoch_end(2, {"val_loss": 0.9})  # the retrained epoch 3, worse than epoch 2's
    keras.saving.load_model(path)
    with open(f"{path}.json") as f:
        assert json.load(f) == {"val_loss": 0.9, "epoch": 3}
    # Resumed after epoch 3, the record of epoch 3 is the run's best; the history's best
    # is the one to beat.
    history = RunHistory(str(tmp_path / "history.json"),
                         initial={"history": {"val_loss": [2.0, 0.5, 0.9]},
                                  "epoch_seconds": [1.0, 1.0, 1.0]})
    best = _checkpoint(make_callbacks(str(tmp_path), best_monitor="val_loss",
                                      tensorboard=False, run_history=history,
                                      initial_epoch=3), "best.keras")
    best.on_train_begin()
    assert path.exists() and best.best == 0.5


def test_a_resumed_run_drops_the_last_model_of_an_epoch_past_its_backup(tmp_path):
    # Killed after epoch 4's last.keras, before its backup, then resumed to 3 epochs (or
    # killed again before epoch 4 ended): `export --checkpoint last` exported the weights
    # of an epoch the run had discarded.
    callbacks = make_callbacks(str(tmp_path), tensorboard=False, initial_epoch=0)
    last = _checkpoint(callbacks, "last.keras")
    last.set_model(build_stand_in_model())
    last.on_epoch_end(3, {})
    path = tmp_path / "checkpoints" / "last.keras"
    with open(f"{path}.json") as f:
        assert json.load(f) == {"epoch": 4}
    kept = _checkpoint(make_callbacks(str(tmp_path), tensorboard=False, initial_epoch=4),
                       "last.keras")
    kept.on_train_begin()  # resumed after epoch 4: its own
    assert path.exists()
    resumed = _checkpoint(make_callbacks(str(tmp_path), tensorboard=False, initial_epoch=3),
                          "last.keras")
    resumed.on_train_begin()
    assert not path.exists() and not os.path.exists(f"{path}.json")


@pytest.mark.parametrize("name", ["last.keras", "best.keras"])
def test_a_checkpoint_save_that_fails_leaves_the_previous_one(tmp_path, monkeypatch, name):
    # A full disk or a kill in the middle of a save must not leave a broken zip where the
    # previous checkpoint was.
    callbacks = make_callbacks(str(tmp_path), best_monitor="loss", tensorboard=False)
    checkpoint = _checkpoint(callbacks, name)
    model = build_stand_in_model()
    checkpoint.set_model(model)
    checkpoint.on_epoch_end(0, {"loss": 2.0})
    path = tmp_path / "checkpoints" / name
    before = path.read_bytes()

    monkeypatch.setattr(model, "save", _failing_save)
    with pytest.raises(OSError, match="No space"):
        checkpoint.on_epoch_end(1, {"loss": 1.0})
    assert path.read_bytes() == before
    # No partial file left (the best model's record beside it).
    assert sorted(os.listdir(tmp_path / "checkpoints")) == [name, name + ".json"]


def test_the_best_bleu_checkpoint_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    best_path = str(tmp_path / "best.keras")
    callback = BleuCallback(ScriptedTranslator([["x ."] * 3, ["a dog runs ."] * 3]), SOURCES,
                            REFERENCES, best_path=best_path)
    model, _ = _tiny_fit([callback], epochs=1)
    before = open(best_path, "rb").read()

    monkeypatch.setattr(model, "save", _failing_save)
    with pytest.raises(OSError, match="No space"):
        callback.on_epoch_end(1, {})  # a better BLEU: it saves
    assert open(best_path, "rb").read() == before
    assert sorted(os.listdir(tmp_path)) == ["best.keras", "best.keras.json"]


@pytest.mark.parametrize("kind", ["bleu", "val_loss"])
def test_a_save_cut_short_leaves_a_record_the_resumed_run_drops(tmp_path, monkeypatch, kind):
    # The model was saved before its record: a kill (or a full disk) between the two left an
    # epoch-2 model under epoch 1's record, kept by a run resumed after epoch 1.
    if kind == "bleu":
        best_path = str(tmp_path / "best.keras")
        callback = BleuCallback(ScriptedTranslator([["x ."] * 3, ["a dog runs ."] * 3]),
                                SOURCES, REFERENCES, best_path=best_path, verbose=0)
        model, _ = _tiny_fit([callback], epochs=1)
        improve = {}
    else:
        callback = _checkpoint(make_callbacks(str(tmp_path), best_monitor="val_loss",
                                              tensorboard=False), "best.keras")
        best_path = callback.filepath
        model = build_stand_in_model()
        callback.set_model(model)
        callback.on_epoch_end(0, {"val_loss": 2.0})
        improve = {"val_loss": 1.0}
    monkeypatch.setattr(model, "save", _failing_save)
    with pytest.raises(OSError, match="No space"):
        callback.on_epoch_end(1, improve)
    callback.initial_epoch = 1  # the run resumes after epoch 1
    callback.on_train_begin()
    assert not os.path.exists(best_path) and not os.path.exists(best_path + ".json")


def test_a_bleu_run_continues_a_run_whose_best_was_kept_by_val_loss(tmp_path):
    # A run trained from Python without validation BLEU, continued by the command line with
    # it: the best model's record holds val_loss, and reading "val_bleu" was a KeyError.
    best_path = str(tmp_path / "best.keras")
    with open(best_path + ".json", "w") as f:
        json.dump({"val_loss": 1.5, "epoch": 2}, f)
    callback = BleuCallback(ScriptedTranslator([["a dog runs ."] * 3]), SOURCES, REFERENCES,
                            best_path=best_path, initial_epoch=2, verbose=0)
    callback.on_train_begin()
    assert callback.best_bleu is None  # its first epoch's BLEU becomes the best


def test_the_best_so_far_skips_epochs_without_the_value_and_nan(tmp_path):
    # RunHistory pads a metric logged only on some epochs with None; a NaN loss must not
    # become a best that nothing can beat.
    history = RunHistory(str(tmp_path / "history.json"),
                         initial={"history": {"val_bleu": [None, 30.0, None, float("nan")]},
                                  "epoch_seconds": [1.0] * 4})
    callbacks = make_callbacks(str(tmp_path), best_monitor="val_bleu", tensorboard=False,
                               run_history=history)
    best = _checkpoint(callbacks, "best.keras")
    assert best.best == 30.0 and best.mode == "max"
    best.set_model(build_stand_in_model())
    best.on_epoch_end(4, {"val_bleu": float("nan")})
    assert best.best == 30.0 and not os.path.exists(tmp_path / "checkpoints" / "best.keras")
    best.on_epoch_end(5, {"val_bleu": 31.0})
    assert os.path.exists(tmp_path / "checkpoints" / "best.keras")


def test_the_atomic_backup_reads_a_backup_of_keras_own_callback(tmp_path):
    # A run interrupted before this change left Keras' backup/latest.weights.h5.
    from keras_transformer.training.callbacks import AtomicBackupAndRestore

    backup = str(tmp_path / "backup")
    trained, _ = _tiny_fit([keras.callbacks.BackupAndRestore(backup, delete_checkpoint=False)],
                           epochs=1)
    assert sorted(os.listdir(backup)) == ["latest.weights.h5", "training_metadata.json"]
    epochs = []
    log = keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: epochs.append(epoch))
    restored = AtomicBackupAndRestore(backup)
    _tiny_fit([log, restored], epochs=1)  # epoch 1 of 1 already done: nothing runs
    assert epochs == []
    for got, want in zip(restored.model.get_weights(), trained.get_weights()):
        np.testing.assert_array_equal(got, want)
    assert not os.path.exists(backup)  # deleted when training ends, as Keras' is


def test_the_backup_keeps_the_previous_epoch_to_resume_after(tmp_path):
    # Workers whose backups are an epoch apart resume after the earlier one.
    from keras_transformer.training.callbacks import (
        AtomicBackupAndRestore,
        backup_epochs,
        read_backup_metadata,
    )

    backup = str(tmp_path / "backup")
    _tiny_fit([AtomicBackupAndRestore(backup, delete_checkpoint=False)], 1)
    _tiny_fit([AtomicBackupAndRestore(backup, delete_checkpoint=False)], 3)
    assert backup_epochs(read_backup_metadata(backup)) == [3, 2]
    assert len(os.listdir(backup)) == 3  # two weights files and the record
    epochs = []
    log = keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: epochs.append(epoch))
    restored = AtomicBackupAndRestore(backup, resume_epoch=2, delete_checkpoint=False)
    _tiny_fit([log, restored], epochs=2)
    assert epochs == []  # resumed after epoch 2 of 2
    with pytest.raises(ValueError, match=r"no backup of epoch 1 \(it holds \[3, 2\]\)"):
        _tiny_fit([AtomicBackupAndRestore(str(tmp_path / "other"), delete_checkpoint=False)], 0)
        import shutil

        shutil.copytree(backup, tmp_path / "other", dirs_exist_ok=True)
        _tiny_fit([AtomicBackupAndRestore(str(tmp_path / "other"), resume_epoch=1)], 3)


def test_dropout_seeds_draw_new_masks_every_epoch():
    # The epoch in the counter's high bits (epoch << 32) reached TensorFlow modulo
    # 2**31 - 2, shifting each epoch's masks by 4 steps: epoch 1 repeated epoch 0's.
    from keras_transformer.training.callbacks import DropoutSeeds

    inputs = keras.Input((64,))
    model = keras.Model(inputs, keras.layers.Dropout(0.5, seed=3)(inputs))
    seeds = DropoutSeeds(1234)
    seeds.set_model(model)
    ones = np.ones((1, 64), "float32")

    def masks(epoch, steps):
        seeds.on_epoch_begin(epoch)
        return [tuple(np.asarray(model(ones, training=True))[0] > 0) for _ in range(steps)]

    first = masks(0, 8)
    again = masks(0, 8)
    assert first == again  # an epoch's masks are a function of the seed and the epoch
    second = masks(1, 8)
    assert not set(second) & set(first), "epoch 1 repeats masks of epoch 0"


def test_dropout_seeds_do_not_depend_on_models_built_before():
    # Keras numbers seed generators process-wide (`seed_generator`, then `seed_generator_9`
    # in the next model): seeds keyed on the variable's path gave a second run in the same
    # notebook kernel, or a run resumed there, other dropout masks than a fresh process.
    from keras_transformer.training.callbacks import DropoutSeeds

    def build():
        inputs = keras.Input((64,))
        first = keras.layers.Dropout(0.5, seed=3)(inputs)
        second = keras.layers.Dropout(0.5, seed=3)(inputs)
        return keras.Model(inputs, [first, second])

    ones = np.ones((1, 64), "float32")

    def masks(model):
        seeds = DropoutSeeds(1234)
        seeds.set_model(model)
        seeds.on_epoch_begin(2)
        return [tuple(np.asarray(output)[0] > 0) for output in model(ones, training=True)]

    one, other = build(), build()
    assert ([v.path for v in one.variables] != [v.path for v in other.variables])
    first = masks(one)
    assert first == masks(other)
    assert first[0] != first[1], "two dropouts of one model draw the same masks"


def test_epoch_checkpoints_of_a_second_fit_follow_the_first(tmp_path):
    # Numbered by `fit`'s epoch, which starts at 0 again: "train some more" wrote
    # epoch-001.., which `keep` then deleted as older than the first fit's epoch-003, and
    # an average took the first fit's weights.
    from keras_transformer.training.averaging import average_checkpoints

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((8, 2)), np.full((8, 1), 3.0)
    checkpoints = EpochCheckpoints(tmp_path, keep=2)
    model.fit(x, y, epochs=3, verbose=0, callbacks=[checkpoints])
    model.fit(x, y, epochs=2, verbose=0, callbacks=[checkpoints])
    assert sorted(os.listdir(tmp_path)) == ["epoch-004.weights.npz", "epoch-005.weights.npz"]
    newest = average_checkpoints([tmp_path / "epoch-005.weights.npz"])
    assert all(np.array_equal(a, b) for a, b in zip(newest, model.get_weights()))
    # A new callback on the same directory, and a fit that names its initial epoch.
    model.fit(x, y, epochs=1, verbose=0, callbacks=[EpochCheckpoints(tmp_path, keep=2)])
    model.fit(x, y, initial_epoch=6, epochs=7, verbose=0,
              callbacks=[EpochCheckpoints(tmp_path, keep=2)])
    assert sorted(os.listdir(tmp_path)) == ["epoch-006.weights.npz", "epoch-007.weights.npz"]


def test_callbacks_refuse_what_would_fail_after_an_epoch(tmp_path):
    from keras_transformer.training.callbacks import ModelSaver

    with pytest.raises(ValueError, match="translate_fn"):
        BleuCallback(None, ["a"], ["b"])
    with pytest.raises(ValueError, match="sources"):
        BleuCallback(lambda sentences: sentences, [], [])
    with pytest.raises(ValueError, match=r"\.keras"):
        ModelSaver(str(tmp_path / "m.h5"))


def test_run_history_keeps_a_metric_of_several_values(tmp_path):
    # A model compiled with `R2Score(class_aggregation=None)` (one value per output) failed
    # after its first epoch: "only 0-dimensional arrays can be converted".
    history = RunHistory(str(tmp_path / "history.json"))
    history.set_model(keras.Sequential([keras.Input((1,))]))
    history.on_epoch_begin(0)
    history.on_epoch_end(0, {"loss": np.float32(0.5), "r2": np.array([0.25, 0.75])})
    assert read_run_history(tmp_path / "history.json")["history"]["r2"] == [[0.25, 0.75]]


def test_epoch_checkpoints_of_a_resumed_fit_replace_what_the_killed_one_wrote(tmp_path):
    # The review: a fit resumed at epoch 2 (a backup of epoch 2; the killed process had
    # written epoch-003 before its backup) numbered its epochs 4, 5, ... after that stale
    # file, and an average took epoch 3 twice.
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((8, 2)), np.full((8, 1), 3.0)
    model.fit(x, y, epochs=3, verbose=0, callbacks=[EpochCheckpoints(tmp_path, keep=5)])
    model.fit(x, y, initial_epoch=2, epochs=4, verbose=0,
              callbacks=[EpochCheckpoints(tmp_path, keep=5)])
    assert sorted(os.listdir(tmp_path)) == [f"epoch-00{i}.weights.npz" for i in (1, 2, 3, 4)]
    newest = np.load(tmp_path / "epoch-004.weights.npz")
    assert all(np.array_equal(newest[f"arr_{i}"], w) for i, w in enumerate(model.get_weights()))
    # A new model (an untrained optimizer) from epoch 0 does not number after an earlier
    # run's checkpoints, nor average with them: they go.
    fresh = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    fresh.compile(optimizer="sgd", loss="mse")
    fresh.fit(x, y, epochs=2, verbose=0, callbacks=[EpochCheckpoints(tmp_path, keep=5)])
    assert sorted(os.listdir(tmp_path)) == ["epoch-001.weights.npz", "epoch-002.weights.npz"]

"""Runs started from Python, several in one process (a notebook kernel): each must train as
it would in a fresh process and leave Keras' global state as it found it."""

import keras
import numpy as np
import pytest

from keras_transformer.training import get_preset
from keras_transformer.training.callbacks import read_run_history
from keras_transformer.training.trainer import train, validation_translator

WORDS = "ka lo mi nu pe ra si tu vo xe bal dor fen gim".split()


@pytest.fixture
def config(tmp_path):
    pairs = [f"{a} {b}\t{b} {a}" for a in WORDS for b in WORDS[:6]]
    (tmp_path / "train.tsv").write_text("\n".join(pairs) + "\n")
    return get_preset("tiny").replace(
        data="tsv", data_files={"train": str(tmp_path / "train.tsv")}, source_lang="fr",
        target_lang="en", vocab_size=290, d_model=16, num_heads=2, ff_dim=32, num_layers=1,
        max_length=16, epochs=1, bleu_sentences=0, dropout=0.1, precision=None)


def _train(config, directory):
    return train(config, directory, report_padding=False, verbose=0)


def test_a_second_run_in_the_same_process_trains_the_same_weights(config, tmp_path):
    # Dropout seeds were keyed on generator paths, which Keras numbers process-wide: any
    # model built before in the kernel changed every dropout mask of the next run.
    first = _train(config, tmp_path / "first")
    keras.layers.Dropout(0.5)  # a user's own layer in between
    second = _train(config, tmp_path / "second")
    for a, b in zip(first.model.weights, second.model.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)


def test_a_run_leaves_the_global_dtype_policy_as_it_found_it(config, tmp_path):
    _train(config.replace(precision="mixed_bfloat16"), tmp_path / "bf16")
    assert keras.config.dtype_policy().name == "float32"
    # A user's own global policy does not decide a run's: `precision=None` is float32.
    keras.config.set_dtype_policy("mixed_bfloat16")
    run = _train(config, tmp_path / "float32")
    assert run.model.get_layer("encoder").compute_dtype == "float32"
    assert keras.config.dtype_policy().name == "mixed_bfloat16"


def test_a_new_run_from_python_refuses_validation_files_named_the_other_way_round(
        config, tmp_path):
    # The command line checked every split's order, `train()` only the training files':
    # validation BLEU (which picks best.keras) was computed on the reverse direction.
    for name, side in (("dev.en", 0), ("dev.fr", 1)):
        (tmp_path / name).write_text("".join(
            f"{line.split(chr(9))[side]}\n" for line in
            (tmp_path / "train.tsv").read_text().splitlines()[:20]))
    train_files = []
    for name, side in (("train.fr", 0), ("train.en", 1)):
        (tmp_path / name).write_text("".join(
            f"{line.split(chr(9))[side]}\n" for line in
            (tmp_path / "train.tsv").read_text().splitlines()))
        train_files.append(str(tmp_path / name))
    swapped = config.replace(data="files", data_files={
        "train": train_files, "validation": [str(tmp_path / "dev.en"), str(tmp_path / "dev.fr")]})
    with pytest.raises(ValueError, match="other way round"):
        _train(swapped, tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_quiet_run_draws_no_bar_and_a_finished_one_returns_a_compiled_model(
        config, tmp_path, capsys):
    # Validation BLEU drew its progress bar (`\r`, ANSI codes) whatever `verbose` was; a
    # notebook cell run again on the finished run returned the model uncompiled, so a
    # later cell's `run.model.evaluate(...)` failed ("You must call `compile()`").
    (tmp_path / "val.tsv").write_text("ka lo\tlo ka\nmi nu\tnu mi\n")
    config = config.replace(data_files={"train": str(tmp_path / "train.tsv"),
                                        "validation": str(tmp_path / "val.tsv")},
                            bleu_sentences=2)

    def make_translate_fn(model, source_tokenizer, target_tokenizer):
        return lambda sentences: list(sentences)

    train(config, tmp_path / "run", make_translate_fn=make_translate_fn,
          report_padding=False, verbose=2)
    out = capsys.readouterr().out
    assert "val_bleu" in out and "\r" not in out and "\x1b" not in out
    again = train(config, tmp_path / "run", make_translate_fn=make_translate_fn,
                  report_padding=False, verbose=0)
    assert "Validation BLEU: translating" not in capsys.readouterr().out
    assert again.model.compiled and again.model.optimizer is not None


def test_a_run_from_python_computes_validation_bleu_as_the_command_line_does(config, tmp_path):
    # `train(config, dir)` skipped validation BLEU unless the caller passed a translator
    # factory only the command line had: `bleu_sentences` was ignored, best.keras followed
    # val_loss and an EarlyStopping on val_bleu never saw it.
    (tmp_path / "val.tsv").write_text("ka lo\tlo ka\nmi nu\tnu mi\n")
    config = config.replace(data_files={"train": str(tmp_path / "train.tsv"),
                                        "validation": str(tmp_path / "val.tsv")},
                            bleu_sentences=2, beam_size=1)
    run = _train(config, tmp_path / "run")
    assert "val_bleu" in run.history
    assert 0.0 <= run.history["val_bleu"][-1] <= 100.0
    assert (tmp_path / "run" / "checkpoints" / "best.keras").exists()
    silent = train(config, tmp_path / "none", make_translate_fn=None, report_padding=False,
                   verbose=0)
    assert "val_bleu" not in silent.history
    for wrong in ("beam", True):
        with pytest.raises(ValueError, match="'auto', a callable or None"):
            train(config, tmp_path / "typo", make_translate_fn=wrong)
    assert not (tmp_path / "typo").exists()


@pytest.mark.parametrize("beam_size", [1, 4])
def test_validation_translator_decodes_with_the_configs_search(beam_size, monkeypatch):
    import keras_transformer.export as export

    made = []
    monkeypatch.setattr(export, "Translator", lambda *args: made.append(args) or args)
    config = get_preset("tiny").replace(beam_size=beam_size, length_penalty=1.2, max_length=20)
    validation_translator(config)("model", "source", "target")
    (model, source, target, decoding), = made
    assert (model, source, target) == ("model", "source", "target")
    assert decoding.search == ("greedy" if beam_size == 1 else "beam")
    assert decoding.max_output_length == 36
    if beam_size > 1:
        assert (decoding.beam_size, decoding.alpha) == (4, 1.2)


def test_a_run_a_users_callback_stopped_stays_stopped_and_keeps_what_it_restored(
        config, tmp_path, capsys):
    # A run its own EarlyStopping stopped was trained on when the cell ran again (it had
    # trained fewer than `epochs`), and `restore_best_weights` restored the best epoch's
    # weights only after model.keras had been saved with the last epoch's.
    config = config.replace(epochs=4)

    def early_stopping():  # stops after the second epoch, restoring the first's weights
        return keras.callbacks.EarlyStopping(monitor="loss", mode="max", min_delta=1e9,
                                             patience=0, restore_best_weights=True)

    run = train(config, tmp_path / "run", callbacks=[early_stopping()],
                report_padding=False, verbose=0)
    assert run.epochs_trained == 2
    saved = keras.saving.load_model(tmp_path / "run" / "model.keras")
    for a, b in zip(run.model.weights, saved.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    capsys.readouterr()

    again = train(config, tmp_path / "run", callbacks=[early_stopping()],
                  report_padding=False, verbose=0)
    out = capsys.readouterr().out
    assert again.epochs_trained == 0
    assert "a callback stopped" in out and "nothing to train" in out and "epochs" in out
    for a, b in zip(run.model.weights, again.model.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)

    # More epochs than it was asked for continue it, from the weights it kept.
    more = train(config.replace(epochs=5), tmp_path / "run", report_padding=False, verbose=0)
    assert more.epochs_trained == 3


def test_a_stop_a_kill_interrupted_stays_a_stop(config, tmp_path, monkeypatch):
    # The stop was recorded as training ended, after the last epoch's backup: killed in
    # between, the run resumed and trained on what the user's callback had stopped.
    from keras_transformer.training.callbacks import RunHistory

    def killed(self, logs=None):
        raise RuntimeError("killed")

    stop = keras.callbacks.EarlyStopping(monitor="loss", mode="max", min_delta=1e9, patience=0)
    with monkeypatch.context() as patched:
        patched.setattr(RunHistory, "on_train_end", killed)
        with pytest.raises(RuntimeError, match="killed"):
            _train_with(config.replace(epochs=4), tmp_path / "run", [stop])
    assert (tmp_path / "run" / "backup").is_dir()
    again = _train_with(config.replace(epochs=4), tmp_path / "run", [])
    assert again.epochs_trained == 0
    assert (tmp_path / "run" / "model.keras").is_file() and not (tmp_path / "run" / "backup").exists()


def test_a_users_callback_sees_the_restored_state_when_training_begins(
        config, tmp_path, monkeypatch):
    # Placed before the backup (so that what they restore is saved), users' callbacks ran
    # `on_train_begin` before the backup was restored: a resumed run showed them step 0 and
    # the initial weights.
    from keras_transformer.training.callbacks import FinalModelSaver

    def killed(self, logs=None):
        raise RuntimeError("killed")

    with monkeypatch.context() as patched:
        patched.setattr(FinalModelSaver, "on_train_end", killed)
        with pytest.raises(RuntimeError, match="killed"):
            _train_with(config.replace(epochs=2), tmp_path / "run", [])
    seen = []

    class Probe(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            seen.append(int(self.model.optimizer.iterations))

    _train_with(config.replace(epochs=2), tmp_path / "run", [Probe()])
    assert seen and seen[0] > 0


def _train_with(config, directory, callbacks):
    return train(config, directory, callbacks=callbacks, report_padding=False, verbose=0)


def test_a_run_too_short_for_its_warmup_says_so_and_how_to_fix_it(config, tmp_path, capsys):
    # The README's own-data recipe (`--preset quick`, 400 warm-up steps) on 1,500 pairs made
    # 50 updates: the rate peaked at 1/8 of its plan, cooled to zero, and the run ended at
    # 0.0 BLEU with nothing said.
    from keras_transformer.training.trainer import warmup_warning

    message = warmup_warning(config.replace(warmup_steps=400, epochs=2, lr_cooldown=0.3), 25)
    assert "warmup_steps=400" in message and "50 updates" in message
    assert "9%" in message  # of the peak: 35 updates before the cooldown, of 400
    assert "--set warmup_steps=" in message
    without_cooldown = warmup_warning(config.replace(warmup_steps=400, epochs=2,
                                                     lr_cooldown=0.0), 24)
    assert "12%" in without_cooldown and "cooldown" not in without_cooldown
    assert warmup_warning(config.replace(warmup_steps=30, epochs=2, lr_cooldown=0.3), 25) is None
    assert warmup_warning(config.replace(warmup_steps=50, epochs=2, lr_cooldown=0.0), 25) is None
    # A cooldown over the whole run (lr_cooldown=1) ramps down from the first update: the
    # warning said "only 0% of its peak" where the rate reaches 90% of it.
    assert warmup_warning(config.replace(warmup_steps=400, epochs=10, lr_cooldown=1.0),
                          400) is None
    long_warmup = warmup_warning(config.replace(warmup_steps=4000, epochs=10, lr_cooldown=1.0),
                                 400)
    assert "25%" in long_warmup  # max over t of t/4000 x (4000 - t + 1)/4000, at t = 2000
    # A 1-sqrt cooldown falls faster at first: 15% of the peak (t/4000 x (1 - sqrt(p))).
    assert "15%" in warmup_warning(config.replace(warmup_steps=4000, epochs=10, lr_cooldown=1.0,
                                                  lr_cooldown_shape="1-sqrt"), 400)

    _train(config.replace(warmup_steps=400, steps_per_epoch=None), tmp_path / "short")
    assert "warmup_steps=400" in capsys.readouterr().err
    _train(config.replace(warmup_steps=2, steps_per_epoch=None), tmp_path / "long_enough")
    assert "warmup_steps" not in capsys.readouterr().err


def test_a_run_continued_where_auto_means_another_precision_says_so(
        config, tmp_path, monkeypatch, capsys):
    # `precision="auto"` is resolved on each start from the machine's CPU, and the policy a
    # run trained in was recorded nowhere: continued (or resumed after a kill) on a machine
    # without bfloat16, a run begun in mixed_bfloat16 went on in float32 without a word.
    from keras_transformer.training import trainer

    config = config.replace(precision="auto")
    monkeypatch.setattr(trainer, "resolve_precision", lambda precision: "mixed_bfloat16")
    _train(config, tmp_path / "run")
    assert read_run_history(tmp_path / "run" / "history.json")["precision"] == "mixed_bfloat16"
    capsys.readouterr()
    monkeypatch.setattr(trainer, "resolve_precision", lambda precision: None)
    run = _train(config.replace(epochs=2), tmp_path / "run")
    err = capsys.readouterr().err
    assert ("this run's last epoch (1) trained in mixed_bfloat16; precision 'auto' means "
            "float32 on this machine") in err and "--set precision=mixed_bfloat16" in err
    assert run.model.get_layer("encoder").compute_dtype == "float32"
    assert read_run_history(tmp_path / "run" / "history.json")["precision"] == "float32"
    # The same machine again: nothing to say. Back on the first kind: the last epoch's.
    _train(config.replace(epochs=3), tmp_path / "run")
    assert "trained in" not in capsys.readouterr().err
    monkeypatch.setattr(trainer, "resolve_precision", lambda precision: "mixed_bfloat16")
    _train(config.replace(epochs=4), tmp_path / "run")
    assert "last epoch (3) trained in float32" in capsys.readouterr().err
    # A run whose epochs are all trained says nothing: it trains none.
    monkeypatch.setattr(trainer, "resolve_precision", lambda precision: None)
    _train(config.replace(epochs=4), tmp_path / "run")
    assert "trained in" not in capsys.readouterr().err

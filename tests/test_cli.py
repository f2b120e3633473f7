"""`keras-transformer train | export | evaluate | translate` end to end, as a user runs them."""

import json
import subprocess
import sys

import pytest

from keras_transformer.cli import build_parser


def _cli(*args, stdin=None, cwd=None):
    completed = subprocess.run(
        [sys.executable, "-m", "keras_transformer", *args], input=stdin, capture_output=True,
        text=True, timeout=600, cwd=cwd,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout


@pytest.mark.slow
def test_train_export_evaluate_translate_tiny_run(tmp_path):
    run, tfds = tmp_path / "run", tmp_path / "tfds"
    out = _cli("train", "--preset", "tiny", "--output", str(run), "--tfds-dir", str(tfds),
               "--set", "epochs=2")
    assert "Trained 2 epoch(s)" in out
    for name in ("config.json", "model.keras", "history.json", "tokenizer/tokenizer.model",
                 "checkpoints/last.keras", "checkpoints/best.keras"):
        assert (run / name).is_file(), name
    assert json.loads((run / "config.json").read_text())["epochs"] == 2
    assert len(json.loads((run / "history.json").read_text())["history"]["loss"]) == 2

    # A finished run is reused, not silently overwritten (see tests/test_cli_lifecycle.py).
    modified = (run / "model.keras").stat().st_mtime_ns
    out = _cli("train", "--preset", "tiny", "--output", str(run), "--set", "epochs=2")
    assert "Reusing the finished run" in out
    assert (run / "model.keras").stat().st_mtime_ns == modified

    export = tmp_path / "export"
    out = _cli("export", "--model", str(run), "--out", str(export), "--search", "greedy",
               "--max-output-length", "20")
    assert (export / "1" / "saved_model.pb").is_file() and "Exported" in out

    scores = tmp_path / "scores.json"
    out = _cli("evaluate", "--export", str(export), "--split", "test", "--limit", "20",
               "--tfds-dir", str(tfds), "--show", "2", "--json", str(scores))
    assert "BLEU (cased, detokenized)" in out and out.count("SRC: ") == 2
    figures = json.loads(scores.read_text())
    assert figures["sentences"] == 20 and 0.0 <= figures["bleu"] <= 100.0

    out = _cli("translate", "--export", str(export), stdin="A dog runs.\nTwo men talk.\n")
    assert len(out.splitlines()) == 2


def test_parser_rejects_unknown_choices():
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--output", "x", "--strategy", "tpu"])
    args = parser.parse_args(["export", "--model", "r", "--out", "o"])
    # Beam flags not given stay None (DecodingConfig's defaults then: beam 4, alpha 0.6), so
    # that export can refuse them with another search.
    assert (args.search, args.beam_size, args.alpha) == ("beam", None, None)


def test_config_overrides_are_typed(tmp_path):
    from keras_transformer.cli import _load_config

    args = build_parser().parse_args(
        ["train", "--output", str(tmp_path), "--preset", "tiny", "--set", "d_model=32",
         "dropout=0.2", "--epochs", "3", "--mixed-precision", "bf16"])
    config = _load_config(args)
    assert (config.d_model, config.dropout, config.epochs, config.precision) == (
        32, 0.2, 3, "mixed_bfloat16")


def test_every_set_option_counts(tmp_path):
    # A second --set replaced the first (vocab_size and epochs fell back to the preset's).
    from keras_transformer.cli import _load_config

    args = build_parser().parse_args(
        ["train", "--output", str(tmp_path), "--preset", "tiny", "--set", "d_model=32",
         "epochs=5", "--set", "dropout=0.2"])
    config = _load_config(args)
    assert (config.d_model, config.epochs, config.dropout) == (32, 5, 0.2)


def test_mixed_precision_auto_is_kept_for_the_trainer_to_resolve(tmp_path):
    from keras_transformer.cli import _load_config

    args = build_parser().parse_args(
        ["train", "--output", str(tmp_path), "--preset", "tiny", "--mixed-precision", "auto"])
    assert _load_config(args).precision == "auto"

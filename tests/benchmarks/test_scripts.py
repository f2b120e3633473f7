"""The benchmark scripts run end to end on tiny shapes (their figures are not checked here:
timings belong in benchmarks/RESULTS.md, never in tests)."""

import importlib.util
import pathlib
import re

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("loss", ["same", "own"])
def test_train_vs_keras_hub_prints_a_ratio(loss, capsys):
    pytest.importorskip("keras_hub")
    script = _load("train_vs_keras_hub")
    script.main(["--steps", "2", "--warmup", "1", "--d-model", "16", "--heads", "2",
                 "--ff-dim", "32", "--layers", "1", "--vocab-size", "50", "--batch-size", "4",
                 "--length", "8", "--loss", loss])
    out = capsys.readouterr().out
    assert f"loss: {loss}" in out
    assert re.search(r"ratio keras_transformer / keras_hub: \d+\.\d\dx", out), out
    assert re.search(r"\| keras_hub \| [\d,]+ \| [\d,]+ \|", out), out


@pytest.mark.slow
def test_choose_on_validation_compares_checkpoints_and_alphas(tmp_path, capsys):
    from keras_transformer.training import get_preset
    from keras_transformer.training.averaging import average_run
    from keras_transformer.training.trainer import train
    from tests.data.conftest import toy_pairs, write_lines

    files = {}
    for name, size, seed in (("train", 64, 0), ("val", 6, 1)):
        pairs = toy_pairs(size, seed)
        files[name] = [str(write_lines(tmp_path / f"{name}.fr", [p[0] for p in pairs])),
                       str(write_lines(tmp_path / f"{name}.en", [p[1] for p in pairs]))]
    config = get_preset("tiny").replace(
        data="files", data_files={"train": files["train"], "validation": files["val"]},
        source_lang="fr", target_lang="en", vocab_size=290, epochs=2, keep_checkpoints=2,
        bleu_sentences=0)
    train(config, tmp_path / "run", verbose=0, report_padding=False)
    average_run(tmp_path / "run", last=2)

    script = _load("choose_on_validation")
    script.main([str(tmp_path / "run"), "--checkpoints", "final,averaged", "--alphas", "0.6,1.0",
                 "--beam-size", "2", "--batch-size", "4"])
    out = capsys.readouterr().out
    rows = re.findall(r"^\| (final|averaged) \| 2 \| (0\.6|1\.0) \| (\d+\.\d\d) \|$", out, re.M)
    assert len(rows) == 4, out
    best = max(rows, key=lambda row: float(row[2]))
    assert f"chosen on validation: --checkpoint {best[0]} --alpha {best[1]}" in out


def test_finished_row_share():
    share = _load("decode_vs_ctranslate2").finished_row_share
    assert share([2, 4, 4, 2], batch_size=2) == 0.25  # each batch wastes 2 of 8 row-steps
    assert share([2, 4, 4, 2], batch_size=2, sort=True) == 0.0
    assert share([3, 3, 3], batch_size=32) == 0.0
    assert share([], batch_size=4) == 0.0

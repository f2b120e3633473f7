"""The epoch's step count is known before training: a progress total, no 'ran out of data'."""

import json
import warnings

import pytest

from keras_transformer.data import find_local_multi30k
from keras_transformer.training import get_preset
from keras_transformer.training.trainer import train


@pytest.mark.slow
def test_epoch_size_known_and_one_line_per_epoch_without_a_terminal(tmp_path, capsys):
    if find_local_multi30k() is None:
        pytest.skip("no local copy of Multi30K")
    config = get_preset("tiny").replace(
        train_subset=40, steps_per_epoch=None, epochs=2, bleu_sentences=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(config, tmp_path / "run", data_dir=str(tmp_path / "tfds"), report_padding=False)
    out = capsys.readouterr().out
    assert not [(w.filename, w.lineno, str(w.message)[:300]) for w in caught if "ran out of data" in str(w.message)]
    # capsys is not a terminal: one plain line per epoch, with the total, no \r or ANSI.
    assert "\r" not in out and "\x1b[" not in out and "Unknown" not in out
    report = json.loads((tmp_path / "run" / "data_report.json").read_text())
    steps = report["batches"]["train"]
    assert steps == 5  # 40 pairs / batches of 8
    epoch_lines = [line for line in out.splitlines() if line.startswith(f"{steps}/{steps} ")]
    assert len(epoch_lines) == 2, out

"""A run killed after epoch 2 and restarted ends exactly like an uninterrupted run."""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

_SCRIPT = os.path.join(os.path.dirname(__file__), "resumable_fit.py")


def _run(output_dir, result, kill_after_epoch=None):
    command = [sys.executable, _SCRIPT, str(output_dir), str(result)]
    if kill_after_epoch:
        command += ["--kill-after-epoch", str(kill_after_epoch)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_weights_and_optimizer_state(tmp_path):
    reference = _run(tmp_path / "uninterrupted", tmp_path / "reference.npz")
    assert reference.returncode == 0, reference.stderr[-4000:]

    killed = _run(tmp_path / "resumed", tmp_path / "never_written.npz", kill_after_epoch=2)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-4000:]
    assert os.listdir(tmp_path / "resumed" / "backup")  # the state of epoch 2
    assert not (tmp_path / "never_written.npz").exists()

    resumed = _run(tmp_path / "resumed", tmp_path / "resumed.npz")
    assert resumed.returncode == 0, resumed.stderr[-4000:]

    expected, actual = np.load(tmp_path / "reference.npz"), np.load(tmp_path / "resumed.npz")
    assert expected["epochs_run"].tolist() == [0, 1, 2, 3]
    assert actual["epochs_run"].tolist() == [2, 3]  # resumed, not restarted
    assert sorted(actual.files) == sorted(expected.files)
    assert int(actual["iterations"]) == int(expected["iterations"]) == 4 * 4  # 4 batches/epoch
    assert any(name.startswith("optimizer_") for name in expected.files)
    for name in expected.files:
        if name == "epochs_run":
            continue
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-5, atol=1e-7, err_msg=name)

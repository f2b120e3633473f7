"""`keras-transformer launch`: its workers end with it."""

import os
import signal
import subprocess
import sys
import time

import pytest

_LAUNCH = r"""
import sys
from keras_transformer.training import launcher

sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
launcher.worker_commands = lambda train_args, num_workers: [sleeper] * num_workers
sys.exit(launcher.launch_local_workers(["train"], 2, log_dir=sys.argv[1]))
"""


def _children(pid):
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:  # the parent pid
                children.append(int(entry))
    return children


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (Linux)")
@pytest.mark.timeout(120)
def test_sigterm_to_the_launcher_stops_its_workers(tmp_path):
    # `kill <launcher>` (a job scheduler's stop) left both workers training; starting the
    # launch again failed with "Another process is training into RUN".
    launch = subprocess.Popen([sys.executable, "-c", _LAUNCH, str(tmp_path)],
                              stderr=subprocess.PIPE, text=True)
    workers = []
    try:
        for line in launch.stderr:  # TensorFlow's start-up lines first
            if "Started 2 workers" in line:
                break
        workers = _children(launch.pid)
        assert len(workers) == 2
        launch.send_signal(signal.SIGTERM)
        assert launch.wait(60) == 128 + signal.SIGTERM
        deadline = time.time() + 30
        while any(os.path.exists(f"/proc/{pid}") for pid in workers) and time.time() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in workers if os.path.exists(f"/proc/{pid}")]
    finally:
        launch.kill()
        for pid in workers:
            if os.path.exists(f"/proc/{pid}"):
                os.kill(pid, signal.SIGKILL)


def _commands(*codes_and_output):
    """Worker commands that print to stderr and exit with a code, after a pause."""
    return [[sys.executable, "-c", f"import sys, time; time.sleep({pause}); "
             f"print({text!r}, file=sys.stderr); sys.exit({code})"]
            for pause, text, code in codes_and_output]


def test_a_failed_worker_is_named_with_the_end_of_its_log(tmp_path, monkeypatch, capfd):
    # "A worker failed with exit code 1": which one, and why, was in a log file the user
    # had to find (its error never reached the terminal).
    from keras_transformer.training import launcher

    monkeypatch.setattr(launcher, "worker_commands", lambda train_args, num_workers: _commands(
        (60, "chief", 0), (0, "Could not start gRPC server", 3)))
    assert launcher.launch_local_workers(["train"], 2, log_dir=tmp_path) == 3
    err = capfd.readouterr().err
    assert f"Worker 1 failed with exit code 3 (log: {tmp_path / 'worker-1.log'})" in err, err
    assert "Could not start gRPC server" in err
    assert (tmp_path / "worker-1.log").is_file()


def test_the_launchers_own_log_directory_goes_when_every_worker_succeeded(tmp_path,
                                                                          monkeypatch):
    # Every launch without --log-dir left a keras-transformer-workers-* directory in /tmp.
    from keras_transformer.training import launcher

    logs = tmp_path / "logs"
    monkeypatch.setattr(launcher.tempfile, "mkdtemp", lambda prefix: str(logs.mkdir() or logs))
    monkeypatch.setattr(launcher, "worker_commands", lambda train_args, num_workers: _commands(
        (0, "done", 0), (0, "done", 0)))
    assert launcher.launch_local_workers(["train"], 2) == 0
    assert not logs.exists()
    # A failure keeps it: the log is what the user reads.
    monkeypatch.setattr(launcher, "worker_commands", lambda train_args, num_workers: _commands(
        (0, "done", 0), (0, "failed", 2)))
    assert launcher.launch_local_workers(["train"], 2) == 2
    assert (logs / "worker-1.log").read_text().strip() == "failed"

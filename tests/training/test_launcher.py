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

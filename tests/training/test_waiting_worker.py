"""A worker of a cluster says what it waits for, and stops on SIGTERM once connected
(TensorFlow's multi-worker runtime installs a SIGTERM handler that ignores it: a cluster
manager's pod termination, or `launch` stopping its workers, waited for SIGKILL)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from keras_transformer.training.launcher import free_ports

_CODE = """
import os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
from keras_transformer.training.strategy import select_strategy
select_strategy("multi_worker")
print("created", flush=True)
time.sleep(120)
"""


@pytest.mark.slow
def test_a_connected_worker_stops_on_sigterm(tmp_path):
    addresses = [f"127.0.0.1:{port}" for port in free_ports(2)]
    processes, logs = [], []
    for index in range(2):
        tf_config = json.dumps({"cluster": {"worker": addresses},
                                "task": {"type": "worker", "index": index}})
        logs.append(tmp_path / f"worker{index}.txt")
        processes.append(subprocess.Popen(
            [sys.executable, "-c", _CODE], stdout=open(logs[-1], "w"),
            stderr=subprocess.STDOUT, env={**os.environ, "TF_CONFIG": tf_config}))
    try:
        deadline = time.time() + 120
        while not all("created" in log.read_text() for log in logs):
            assert time.time() < deadline, [log.read_text()[-1000:] for log in logs]
            time.sleep(0.5)
        # Both say what they wait for before connecting.
        assert all("Connecting to the other workers" in log.read_text() for log in logs)
        assert all(addresses[1] in log.read_text() for log in logs)
        processes[1].send_signal(signal.SIGTERM)
        assert processes[1].wait(timeout=20) == -signal.SIGTERM
    finally:
        for process in processes:
            process.kill()
            process.wait()

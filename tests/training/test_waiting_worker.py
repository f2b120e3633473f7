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


def _lone_worker(tmp_path, timeout_minutes=None):
    """Worker 0 of a two-worker cluster whose worker 1 never starts (`timeout_minutes`
    passed to `select_strategy` unless None), and its log."""
    code = _CODE if timeout_minutes is None else _CODE.replace(
        'select_strategy("multi_worker")',
        f'select_strategy("multi_worker", cluster_timeout_minutes={timeout_minutes})')
    tf_config = json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in free_ports(2)]},
                            "task": {"type": "worker", "index": 0}})
    log = tmp_path / "worker0.txt"
    # Started as from a terminal: a shell's background job (`make test &`) ignores SIGINT,
    # and its children would inherit that.
    process = subprocess.Popen([sys.executable, "-c", code], stdout=open(log, "w"),
                               stderr=subprocess.STDOUT, env={**os.environ, "TF_CONFIG": tf_config},
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    return process, log


@pytest.mark.slow
def test_a_worker_whose_peers_never_come_gives_up(tmp_path):
    # A wrong address in TF_CONFIG, or a machine that never started: the worker waited for
    # ever, and only SIGKILL stopped it.
    process, log = _lone_worker(tmp_path, 0.1)
    try:
        assert process.wait(timeout=90) == 1, log.read_text()[-2000:]
    finally:
        process.kill()
        process.wait()
    said = log.read_text()
    assert "gives up after 0.1 minute(s)" in said and "Timeout" in said
    assert "created" not in said


@pytest.mark.slow
def test_a_waiting_worker_stops_on_ctrl_c(tmp_path):
    # TensorFlow's wait holds the interpreter, so Python's KeyboardInterrupt never came:
    # Ctrl-C did nothing until the other workers connected.
    process, log = _lone_worker(tmp_path)
    try:
        deadline = time.time() + 60
        while "Connecting to the other workers" not in log.read_text():
            assert time.time() < deadline and process.poll() is None, log.read_text()[-2000:]
            time.sleep(0.2)
        time.sleep(3)  # inside TensorFlow's wait
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == -signal.SIGINT
    finally:
        process.kill()
        process.wait()


def test_the_command_line_waits_as_long_as_the_library():
    from keras_transformer.cli import build_parser
    from keras_transformer.training.strategy import CLUSTER_TIMEOUT_MINUTES

    parser = build_parser()
    assert parser.parse_args(["train", "--output", "r"]).cluster_timeout == \
        CLUSTER_TIMEOUT_MINUTES
    assert parser.parse_args(["train", "--output", "r", "--cluster-timeout", "0"]
                             ).cluster_timeout == 0
    for bad in ("-1", "nan", "inf", "1e9", "soon"):
        with pytest.raises(SystemExit):
            parser.parse_args(["train", "--output", "r", "--cluster-timeout", bad])


@pytest.mark.parametrize("minutes", [-1, float("inf"), float("nan"), "30"])
def test_a_cluster_timeout_that_is_not_minutes_is_refused(minutes):
    # An infinite timeout made faulthandler raise after SIGINT had been switched to its
    # default action, which stayed so: Ctrl-C then killed a notebook's process.
    from keras_transformer.training.strategy import select_strategy

    with pytest.raises(ValueError, match="cluster_timeout_minutes"):
        select_strategy("default", cluster_timeout_minutes=minutes)

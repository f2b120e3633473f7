"""Starts N training workers on this machine (loopback) to try multi-worker training.

`keras-transformer launch --local-workers 2 -- train --preset tiny --output runs/mw` runs
`keras-transformer train ... --worker-index i --workers 127.0.0.1:P0,127.0.0.1:P1` once
per worker, each in its own process, exactly the commands one would run on N machines.
The chief's (worker 0's) output goes to this terminal; the others' to
`<log_dir>/worker-<i>.log`. When one worker fails the others are stopped (a worker whose
peer died would wait in an all-reduce), the failed worker is named with the end of its log,
and the launcher exits with the failure's code.
"""

import collections
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

# Seconds between checks of the workers' exit codes.
_POLL_SECONDS = 0.5
# Seconds a stopped worker gets to exit after SIGTERM before SIGKILL.
_TERMINATE_GRACE_SECONDS = 10


def free_ports(count, host="127.0.0.1"):
    """`count` distinct TCP ports free on `host` right now (the OS picks them).

    Args:
        count: int, how many ports.
        host: string, the interface. Defaults to `"127.0.0.1"`.

    Returns:
        A list of ints.
    """
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def worker_commands(train_args, num_workers, host="127.0.0.1", ports=None):
    """The `train` command line of each worker of a loopback cluster.

    Args:
        train_args: list of strings, `train` and its arguments (no worker flags).
        num_workers: int, how many workers.
        host: string, the address every worker listens on. Defaults to loopback.
        ports: list of ints or `None`; `None` picks free ports.

    Returns:
        A list of argument lists, one per worker, starting with the Python executable.

    Example:

    >>> worker_commands(["train", "--preset", "tiny", "--output", "r"], 2, ports=[1, 2])[1][-4:]
    ['--worker-index', '1', '--workers', '127.0.0.1:1,127.0.0.1:2']
    """
    train_args = list(train_args)
    if not train_args or train_args[0] != "train":
        raise ValueError(f"launch runs `train ...`. Received: {train_args}")
    if num_workers < 1:
        raise ValueError(f"`num_workers` must be >= 1. Received: {num_workers}")
    ports = list(ports) if ports is not None else free_ports(num_workers, host)
    workers = ",".join(f"{host}:{port}" for port in ports)
    return [
        [sys.executable, "-m", "keras_transformer", *train_args,
         "--worker-index", str(index), "--workers", workers]
        for index in range(num_workers)
    ]


def launch_local_workers(train_args, num_workers, threads_per_worker=None, log_dir=None,
                         timeout=None):
    """Runs the workers of a loopback cluster to the end; returns the first failure's code.

    Args:
        train_args: list of strings, `train` and its arguments.
        num_workers: int, how many worker processes.
        threads_per_worker: int or `None`, TensorFlow intra- and inter-op threads of each
            worker (`TF_NUM_INTRAOP_THREADS` / `TF_NUM_INTEROP_THREADS`), e.g. `1` to
            give each worker one core. Defaults to `None` (TensorFlow's choice).
        log_dir: path-like or `None`, where workers 1.. write their output. Defaults to
            a new temporary directory, removed when every worker succeeded.
        timeout: float or `None`, seconds after which all workers are stopped.

    Returns:
        int, `0` when every worker succeeded, else the exit code of the first failure
        (negative: killed by that signal).
    """
    commands = worker_commands(train_args, num_workers)
    own_log_dir = log_dir is None  # removed when every worker succeeded
    log_dir = pathlib.Path(log_dir or tempfile.mkdtemp(prefix="keras-transformer-workers-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)  # each worker builds its own from its flags
    if threads_per_worker:
        env["TF_NUM_INTRAOP_THREADS"] = env["TF_NUM_INTEROP_THREADS"] = str(threads_per_worker)
    processes, logs = [], []
    previous_handler = _stop_on_sigterm()
    try:
        for index, command in enumerate(commands):
            if index == 0:
                processes.append(subprocess.Popen(command, env=env))
                continue
            log = open(log_dir / f"worker-{index}.log", "w", encoding="utf-8")
            logs.append(log)
            processes.append(subprocess.Popen(command, env=env, stdout=log, stderr=log))
        print(f"Started {num_workers} workers on loopback ({commands[0][-1]}); workers "
              f"1..{num_workers - 1} log to {log_dir}", file=sys.stderr, flush=True)
        started = time.time()
        while True:
            codes = [process.poll() for process in processes]
            failed = [index for index, code in enumerate(codes) if code not in (None, 0)]
            if failed:
                _say_failed(failed[0], codes[failed[0]], log_dir)
                return codes[failed[0]]
            if all(code == 0 for code in codes):
                if own_log_dir:
                    for log in logs:
                        log.close()
                    shutil.rmtree(log_dir, ignore_errors=True)
                return 0
            if timeout is not None and time.time() - started > timeout:
                print(f"Workers still running after {timeout}s: stopping them.",
                      file=sys.stderr, flush=True)
                return 1
            time.sleep(_POLL_SECONDS)
    finally:
        stop_processes(processes)
        for log in logs:
            log.close()
        if previous_handler is not None:
            signal.signal(signal.SIGTERM, previous_handler)


# Lines of a failed worker's log shown on the launcher's terminal.
_LOG_LINES_SHOWN = 15


def _say_failed(index, code, log_dir):
    """Names the failed worker and shows the end of its log (the chief's own output is on
    this terminal already)."""
    if index == 0:
        print(f"Worker 0 (the chief) failed with exit code {code}: stopping the others.",
              file=sys.stderr, flush=True)
        return
    log = log_dir / f"worker-{index}.log"
    try:
        with open(log, encoding="utf-8", errors="replace") as file:
            tail = collections.deque(file, maxlen=_LOG_LINES_SHOWN)
    except OSError:
        tail = []
    print(f"Worker {index} failed with exit code {code} (log: {log}); stopping the others. "
          f"The end of its log:\n" + "".join(f"  {line}" for line in tail),
          file=sys.stderr, flush=True)


def _stop_on_sigterm():
    """Makes SIGTERM (`kill`, a job scheduler's stop) end the launcher through its `finally`,
    which stops the workers: Python's default dies at once and left them training. Returns
    the previous handler, or None where one cannot be set (not the main thread)."""
    def stop(signum, frame):
        raise SystemExit(128 + signum)

    try:
        return signal.signal(signal.SIGTERM, stop)
    except ValueError:  # signals are the main thread's
        return None


def stop_processes(processes):
    """Terminates the processes still running, killing those that ignore SIGTERM."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.time() + _TERMINATE_GRACE_SECONDS
    for process in processes:
        try:
            process.wait(timeout=max(deadline - time.time(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


__all__ = ["free_ports", "launch_local_workers", "stop_processes", "worker_commands"]

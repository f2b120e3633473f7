"""MultiWorkerMirroredStrategy for real: two worker processes on 127.0.0.1, one CPU each.

One module-scoped set of runs is checked for several properties, to keep the time small:
- a single-process run and a two-worker run (`keras-transformer launch`) of the tiny
  preset on the real pipeline, with the same global batches: equal weights, and the
  same run directory (only the chief wrote, nothing of the other worker is left);
- a two-worker run whose worker 1 is SIGKILLed mid-epoch, then both started again
  with the same command: it resumes from the backup and ends with the weights of the
  uninterrupted two-worker run;
- the examples each worker receives in an epoch: disjoint, together the whole epoch, also
  with subword sampling.

Every process has a timeout and is killed in a `finally`, pass or fail.
"""

import collections
import json
import os
import pathlib
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from keras_transformer.training.launcher import free_ports, stop_processes

pytestmark = pytest.mark.slow

_HERE = pathlib.Path(__file__).resolve().parent
# Seconds any one process may take (they take ~20-60 s on a busy 2-core machine).
_TIMEOUT = 300
# Seconds the surviving worker gets to notice that its peer died: TensorFlow's
# coordination service misses the dead worker's heartbeats and fails the survivor's
# all-reduce (about 10 s on an idle machine), which must then stop, saying what to do.
_SURVIVOR_GRACE = 150
_EPOCHS = 2


def _env():
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    # One core per worker: TensorFlow's thread pools of one thread each.
    env.update(TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1",
               TF_CPP_MIN_LOG_LEVEL="3")
    return env


def _train_args(output, tfds_dir):
    return ["train", "--preset", "tiny", "--output", str(output), "--tfds-dir", str(tfds_dir),
            "--set", f"epochs={_EPOCHS}"]


def _run(command, **kwargs):
    completed = subprocess.run(command, capture_output=True, text=True, timeout=_TIMEOUT,
                               env=_env(), **kwargs)
    assert completed.returncode == 0, (completed.stdout[-2000:], completed.stderr[-4000:])
    return completed


def _start_workers(commands, log_dir, tag):
    processes = []
    for index, command in enumerate(commands):
        log = open(log_dir / f"{tag}-{index}.log", "w")
        processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                          env=_env()))
        log.close()
    return processes


def _wait(processes, timeout=_TIMEOUT):
    deadline = time.time() + timeout
    codes = []
    for process in processes:
        try:
            codes.append(process.wait(timeout=max(deadline - time.time(), 0.1)))
        except subprocess.TimeoutExpired:
            codes.append(None)
    return codes


def _worker_commands(args, extras=((), ())):
    """Two workers on free loopback ports: `worker_child.py EXTRA -- ARGS` each, with
    worker `i`'s `extras[i]` (its way to die, stop or be slow)."""
    workers = ",".join(f"127.0.0.1:{p}" for p in free_ports(2))
    return [[sys.executable, str(_HERE / "worker_child.py"), *extra, "--", *args,
             "--worker-index", str(index), "--workers", workers]
            for index, extra in enumerate(extras)]


def _run_workers(commands, log_dir, tag, timeout=_TIMEOUT):
    """Runs the workers' `commands` to their end (killed after `timeout` seconds, pass or
    fail): their exit codes (`None`: did not end) and logs (`log_dir/TAG-i.log`)."""
    processes = []
    try:
        processes = _start_workers(commands, log_dir, tag)
        codes = _wait(processes, timeout=timeout)
    finally:
        stop_processes(processes)
    return codes, [(log_dir / f"{tag}-{i}.log").read_text() for i in range(len(commands))]


def _weights(run_dir):
    """`{variable path: value}` of a run's final model."""
    import keras_transformer.layers  # noqa: F401

    model = keras.saving.load_model(run_dir / "model.keras", compile=False)
    return {variable.path: np.array(variable) for variable in model.weights}


def _assert_same_weights(actual, expected):
    """Equal weights, except the attention *key* biases.

    Softmax attention is invariant to `q . b_k`, the same for every key of a query, so the
    key biases' gradient is exactly zero in exact arithmetic; in floating point it is
    rounding noise, which differs with the order of the sums, and Adam divides it by its
    own root mean square: full-size steps of noise. Those biases change nothing the model
    computes, so they are left out; every other variable must match, to 5e-4: the order of
    the sums also depends on the CPU's kernels (on an Intel Xeon with AMX, 2026-11-27, one
    element of 256 differed by 1.9e-4, at the commit before this tolerance as well).
    """
    assert sorted(actual) == sorted(expected)
    compared = [name for name in expected if not name.endswith("key/bias")]
    assert len(compared) > len(expected) / 2
    for name in compared:
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-4, atol=5e-4,
                                   err_msg=name)


def _listing(run_dir):
    """Relative paths of a run directory; TensorBoard event files by directory only
    (their names hold the host, process id and time)."""
    paths = set()
    for path in run_dir.rglob("*"):
        relative = path.relative_to(run_dir).as_posix()
        if ".tfevents." in path.name:
            relative = f"{path.parent.relative_to(run_dir).as_posix()}/<events>"
        paths.add(relative)
    return sorted(paths)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, multi30k_tfds_dir):
    """The single-process run, the two-worker run and the killed-and-restarted run."""
    root = tmp_path_factory.mktemp("multi_worker")
    tfds = multi30k_tfds_dir
    single = root / "single"
    _run([sys.executable, "-m", "keras_transformer", *_train_args(single, tfds),
          "--strategy", "default"])

    two = root / "two"
    launched = _run([sys.executable, "-m", "keras_transformer", "launch", "--local-workers", "2",
          "--threads-per-worker", "1", "--timeout", str(_TIMEOUT), "--log-dir",
          str(root / "launch-logs"), "--", *_train_args(two, tfds)])

    # Worker 1 dies after batch 2 of epoch 2; worker 0 stops at its next all-reduce.
    killed = root / "killed"
    ports = free_ports(2)
    workers = ",".join(f"127.0.0.1:{p}" for p in ports)
    commands = [
        [sys.executable, str(_HERE / "worker_child.py"), *kill, "--", *_train_args(killed, tfds),
         "--worker-index", str(index), "--workers", workers]
        for index, kill in enumerate([[], ["--kill-at", f"{_EPOCHS}:2"]])
    ]
    processes = []
    try:
        processes = _start_workers(commands, root, "killed")
        assert _wait(processes[1:])[0] == -9, (root / "killed-1.log").read_text()[-3000:]
        survivor = _wait(processes[:1], timeout=_SURVIVOR_GRACE)[0]
        stop_processes(processes)
        survivor_log = (root / "killed-0.log").read_text()
        # It did not wait for ever, and told the user what docs/multi_worker.md does.
        assert survivor not in (None, 0), survivor_log[-3000:]
        assert "start every worker again with the same command" in survivor_log, \
            survivor_log[-3000:]
        history = json.loads((killed / "history.json").read_text())
        assert history["epochs"] == _EPOCHS - 1  # epoch 2 never finished

        # Both again, with the same command (without the killer).
        restart = [[sys.executable, "-m", "keras_transformer", *c[c.index("--") + 1:]]
                   for c in commands]
        processes = _start_workers(restart, root, "restarted")
        codes = _wait(processes)
        assert codes == [0, 0], [(root / f"restarted-{i}.log").read_text()[-3000:]
                                 for i in range(2)]
    finally:
        stop_processes(processes)
    return {"single": single, "two": two, "killed": killed, "root": root,
            "launch_output": launched.stdout, "tfds": tfds}


def test_two_workers_train_like_one_process(runs):
    _assert_same_weights(_weights(runs["two"]), _weights(runs["single"]))
    history = json.loads((runs["two"] / "history.json").read_text())["history"]
    reference = json.loads((runs["single"] / "history.json").read_text())["history"]
    np.testing.assert_allclose(history["loss"], reference["loss"], rtol=1e-4)
    assert len(history["val_bleu"]) == _EPOCHS


def test_validation_bleu_is_computed_once_per_evaluation(runs):
    assert runs["launch_output"].count("Validation BLEU: translating") == _EPOCHS
    other = (runs["root"] / "launch-logs" / "worker-1.log").read_text()
    assert "Validation BLEU" not in other and "val_bleu" not in other


def test_only_the_chief_writes_the_run_directory(runs):
    listing = _listing(runs["two"])
    assert listing == _listing(runs["single"])
    assert not [p for p in listing if "workertemp" in p]
    assert "model.keras" in listing and "checkpoints/best.keras" in listing


def test_killed_worker_resumes_from_the_backup(runs):
    _assert_same_weights(_weights(runs["killed"]), _weights(runs["two"]))
    log = (runs["root"] / "restarted-0.log").read_text()
    assert "Resuming" in log
    assert _listing(runs["killed"]) == _listing(runs["two"])
    assert json.loads((runs["killed"] / "history.json").read_text())["epochs"] == _EPOCHS


@pytest.mark.parametrize("subword_nbest", [1, 4], ids=["best", "sampled"])
def test_each_worker_reads_a_distinct_part_of_the_epoch(runs, multi30k_tfds_dir,
                                                        subword_nbest):
    # Sampled (subword regularization), every worker draws the same segmentations from the
    # run's seed: the parts still make up the epoch one process reads.
    root, tokenizer_run = runs["root"], runs["single"]
    script = str(_HERE / "shard_child.py")
    _run([sys.executable, script, str(tokenizer_run), str(multi30k_tfds_dir),
          str(root / f"shard-all-{subword_nbest}.json"), str(subword_nbest)])
    ports = free_ports(2)
    workers = [f"127.0.0.1:{p}" for p in ports]
    processes = []
    try:
        for index in range(2):
            env = _env()
            env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers},
                                           "task": {"type": "worker", "index": index}})
            processes.append(subprocess.Popen(
                [sys.executable, script, str(tokenizer_run), str(multi30k_tfds_dir),
                 str(root / f"shard-{index}-{subword_nbest}.json"), str(subword_nbest)],
                env=env, stdout=subprocess.DEVNULL,
                stderr=open(root / f"shard-{index}-{subword_nbest}.log", "w")))
        assert _wait(processes) == [0, 0]
    finally:
        stop_processes(processes)

    def counted(name, key="examples"):
        result = json.loads((root / f"{name}-{subword_nbest}.json").read_text())
        return result["steps"], collections.Counter(json.dumps(e) for e in result[key])

    steps, whole = counted("shard-all")
    assert sum(whole.values()) == 80 and max(whole.values()) == 1  # one epoch, no repeats
    (steps_0, part_0), (steps_1, part_1) = counted("shard-0"), counted("shard-1")
    assert steps_0 == steps_1 == steps
    assert not part_0 & part_1  # disjoint
    assert part_0 + part_1 == whole  # together exactly the epoch
    assert sum(part_0.values()) == sum(part_1.values()) == 40
    _, best = counted("shard-all", "best")
    assert (whole == best) == (subword_nbest == 1)


def test_workers_share_one_time_budget(tmp_path, multi30k_tfds_dir):
    # Each worker times its own epochs, and they differ: the chief alone computes
    # validation BLEU inside its epoch while the others wait for it outside theirs, a
    # slower machine likewise. Here worker 1's epoch 2 ends 30 s late by its own clock;
    # with a 1-minute budget over 3 epochs, that clock says stop after epoch 2, and
    # worker 0's own (which spent the 30 s waiting between epochs) would train a third,
    # alone, forever waiting for its peer. The clock they share is the slowest worker's
    # epoch: both stop after epoch 2.
    slow = 30
    run = tmp_path / "budget"
    args = ["train", "--preset", "tiny", "--output", str(run), "--tfds-dir",
            str(multi30k_tfds_dir), "--set", "epochs=3", "time_budget_minutes=1"]
    codes, logs = _run_workers(
        _worker_commands(args, [[], ["--slow-epoch", f"2:{slow}"]]), tmp_path, "budget")
    assert codes == [0, 0], [log[-3000:] for log in logs]
    history = json.loads((run / "history.json").read_text())
    assert history["epochs"] == 2, history["epoch_seconds"]
    assert history["epoch_seconds"][1] >= slow  # worker 1's epoch, on the chief's record
    for log in logs:
        assert "after epoch 2; the next epoch" in log and "training stops here" in log


def test_a_chief_killed_saving_the_final_model_resumes_with_every_worker(runs, tmp_path,
                                                                         multi30k_tfds_dir):
    # The chief killed as it wrote the final model.keras (a preemption at the very end):
    # worker 1 had already removed its backup, so started again with the same command the
    # workers held no common epoch ("worker 1 lost the run's backup"). Worker 1 keeps its
    # backup until the chief has saved the final model.
    run = tmp_path / "run"
    commands = _worker_commands(_train_args(run, multi30k_tfds_dir),
                                [["--die-saving-final"], []])
    codes, logs = _run_workers(commands, tmp_path, "final")
    assert codes[0] == -9, logs[0][-3000:]
    assert not (run / "model.keras").exists()
    restart = [[sys.executable, "-m", "keras_transformer", *c[c.index("--") + 1:]]
               for c in commands]
    codes, logs = _run_workers(restart, tmp_path, "again")
    assert codes == [0, 0], [log[-3000:] for log in logs]
    _assert_same_weights(_weights(run), _weights(runs["two"]))
    assert _listing(run) == _listing(runs["two"])


def test_a_finished_run_started_again_on_workers_without_a_shared_disk_ends(runs, tmp_path):
    # Started again after it finished, the chief found the run finished and left before the
    # workers' agreement; worker 1, whose disk holds nothing of the run (no shared
    # filesystem), started a new run and waited in the agreement for a chief that had gone
    # (then "start every worker again", which did the same). The finished chief takes part.
    import shutil

    run = tmp_path / "run"
    shutil.copytree(runs["two"], run)
    ports = free_ports(2)
    workers = ",".join(f"127.0.0.1:{p}" for p in ports)
    tfds = runs["tfds"]
    commands = [
        [sys.executable, "-m", "keras_transformer", *_train_args(output, tfds),
         "--worker-index", str(index), "--workers", workers]
        for index, output in enumerate([run, tmp_path / "worker-1-disk"])
    ]
    codes, logs = _run_workers(commands, tmp_path, "again")
    assert codes == [0, 0], [log[-3000:] for log in logs]
    assert "nothing to train" in logs[0]
    assert "worker 0 holds the finished run" in logs[1], logs[1][-3000:]
    assert _listing(run) == _listing(runs["two"])


def test_a_stop_decided_on_one_worker_stops_every_worker(tmp_path, multi30k_tfds_dir):
    # A callback of the chief alone stopping training (EarlyStopping on val_bleu, which only
    # the chief logs) left the chief in the end-of-training barrier and worker 1 in its next
    # epoch's all-reduce, both alive: for ever. Every worker stops after the same epoch.
    run = tmp_path / "run"
    args = ["train", "--preset", "tiny", "--output", str(run), "--tfds-dir",
            str(multi30k_tfds_dir), "--set", "epochs=3"]
    codes, logs = _run_workers(
        _worker_commands(args, [["--stop-after-epoch", "1"], []]), tmp_path, "stop",
        timeout=180)
    assert codes == [0, 0], [log[-3000:] for log in logs]
    assert json.loads((run / "history.json").read_text())["epochs"] == 1
    assert (run / "model.keras").is_file()
    assert not [p for p in _listing(run) if "workertemp" in p or p == "backup"]

"""Choosing the `tf.distribute` strategy a run trains under, and who writes in a cluster.

Multi-worker training (`MultiWorkerMirroredStrategy`, one process per machine, the cluster
in `TF_CONFIG`) follows TensorFlow's multi-worker guide: every worker runs the same
program and takes part in every collective op, but only the chief writes the run
directory; the other workers write to a temporary directory of their own
(`worker_write_dir`) that is removed when training ends.
"""

import json
import logging
import os
import pathlib
import signal
import sys
import threading

import tensorflow as tf

logger = logging.getLogger(__name__)

STRATEGY_NAMES = ("auto", "default", "mirrored", "multi_worker")
# A non-chief worker's private write directory is `<run dir>/<prefix><task id>`.
WORKER_TEMP_PREFIX = "workertemp_"


def cluster_from_tf_config(tf_config=None):
    """The `cluster` of `TF_CONFIG` (task type -> addresses).

    Args:
        tf_config: string or `None`, the JSON of `TF_CONFIG`; `None` reads the environment
            variable.

    Returns:
        dict; empty when `TF_CONFIG` is unset, empty or has no cluster.

    Raises:
        ValueError: if `TF_CONFIG` is not valid JSON.
    """
    if tf_config is None:
        tf_config = os.environ.get("TF_CONFIG", "")
    if not tf_config.strip():
        return {}
    try:
        return json.loads(tf_config).get("cluster", {})
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON: {error}. Received: {tf_config!r}")


def num_workers_from_tf_config(tf_config=None):
    """Counts the workers (`chief` and `worker` tasks) of the cluster in `TF_CONFIG`.

    Args:
        tf_config: string or `None`, the JSON of `TF_CONFIG`; `None` reads the environment
            variable.

    Returns:
        int, the number of workers; `0` when `TF_CONFIG` is unset, empty or has no cluster.

    Raises:
        ValueError: if `TF_CONFIG` is not valid JSON.
    """
    cluster = cluster_from_tf_config(tf_config)
    return len(cluster.get("chief", [])) + len(cluster.get("worker", []))


def make_tf_config(workers, index):
    """The `TF_CONFIG` JSON of worker `index` in a cluster of `workers` (no separate chief).

    Worker 0 is the chief (it writes the run directory), as in TensorFlow's convention for
    a cluster without a `chief` task.

    Args:
        workers: list of `"host:port"` strings, one per worker, the same list on every
            worker.
        index: int, this worker's position in `workers`.

    Returns:
        string, the JSON to put in the `TF_CONFIG` environment variable.

    Raises:
        ValueError: if `workers` is empty or names an address twice, or `index` is out of
            range.

    Example:

    >>> make_tf_config(["h0:2222", "h1:2222"], 1)
    '{"cluster": {"worker": ["h0:2222", "h1:2222"]}, "task": {"type": "worker", "index": 1}}'
    """
    workers = list(workers)
    if not workers:
        raise ValueError("`workers` must name at least one host:port.")
    _check_distinct(workers)
    if not 0 <= index < len(workers):
        raise ValueError(
            f"`index` must be in [0, {len(workers)}). Received: index={index}, "
            f"workers={workers}"
        )
    return json.dumps(
        {"cluster": {"worker": workers}, "task": {"type": "worker", "index": int(index)}}
    )


def task_of(strategy):
    """`(task_type, task_id)` of this process in `strategy`'s cluster; `(None, None)` alone."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "cluster_spec", None):
        return None, None
    if not resolver.cluster_spec().as_dict():
        return None, None
    return resolver.task_type, resolver.task_id


def is_chief(strategy):
    """Whether this process writes the run directory: the `chief` task, else worker 0.

    Args:
        strategy: a `tf.distribute.Strategy`.

    Returns:
        bool; `True` for any single-process strategy.

    Example:

    >>> is_chief(select_strategy("default"))
    True
    """
    task_type, task_id = task_of(strategy)
    if task_type is None:
        return True
    return _is_chief_task(strategy.cluster_resolver.cluster_spec().as_dict(), task_type,
                          task_id)


def _is_chief_task(cluster, task_type, task_id):
    return task_type == "chief" or (
        task_type == "worker" and task_id == 0 and "chief" not in cluster)


def task_from_tf_config(tf_config=None):
    """This process's task in the cluster of `TF_CONFIG`, read without starting TensorFlow.

    Args:
        tf_config: string or `None`, the JSON of `TF_CONFIG`; `None` reads the environment
            variable.

    Returns:
        `(is_chief, task_id)`: `(True, None)` without a cluster of several workers.

    Raises:
        ValueError: if `TF_CONFIG` is not valid JSON, or names a task that does not train
            (see `check_training_task`).

    Example:

    >>> task_from_tf_config('{"cluster": {"worker": ["a:1", "b:1"]}, '
    ...                     '"task": {"type": "worker", "index": 1}}')
    (False, 1)
    """
    if tf_config is None:
        tf_config = os.environ.get("TF_CONFIG", "")
    check_training_task(tf_config)
    if num_workers_from_tf_config(tf_config) <= 1:
        return True, None
    config = json.loads(tf_config)
    task = config.get("task", {})
    task_type, task_id = task.get("type"), int(task.get("index", 0))
    return _is_chief_task(config.get("cluster", {}), task_type, task_id), task_id


def check_training_task(tf_config=None):
    """Raises `ValueError` unless `TF_CONFIG`'s task, if any, is one that trains.

    Training runs in `chief` and `worker` tasks only. A cluster manager that starts the
    same command in every task (a TFJob with an `Evaluator` or `PS` replica) would
    otherwise have an evaluator take a worker's directory, or train alone beside a single
    worker.

    Args:
        tf_config: string or `None`, the JSON of `TF_CONFIG`; `None` reads the environment
            variable.

    Raises:
        ValueError: on invalid JSON, an address named twice, a task type other than
            `chief` and `worker`, or a task index outside its type's list in the cluster.
    """
    if tf_config is None:
        tf_config = os.environ.get("TF_CONFIG", "")
    if not num_workers_from_tf_config(tf_config):
        return
    config = json.loads(tf_config)
    cluster = config.get("cluster", {})
    _check_distinct([address for kind in ("chief", "worker")
                     for address in cluster.get(kind, [])])
    task = config.get("task") or {}
    if not task:
        return
    task_type, index = task.get("type"), int(task.get("index", 0))
    if task_type not in ("chief", "worker"):
        raise ValueError(
            f"TF_CONFIG gives this process the task type {task_type!r}; training runs in 'chief' "
            "and 'worker' tasks only (MultiWorkerMirroredStrategy). Start no trainer in "
            "this task (an evaluator can run `keras-transformer evaluate` on the run's "
            "checkpoints instead)."
        )
    tasks = config.get("cluster", {}).get(task_type, [])
    if not 0 <= index < len(tasks):
        raise ValueError(
            f"TF_CONFIG names this process {task_type!r} task index {index}, but its "
            f"cluster lists {len(tasks)} {task_type!r} tasks (indices 0 to "
            f"{len(tasks) - 1})."
        )


def _check_distinct(addresses):
    """Refuses a cluster naming an address twice: the second worker cannot start its server
    there, and the first would wait for it until its cluster timeout."""
    seen = set()
    for address in addresses:
        if address in seen:
            raise ValueError(f"The cluster names {address} twice: give each worker its own "
                             f"host:port. Received: {', '.join(addresses)}")
        seen.add(address)


# Ports this process's own cluster server listens on (a second check would find them busy).
_OWN_SERVER_PORTS = set()


def check_own_port(tf_config=None):
    """Refuses a `TF_CONFIG` task whose port is in use on this machine, before the worker
    starts its server there: TensorFlow's "Could not start gRPC server" came after the
    message that the worker waits for the others, and they waited for it until their
    cluster timeout.

    The server listens on every interface, so a program listening on the port on any of
    them is in the way. A port that cannot be checked (one this user may not bind, an
    address that is not `host:port`) is left to TensorFlow.

    Args:
        tf_config: string or `None`, the JSON of `TF_CONFIG`; `None` reads the environment
            variable.

    Raises:
        ValueError: naming the port, the task and how to free it.
    """
    import errno
    import socket

    if tf_config is None:
        tf_config = os.environ.get("TF_CONFIG", "")
    task_type, index, address, port = _own_address(tf_config) or (None, None, None, None)
    if port is None or port in _OWN_SERVER_PORTS:
        return
    for family, host in ((socket.AF_INET, ""), (socket.AF_INET6, "::")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                # As the server's own socket does: a port some closed connection still
                # holds (TIME_WAIT) is free to it; a socket listening there is in the way.
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                probe.bind((host, port))
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                continue  # no such sockets here, or not this user's to bind: TensorFlow's
            raise ValueError(
                f"Port {port} of this worker's address {address} ({task_type} "
                f"{index} of the cluster) is in use on this machine: a "
                "program listens there or a connection holds it (another worker of this "
                "cluster given the same port under another name, a worker of another run). "
                "Free it, or give this worker a free port in --workers (TF_CONFIG), the same "
                "list on every worker; under `launch`, start it again (it picks free "
                "ports).") from None


def _own_address(tf_config):
    """`(task type, index, address, port)` of this task in `TF_CONFIG`, or `None` without
    one; `port` is `None` where the address names none."""
    if not num_workers_from_tf_config(tf_config):
        return None
    config = json.loads(tf_config)
    task = config.get("task") or {}
    tasks = config.get("cluster", {}).get(task.get("type"), [])
    index = int(task.get("index", 0))
    if not 0 <= index < len(tasks):
        return None  # check_training_task says so
    port = str(tasks[index]).rpartition(":")[2]
    port = int(port) if port.isdigit() and 0 < int(port) < 65536 else None
    return task.get("type"), index, tasks[index], port


def worker_write_dir(output_dir, strategy):
    """Where this process writes: `output_dir` on the chief, a private directory elsewhere.

    A non-chief worker writes its checkpoints, backups, logs and tokenizer under
    `output_dir/workertemp_<task_id>` (the name TensorFlow's multi-worker guide and
    `tf.keras`' own fault-tolerance code use). The name is fixed, not random, so a worker
    restarted after a failure finds its own `BackupAndRestore` state again; the trainer
    deletes the directory when training ends. On a cluster without a shared filesystem
    it lives on the worker's own disk and never reaches the chief's run directory.

    Args:
        output_dir: path-like, the run directory.
        strategy: a `tf.distribute.Strategy`.

    Returns:
        A `pathlib.Path`.
    """
    output_dir = pathlib.Path(output_dir)
    if is_chief(strategy):
        return output_dir
    task_type, task_id = task_of(strategy)
    return output_dir / f"{WORKER_TEMP_PREFIX}{task_id}"


def slowest_worker(strategy):
    """A function `seconds -> seconds` that every worker calls with its own epoch time and
    that returns the largest of them, the same on every worker; `None` outside a cluster.

    Workers time their epochs differently (the chief alone computes validation BLEU;
    a slower or busier machine makes the others wait inside their next epoch), so a time
    budget each worker planned from its own clock could stop one worker while another
    trains on, waiting forever in its next all-reduce. Every worker records instead the
    slowest worker's time (`RunHistory(reduce_seconds=...)`), so the budget's decisions,
    which depend only on the recorded times, are the same everywhere. It is a collective
    op: every worker must call it, at the same point of the run (the end of each epoch).

    Args:
        strategy: a `tf.distribute.Strategy`.

    Returns:
        A callable `float -> float`, or `None` for a single-process strategy.
    """
    if task_of(strategy)[0] is None:
        return None
    replicas = strategy.num_replicas_in_sync

    def reduce(seconds):
        def own_slot():
            # Each replica writes its worker's time into its own slot; the sum of the
            # vectors holds every replica's, exactly (the other slots add zeros).
            index = tf.distribute.get_replica_context().replica_id_in_sync_group
            return tf.one_hot(index, replicas, on_value=tf.constant(seconds, tf.float64),
                              dtype=tf.float64)

        every = strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(own_slot), axis=None)
        return float(tf.reduce_max(every))

    return reduce


def gather_from_workers(strategy, values):
    """Every replica's `values` (numbers), the same list on every worker: a collective op
    that every worker must call at the same point of the run.

    Args:
        strategy: a `tf.distribute.Strategy`.
        values: sequence of numbers (integers up to 2**53 arrive exactly).

    Returns:
        list of lists of floats, one per replica in replica order (`[values]` for a
        single-process strategy).
    """
    values = [float(v) for v in values]
    if task_of(strategy)[0] is None:
        return [values]
    replicas = strategy.num_replicas_in_sync

    def own_row():
        # Each replica writes its row; the sum of the matrices holds every row exactly.
        index = tf.distribute.get_replica_context().replica_id_in_sync_group
        return tf.scatter_nd([[index]], [tf.constant(values, tf.float64)],
                             [replicas, len(values)])

    every = strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(own_row), axis=None)
    return every.numpy().tolist()


def worker_barrier(strategy):
    """A function of no arguments that returns once every worker has called it (a
    collective op: every worker calls it at the same point of the run); `None` outside a
    cluster. A worker whose peer died stops in it with TensorFlow's `UnavailableError`.
    """
    if task_of(strategy)[0] is None:
        return None
    return lambda: gather_from_workers(strategy, [0])


# Minutes a worker waits for the others of its cluster to connect before it gives up
# (`select_strategy(cluster_timeout_minutes=...)`, `train --cluster-timeout`).
CLUSTER_TIMEOUT_MINUTES = 30.0


def check_cluster_timeout(minutes):
    """Refuses a cluster timeout that is not a finite number of minutes >= 0 (or None)."""
    if minutes is None:
        return
    if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not (
            0 <= minutes < 1e6):
        raise ValueError(f"`cluster_timeout_minutes` must be a number of minutes in [0, 1e6) "
                         f"(0 or None: no limit), got {minutes!r}.")


def _start_watchdog(seconds):
    """`faulthandler`'s exit after `seconds` (stack traces to the process' standard error);
    whether it started: it needs a stream with a file descriptor, which a notebook's
    `sys.stderr` may not have. The watchdog is the process' only one: it replaces any other
    `faulthandler.dump_traceback_later` timer."""
    import faulthandler

    for stream in (sys.stderr, sys.__stderr__):
        try:
            faulthandler.dump_traceback_later(seconds, exit=True, file=stream)
            return True
        except (AttributeError, ValueError, OSError):  # io.UnsupportedOperation too
            continue
    logger.warning("No stream with a file descriptor: the wait for the cluster has no "
                   "time limit.")
    return False


def _wait_for_the_cluster(create, timeout_minutes=CLUSTER_TIMEOUT_MINUTES):
    """`create()` (a `MultiWorkerMirroredStrategy`, which waits until every worker of
    `TF_CONFIG` has connected), said first; Ctrl-C stops the wait, and after
    `timeout_minutes` (None or 0: never; checked by `select_strategy`) the worker gives up;
    then SIGTERM terminates the process again.

    TensorFlow's wait for the other workers holds the interpreter: no Python code runs
    until they connect, so neither a `KeyboardInterrupt` nor a Python timer can end it.
    During the wait Ctrl-C (SIGINT) therefore takes the system's default action (the
    process ends at once: nothing has been written yet) where it would have raised
    `KeyboardInterrupt` (a SIGINT that is ignored, as under `nohup`, or handled by other
    code stays so), and the timeout is `faulthandler`'s watchdog thread, which runs without
    the interpreter: it prints where the worker waited and exits with status 1. A worker
    whose peers never come (a wrong address in `TF_CONFIG`, a machine that did not start)
    stops instead of waiting for ever. The watchdog is process-wide: it replaces, then
    cancels, any other `faulthandler.dump_traceback_later` timer.

    TensorFlow's multi-worker runtime also installs a SIGTERM handler that ignores the
    signal (for its preemption notices): a worker went on training after a cluster
    manager's pod termination or `launch` stopped it, until SIGKILL. Once connected,
    SIGTERM terminates again and SIGINT has its handler from before the wait.
    """
    workers = cluster_from_tf_config()
    addresses = ", ".join(a for kind in ("chief", "worker") for a in workers.get(kind, []))
    limit = (f"gives up after {timeout_minutes:g} minute(s)" if timeout_minutes
             else "waits with no time limit")
    print(f"Connecting to the other workers of the cluster ({addresses}): this waits until "
          f"`train` runs on every one of them (Ctrl-C stops it; it {limit}).",
          file=sys.stderr, flush=True)
    main = threading.current_thread() is threading.main_thread()
    interrupt = signal.getsignal(signal.SIGINT) if main else None
    watched = False
    try:
        watched = bool(timeout_minutes) and _start_watchdog(timeout_minutes * 60)
        if interrupt is signal.default_int_handler:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
        strategy = create()
    finally:
        if watched:
            import faulthandler

            faulthandler.cancel_dump_traceback_later()
        if main and interrupt is not None:
            signal.signal(signal.SIGINT, interrupt)
    if main:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return strategy


def shard_by_data(dataset):
    """Sets `AutoShardPolicy.DATA` on `dataset`: each worker keeps its part of every batch.

    Why DATA and not FILE, for every source (text files, TSV, TFDS): the pipeline
    shuffles with the run's seed and batches by length buckets, so a global batch is a
    function of the whole (sub)set of examples. Under DATA every worker builds the same
    global batches and keeps its own slice of each (worker `i` of `n` takes the `i`-th
    part), so

    - the examples of different workers are disjoint and together are exactly one epoch;
    - every worker runs the same number of steps (FILE sharding would batch each
      worker's files separately: with length bucketing the workers' batch counts differ
      and the one with more batches waits forever in an all-reduce);
    - the updates equal those of one process on the same global batches (the loss is a
      global token mean), which the tests check.

    FILE would also fail outright with fewer files than workers, the usual case for a
    translation corpus (Multi30K's train split is one TFDS file; a parallel corpus is one
    pair of text files). The price is that every worker reads and tokenizes all the
    data, which is cheap next to training a Transformer on it.

    Args:
        dataset: a `tf.data.Dataset` (the final, batched training or validation data).

    Returns:
        The dataset with the option set.
    """
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)


def fix_keras_multi_worker_logs():
    """Makes Keras 3's `fit` log scalar metrics under `MultiWorkerMirroredStrategy`.

    Keras (3.15) reduces every per-replica output of a train or test step with
    `strategy.reduce("MEAN", value, axis=0)` when the strategy is multi-worker; the logs are
    scalars, which have no axis 0, so the first step fails ("Invalid reduction dimension 0
    for input with 0 dimensions"). This wraps Keras' `reduce_per_replica` to reduce scalars
    with `axis=None` (the mean over replicas) and leaves everything else to Keras. Applied
    once, when the strategy is created.
    """
    from keras.src.backend.tensorflow import trainer as keras_tf_trainer

    original = keras_tf_trainer.reduce_per_replica
    if getattr(original, "_keras_transformer_fix", False):
        return

    def reduce_per_replica(values, strategy, reduction="auto"):
        if reduction == "auto" and keras_tf_trainer._collective_all_reduce_multi_worker(strategy):

            def reduce(value):
                if isinstance(value, (tf.distribute.DistributedValues, tf.Tensor)) and (
                    value.shape.rank == 0
                ):
                    return strategy.reduce("MEAN", value, axis=None)
                return original(value, strategy, reduction)

            return tf.nest.map_structure(reduce, values)
        return original(values, strategy, reduction)

    reduce_per_replica._keras_transformer_fix = True
    reduce_per_replica.__wrapped__ = original
    keras_tf_trainer.reduce_per_replica = reduce_per_replica


def check_strategy(name="auto", devices=None,
                   cluster_timeout_minutes=CLUSTER_TIMEOUT_MINUTES):
    """Refuses what `select_strategy` would refuse, without starting TensorFlow (a command
    checks before it writes anything): an unknown name, `devices` for another strategy, a
    bad timeout, a `TF_CONFIG` task that does not train or whose port is in use here, an
    address named twice, and a single-process strategy in a cluster.

    Args:
        name: string, a strategy name (see `select_strategy`).
        devices: list of device strings or `None`, the devices of `"mirrored"`.
        cluster_timeout_minutes: float or `None`, see `select_strategy`.

    Returns:
        int, the number of workers `TF_CONFIG` names (`num_workers_from_tf_config`).

    Raises:
        ValueError: saying which.
    """
    if name not in STRATEGY_NAMES:
        raise ValueError(
            f"Unknown strategy name {name!r}. Valid names: {', '.join(STRATEGY_NAMES)}."
        )
    check_cluster_timeout(cluster_timeout_minutes)
    if devices is not None and name != "mirrored":
        raise ValueError(f"`devices` is only used by 'mirrored'. Received: name={name!r}")
    workers = num_workers_from_tf_config()
    check_training_task()
    if name in ("auto", "multi_worker"):
        if workers > 1 or name == "multi_worker":
            check_own_port()
    elif workers > 1:
        raise ValueError(
            f"TF_CONFIG names a cluster of {workers} workers, but the "
            f"strategy {name!r} trains this process alone (each worker would train a run of "
            "its own, into the same directory): use 'auto' or 'multi_worker', or unset "
            "TF_CONFIG (and --workers) to train on one machine.")
    return workers


def select_strategy(name="auto", devices=None,
                    cluster_timeout_minutes=CLUSTER_TIMEOUT_MINUTES):
    """Returns the `tf.distribute.Strategy` named `name`, and logs which one it is.

    - `"auto"`: `MultiWorkerMirroredStrategy` when `TF_CONFIG` names a cluster of more
      than one worker; else `MirroredStrategy` when more than one GPU is visible; else the
      default (single-device) strategy.
    - `"default"`: the default strategy, `tf.distribute.get_strategy()` outside any scope.
    - `"mirrored"`: `MirroredStrategy` over `devices` if given; else over all visible
      GPUs; else over all logical CPU devices (a CPU split with
      `tf.config.set_logical_device_configuration`, useful for tests).
    - `"multi_worker"`: `MultiWorkerMirroredStrategy`, the cluster read from `TF_CONFIG`;
      its gradient all-reduce uses `RING` collectives on CPU-only machines (NCCL needs
      GPUs) and TensorFlow's choice otherwise.

    Call it at program start, before any other TensorFlow op: `MultiWorkerMirroredStrategy`
    configures the collective ops of the eager context, which fails once the context
    exists. This function itself looks only at *physical* devices for that reason.

    Build and compile the model inside `strategy.scope()`; `fit` then runs under it.

    Args:
        name: string, one of `"auto"`, `"default"`, `"mirrored"`, `"multi_worker"`.
            Defaults to `"auto"`.
        devices: list of device strings or `None`, the devices of `"mirrored"`.
            Defaults to `None`.
        cluster_timeout_minutes: float or `None`, how long a `"multi_worker"` worker waits
            for the others to connect before it exits with status 1 (`None` or 0: no
            limit); Ctrl-C stops the wait. Defaults to `CLUSTER_TIMEOUT_MINUTES` (30).

    Returns:
        A `tf.distribute.Strategy`.

    Raises:
        ValueError: on an unknown `name`, `devices` given for another strategy, a
            `TF_CONFIG` task that does not train (`check_training_task`) or whose port is
            in use on this machine (`check_own_port`), an address named twice, or
            `"default"` / `"mirrored"` where `TF_CONFIG` names several workers
            (`check_strategy`).

    Example:

    >>> strategy = select_strategy("default")
    >>> strategy.num_replicas_in_sync
    1
    """
    num_workers = check_strategy(name, devices, cluster_timeout_minutes)
    if name == "auto":
        # Physical, not logical: listing logical devices would initialize the context
        # before MultiWorkerMirroredStrategy can configure it.
        num_gpus = len(tf.config.list_physical_devices("GPU"))
        if num_workers > 1:
            name = "multi_worker"
        elif num_gpus > 1:
            name = "mirrored"
        else:
            name = "default"
        logger.info(
            "Strategy 'auto' -> %r (TF_CONFIG workers: %d, GPUs: %d).",
            name,
            num_workers,
            num_gpus,
        )

    if name == "default":
        strategy = tf.distribute.get_strategy()
    elif name == "multi_worker":
        implementation = (
            tf.distribute.experimental.CommunicationImplementation.AUTO
            if tf.config.list_physical_devices("GPU")
            else tf.distribute.experimental.CommunicationImplementation.RING
        )
        strategy = _wait_for_the_cluster(lambda: tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=implementation
            )
        ), cluster_timeout_minutes)
        if own := _own_address(os.environ.get("TF_CONFIG", "")):
            _OWN_SERVER_PORTS.add(own[3])
        fix_keras_multi_worker_logs()
    else:
        if devices is None:
            devices = [d.name for d in tf.config.list_logical_devices("GPU")] or [
                d.name for d in tf.config.list_logical_devices("CPU")
            ]
        strategy = tf.distribute.MirroredStrategy(devices)
    logger.info(
        "Training under %s with %d replica(s) in sync.",
        type(strategy).__name__,
        strategy.num_replicas_in_sync,
    )
    return strategy

"""Choosing the `tf.distribute` strategy a run trains under."""

import json
import logging
import os

import tensorflow as tf

logger = logging.getLogger(__name__)

STRATEGY_NAMES = ("auto", "default", "mirrored", "multi_worker")


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
    if tf_config is None:
        tf_config = os.environ.get("TF_CONFIG", "")
    if not tf_config.strip():
        return 0
    try:
        cluster = json.loads(tf_config).get("cluster", {})
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON: {error}. Received: {tf_config!r}")
    return len(cluster.get("chief", [])) + len(cluster.get("worker", []))


def select_strategy(name="auto", devices=None):
    """Returns the `tf.distribute.Strategy` named `name`, and logs which one it is.

    - `"auto"`: `MultiWorkerMirroredStrategy` when `TF_CONFIG` names a cluster of more
      than one worker; else `MirroredStrategy` when more than one GPU is visible; else the
      default (single-device) strategy.
    - `"default"`: the default strategy, `tf.distribute.get_strategy()` outside any scope.
    - `"mirrored"`: `MirroredStrategy` over `devices` if given; else over all visible
      GPUs; else over all logical CPU devices (a CPU split with
      `tf.config.set_logical_device_configuration`, useful for tests).
    - `"multi_worker"`: `MultiWorkerMirroredStrategy`, the cluster read from `TF_CONFIG`.

    Build and compile the model inside `strategy.scope()`; `fit` then runs under it.

    Args:
        name: string, one of `"auto"`, `"default"`, `"mirrored"`, `"multi_worker"`.
            Defaults to `"auto"`.
        devices: list of device strings or `None`, the devices of `"mirrored"`.
            Defaults to `None`.

    Returns:
        A `tf.distribute.Strategy`.

    Raises:
        ValueError: on an unknown `name`, or `devices` given for another strategy.

    Example:

    >>> strategy = select_strategy("default")
    >>> strategy.num_replicas_in_sync
    1
    """
    if name not in STRATEGY_NAMES:
        raise ValueError(
            f"Unknown strategy name {name!r}. Valid names: {', '.join(STRATEGY_NAMES)}."
        )
    if devices is not None and name != "mirrored":
        raise ValueError(f"`devices` is only used by 'mirrored'. Received: name={name!r}")
    if name == "auto":
        num_workers = num_workers_from_tf_config()
        num_gpus = len(tf.config.list_logical_devices("GPU"))
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
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
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

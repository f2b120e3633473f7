"""select_strategy: names, errors and TF_CONFIG parsing (no cluster is ever started)."""

import json

import pytest
import tensorflow as tf

from keras_transformer.training import strategy as strategy_module
from keras_transformer.training.launcher import free_ports
from keras_transformer.training.strategy import num_workers_from_tf_config, select_strategy


def _tf_config(num_workers, chief=False):
    port = free_ports(1)[0]  # this task's port is probed: one nothing listens on
    cluster = {"worker": [f"host{i}:{port}" for i in range(num_workers)]}
    if chief:
        cluster["chief"] = [f"chief:{port}"]
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})


class _FakeMultiWorker:
    """Stands in for MultiWorkerMirroredStrategy, which would try to reach the cluster."""

    num_replicas_in_sync = 4

    def __init__(self, communication_options=None):
        self.communication_options = communication_options


@pytest.fixture
def fake_multi_worker(monkeypatch):
    monkeypatch.setattr(
        strategy_module.tf.distribute, "MultiWorkerMirroredStrategy", _FakeMultiWorker
    )
    monkeypatch.setattr(strategy_module, "_OWN_SERVER_PORTS", set())  # no server started


def test_default_strategy(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert select_strategy("default") is tf.distribute.get_strategy()


def test_auto_without_cluster_or_gpus_is_default(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", _tf_config(1))
    chosen = select_strategy("auto")
    assert chosen is tf.distribute.get_strategy()
    assert chosen.num_replicas_in_sync == 1


def test_auto_with_multi_worker_tf_config(monkeypatch, fake_multi_worker):
    monkeypatch.setenv("TF_CONFIG", _tf_config(1, chief=True))
    assert isinstance(select_strategy("auto"), _FakeMultiWorker)


def test_multi_worker_by_name(fake_multi_worker):
    assert isinstance(select_strategy("multi_worker"), _FakeMultiWorker)


def test_mirrored_over_given_devices():
    chosen = select_strategy("mirrored", devices=["/cpu:0"])
    assert isinstance(chosen, tf.distribute.MirroredStrategy)
    assert chosen.num_replicas_in_sync == 1


@pytest.mark.parametrize(
    "tf_config, expected",
    [("", 0), ("{}", 0), (_tf_config(3), 3), (_tf_config(2, chief=True), 3)],
    ids=["unset", "no_cluster", "three_workers", "chief_and_two_workers"],
)
def test_num_workers_from_tf_config(tf_config, expected):
    assert num_workers_from_tf_config(tf_config) == expected


def test_invalid_tf_config_raises(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ValueError, match="TF_CONFIG"):
        select_strategy("auto")


def test_unknown_name_raises_listing_valid_names():
    with pytest.raises(ValueError, match="'tpu'.*auto, default, mirrored, multi_worker"):
        select_strategy("tpu")


@pytest.mark.parametrize("task_type", ["evaluator", "ps"])
@pytest.mark.parametrize("num_workers", [1, 2])
def test_a_task_that_does_not_train_is_refused(monkeypatch, task_type, num_workers):
    # A cluster manager (a TFJob with an Evaluator replica) starts the same command in every
    # task: an evaluator took worker 0's directory (or, beside one worker, acted as the
    # chief and trained alone into the run directory).
    tf_config = json.dumps({"cluster": {"worker": [f"h{i}:1" for i in range(num_workers)],
                                        task_type: ["e:1"]},
                            "task": {"type": task_type, "index": 0}})
    with pytest.raises(ValueError, match=f"task type '{task_type}'.*chief.*worker"):
        strategy_module.task_from_tf_config(tf_config)
    monkeypatch.setenv("TF_CONFIG", tf_config)
    with pytest.raises(ValueError, match=f"task type '{task_type}'"):
        select_strategy("auto")


def test_a_task_index_outside_its_cluster_list_is_refused():
    tf_config = json.dumps({"cluster": {"worker": ["h0:1", "h1:1"]},
                            "task": {"type": "worker", "index": 2}})
    with pytest.raises(ValueError, match=r"index 2.*2 'worker' tasks"):
        strategy_module.task_from_tf_config(tf_config)


@pytest.mark.parametrize("name", ["default", "mirrored"])
def test_a_single_process_strategy_in_a_cluster_is_refused(monkeypatch, name):
    # `train --strategy default --workers A,B --worker-index 1` trained alone into the
    # chief's run directory and exited 0: on N machines, N runs each reporting success.
    monkeypatch.setenv("TF_CONFIG", _tf_config(2))
    with pytest.raises(ValueError, match=rf"2 workers.*'{name}'.*'auto' or 'multi_worker'"):
        select_strategy(name)


def test_a_strategy_passed_to_train_gets_the_multi_worker_logs_fix(monkeypatch, tmp_path):
    # A user's own `MultiWorkerMirroredStrategy()` passed to `train` failed at the first step
    # ("Invalid reduction dimension 0 for input with 0 dimensions"): the fix of Keras'
    # scalar logs was applied only to strategies `select_strategy` made.
    from keras.src.backend.tensorflow import trainer as keras_tf_trainer

    from keras_transformer.training import get_preset, trainer

    unfixed = getattr(keras_tf_trainer.reduce_per_replica, "__wrapped__",
                      keras_tf_trainer.reduce_per_replica)
    monkeypatch.setattr(keras_tf_trainer, "reduce_per_replica", unfixed)

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(trainer, "worker_write_dir", stop)  # the run itself is not needed
    with pytest.raises(Stop):
        trainer.train(get_preset("tiny"), tmp_path, strategy=tf.distribute.get_strategy())
    assert getattr(keras_tf_trainer.reduce_per_replica, "_keras_transformer_fix", False)


def test_a_cluster_naming_an_address_twice_is_refused(monkeypatch, fake_multi_worker):
    # `--workers 127.0.0.1:5000,127.0.0.1:5000`: the second worker could not start its
    # server ("Could not start gRPC server", told to resume), the first waited for it for
    # the whole cluster timeout (30 minutes).
    with pytest.raises(ValueError, match=r"h:1 twice"):
        strategy_module.make_tf_config(["h:1", "h:2", "h:1"], 0)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["h:1", "h:1"]},
                                                "task": {"type": "worker", "index": 0}}))
    with pytest.raises(ValueError, match=r"h:1 twice"):
        select_strategy("auto")


def test_a_port_in_use_on_this_machine_is_refused_before_connecting(monkeypatch,
                                                                     fake_multi_worker):
    import socket

    with socket.socket() as busy, socket.socket() as other:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        other.bind(("127.0.0.1", 0))  # bound, not listening: free once closed
        port, free = busy.getsockname()[1], other.getsockname()[1]
        other.close()
        workers = [f"127.0.0.1:{free}", f"127.0.0.1:{port}"]
        monkeypatch.setenv("TF_CONFIG", strategy_module.make_tf_config(workers, 1))
        for name in ("auto", "multi_worker"):
            with pytest.raises(ValueError, match=rf"Port {port} .*127.0.0.1:{port} \(worker "
                                                 r"1 of the cluster\) is in use"):
                select_strategy(name)
        # Only this task's own port is this machine's to check.
        monkeypatch.setenv("TF_CONFIG", strategy_module.make_tf_config(workers, 0))
        assert isinstance(select_strategy("auto"), _FakeMultiWorker)

"""Workers of a cluster agree on the run before training: the same settings, the same data
and a common epoch to resume after (`trainer.agree_with_workers`; the gathering across
workers is replaced here by each worker's row, as `gather_from_workers` returns them)."""

import json

import pytest

from keras_transformer.data.preparation import DataReport
from keras_transformer.training import get_preset
from keras_transformer.training import trainer

CONFIG = get_preset("tiny")


def _report(kept=10, digest="abc"):
    counts = {"origin": "train.fr", "read": 10, "kept": kept}
    return DataReport(source={}, splits={"train": counts}, batches={"train": 2},
                      fingerprint={}, digests={"train.fr": digest})


def _backup(directory, epoch, previous=None):
    directory = directory / "backup"
    directory.mkdir(parents=True)
    record = {"epoch": epoch, "batch": 0, "weights": f"epoch-{epoch}.weights.h5",
              "previous": None if previous is None else {
                  "epoch": previous, "weights": f"epoch-{previous}.weights.h5"}}
    (directory / "training_metadata.json").write_text(json.dumps(record))


@pytest.fixture
def cluster(monkeypatch):
    """`rows(others)`: the agreement of this worker (worker 0) with workers whose rows
    `agree_with_workers` would gather are computed from `others` (config, report, dir)."""
    monkeypatch.setattr(trainer, "task_of", lambda strategy: ("worker", 0))
    others = []

    def gather(strategy, values):
        rows = [list(values)]
        for other in others:
            if other == "failed":  # a worker that stopped before the agreement
                rows.append([1, 0, 0, 0, -1, -1])
                continue
            config, report, directory, *vocabulary = other
            captured = {}
            monkeypatch.setattr(trainer, "gather_from_workers",
                                lambda s, v: captured.setdefault("row", list(v)) and [v])
            trainer.agree_with_workers(None, config, report, 0, directory,
                                       vocabulary=vocabulary[0] if vocabulary else ())
            rows.append(captured["row"])
            monkeypatch.setattr(trainer, "gather_from_workers", gather)
        return rows

    monkeypatch.setattr(trainer, "gather_from_workers", gather)
    return others


def test_workers_with_other_settings_or_data_are_refused(cluster, tmp_path):
    cluster.append((CONFIG.replace(seed=7), _report(), tmp_path))
    with pytest.raises(ValueError, match="worker 1 train with other settings") as error:
        trainer.agree_with_workers(None, CONFIG, _report(), 0, tmp_path)
    # The message names the setting among a few (it named none: `--epochs` given on one
    # machine only, or a YAML edited on one, left the user guessing).
    named = str(error.value).split("differ are among: ")[1].split(")")[0].split(", ")
    assert "seed" in named and len(named) <= 6, named
    cluster[:] = [(CONFIG, _report(digest="other"), tmp_path)]
    with pytest.raises(ValueError, match="worker 1 train with other data"):
        trainer.agree_with_workers(None, CONFIG, _report(), 0, tmp_path)
    # The same data read from another path on that machine is the same data.
    moved = _report()
    moved.splits["train"]["origin"] = "/elsewhere/train.fr"
    cluster[:] = [(CONFIG, moved, tmp_path)]
    assert trainer.agree_with_workers(None, CONFIG, _report(), 0, tmp_path) == 0
    # A report counted since the truncation count exists (`truncated`: 0 when pairs are
    # dropped, the count when cut) agrees with one reused from before, without the field.
    recounted = _report()
    recounted.splits["train"]["truncated"] = 0
    cluster[:] = [(CONFIG, recounted, tmp_path)]
    assert trainer.agree_with_workers(None, CONFIG, _report(), 0, tmp_path) == 0


def test_a_cluster_with_a_chief_task_names_workers_by_their_task(cluster, tmp_path,
                                                                  monkeypatch):
    # With a `chief` task (a TFJob with a Chief replica) the messages numbered workers by
    # replica: pod worker-0 was "worker 1", and its backup "RUN/workertemp_1".
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"chief": ["c:1"], "worker": ["w:1"]}, "task": {"type": "chief",
                                                                   "index": 0}}))
    cluster.append((CONFIG.replace(seed=7), _report(), tmp_path))
    with pytest.raises(ValueError, match="worker 0 train with other settings .* than the chief"):
        trainer.agree_with_workers(None, CONFIG, _report(), 0, tmp_path)


def test_workers_with_other_vocabularies_are_refused(cluster, tmp_path):
    # Each worker trains its own vocabulary (its own tokenizer/ directory); one that kept
    # an old one (say, trained again on changed files where another did not) trained
    # other token ids in lockstep with the same counts.
    cluster.append((CONFIG, _report(), tmp_path, ["old-vocabulary"]))
    with pytest.raises(ValueError, match="worker 1 train with other data.*vocabulary"):
        trainer.agree_with_workers(None, CONFIG, _report(), 0, tmp_path,
                                   vocabulary=["new-vocabulary"])
    cluster[:] = [(CONFIG, _report(), tmp_path, ["new-vocabulary"])]
    assert trainer.agree_with_workers(None, CONFIG, _report(), 0, tmp_path,
                                      vocabulary=["new-vocabulary"]) == 0


def test_workers_whose_auto_precision_differs_are_refused(cluster, tmp_path, monkeypatch):
    # `precision="auto"` (the multi30k preset's) resolves from each worker's own CPU: on a
    # cluster of mixed machines worker 0 trained in mixed_bfloat16 and worker 1 in float32,
    # in lockstep, with no word (the settings compared were the unresolved ones).
    config = CONFIG.replace(precision="auto")
    machines = iter(["mixed_bfloat16", None])  # worker 0's CPU, then worker 1's
    monkeypatch.setattr(trainer, "resolve_precision", lambda precision: next(machines))
    cluster.append((config, _report(), tmp_path / "w1"))
    with pytest.raises(ValueError, match=r"worker 1 train with other settings.*'auto'.*"
                                         r"precision"):
        trainer.agree_with_workers(None, config, _report(), 0, tmp_path)


def test_backups_an_epoch_apart_resume_after_the_earlier_one(cluster, tmp_path):
    # Worker 1 was killed after worker 0 had backed up epoch 3 and before its own backup.
    _backup(tmp_path / "w0", 3, previous=2)
    _backup(tmp_path / "w1", 2, previous=1)
    cluster.append((CONFIG, _report(), tmp_path / "w1"))
    assert trainer.agree_with_workers(None, CONFIG, _report(), 3, tmp_path / "w0") == 2


def test_a_worker_killed_before_its_first_backup_starts_the_run_again(cluster, tmp_path):
    # Worker 1 died after worker 0's backup of epoch 1, before its own: no common backup,
    # but both hold the seeded weights of epoch 0.
    _backup(tmp_path / "w0", 1)
    (tmp_path / "w1").mkdir()
    cluster.append((CONFIG, _report(), tmp_path / "w1"))
    assert trainer.agree_with_workers(None, CONFIG, _report(), 1, tmp_path / "w0") == 0


def test_a_worker_that_lost_its_backup_is_refused_with_what_to_do(cluster, tmp_path):
    # Also what a run resumed on more workers than it started with meets: the new worker
    # holds no backup. The message said only that the worker "lost the run's backup".
    _backup(tmp_path / "w0", 3, previous=2)
    (tmp_path / "w1").mkdir()
    cluster.append((CONFIG, _report(), tmp_path / "w1"))
    with pytest.raises(ValueError, match=r"worker 0: \[3, 2, 0\]; worker 1: \[0\]\): worker 1 "
                                         r"holds no backup of epoch 3 or 2 \(lost with a disk, "
                                         r"or never written: a worker that did not train this run "
                                         r"before, as on resuming with more workers than it "
                                         r"started with, or one killed before it wrote that "
                                         r"epoch's\)\..*RUN/workertemp_i/backup"):
        trainer.agree_with_workers(None, CONFIG, _report(), 3, tmp_path / "w0")


def test_a_worker_that_failed_before_the_agreement_stops_the_others(cluster, tmp_path):
    # A refusal on one worker only (the chief's check of its run's config.json) left the
    # others waiting in the collective until TensorFlow's health check, minutes later.
    cluster.append("failed")
    with pytest.raises(ValueError, match="worker 1 stopped before training"):
        trainer.agree_with_workers(None, CONFIG, _report(), 0, tmp_path)
    cluster.clear()
    with pytest.raises(KeyError, match="its own"):  # the failing worker raises its own error
        trainer.agree_with_workers(None, CONFIG, None, 0, tmp_path, failure=KeyError("its own"))


def test_a_run_killed_after_its_final_save_is_finished(tmp_path):
    # Killed between model.keras and the backup's removal: resuming from the backup trained
    # nothing while the other workers, finding the run finished, left.
    import os

    _backup(tmp_path, 3)
    record = tmp_path / "backup" / "training_metadata.json"
    (tmp_path / "model.keras").write_bytes(b"model")
    assert trainer._finished_after_backup(tmp_path)
    later = (tmp_path / "model.keras").stat().st_mtime_ns + 10**9
    os.utime(record, ns=(later, later))  # a backup of a continued run, after the old model
    assert not trainer._finished_after_backup(tmp_path)


def test_a_worker_finds_the_chiefs_final_model_newer_than_its_backup(tmp_path):
    # The chief killed after its final save, before the workers' barrier: worker 1 kept its
    # backup, and never writes a model.keras of its own. Started again, it resumed from the
    # backup (into a barrier the finished chief never reached) instead of finding the run
    # finished in the chief's directory.
    import keras

    from keras_transformer.training.callbacks import FinalModelSaver, RunHistory

    worker = tmp_path / "workertemp_1"
    _backup(worker, 3)
    assert not trainer._finished_after_backup(worker, tmp_path)  # no final model yet
    saver = FinalModelSaver(tmp_path / "model.keras", run_history=RunHistory(
        tmp_path / "history.json", initial={"epoch_seconds": [1.0] * 3}))
    saver.set_model(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))
    saver.on_train_end()
    assert trainer._finished_after_backup(worker, tmp_path)
    assert not trainer._finished_after_backup(worker)  # its own directory alone


def test_a_copied_run_tells_its_final_model_from_its_backup_by_epoch(tmp_path):
    # A copy that does not keep file times (`cp -r`, rsync without -t) can make the old
    # model.keras of a continued run look newer than its backup: the backup was deleted
    # and its epochs lost. The final model's record says which epoch it holds.
    import os

    import keras

    from keras_transformer.training.callbacks import FinalModelSaver, RunHistory

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    saver = FinalModelSaver(tmp_path / "model.keras", run_history=RunHistory(
        tmp_path / "history.json", initial={"epoch_seconds": [1.0] * 3}))
    saver.set_model(model)
    saver.on_train_end()  # a run finished after 3 epochs
    _backup(tmp_path, 4)  # continued, and killed after epoch 4's backup
    record = tmp_path / "backup" / "training_metadata.json"
    later = record.stat().st_mtime_ns + 10**9
    os.utime(tmp_path / "model.keras", ns=(later, later))  # the copy's times
    assert not trainer._finished_after_backup(tmp_path)

    # Killed between the final save of epoch 4 and the backup's removal: finished, whatever
    # the times say.
    saver.run_history.epoch_seconds.append(1.0)
    saver.on_train_end()
    earlier = record.stat().st_mtime_ns - 10**9
    os.utime(tmp_path / "model.keras", ns=(earlier, earlier))
    assert trainer._finished_after_backup(tmp_path)

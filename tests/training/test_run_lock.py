"""One training process per run directory: a second `train` into it stops at once."""

import fcntl
import os

import pytest

from keras_transformer.cli import main
from keras_transformer.training import get_preset
from keras_transformer.training.trainer import RunInUseError, hold_run_directory, train


@pytest.fixture
def held(tmp_path):
    """`tmp_path / "run"` locked as another process's training would hold it."""
    run = tmp_path / "run"
    run.mkdir()
    descriptor = os.open(run, os.O_RDONLY)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    yield run
    os.close(descriptor)


def test_train_into_a_directory_another_process_trains_into_is_refused(held):
    with pytest.raises(RunInUseError, match=f"Another process is training into {held}"):
        train(get_preset("tiny"), held, strategy="default")
    assert list(held.iterdir()) == []  # nothing written, not even config.json


def test_overwrite_of_a_run_in_use_deletes_nothing(held, capsys):
    # `--overwrite` of a run another process is training would delete its files under it.
    (held / "config.json").write_text("{}")
    (held / "checkpoints").mkdir()
    with pytest.raises(SystemExit) as raised:
        main(["train", "--preset", "tiny", "--output", str(held), "--overwrite"])
    assert "Another process is training into" in str(raised.value)
    assert sorted(p.name for p in held.iterdir()) == ["checkpoints", "config.json"]


def test_the_lock_is_released_and_can_be_taken_again_in_one_process(tmp_path):
    run = tmp_path / "run"
    with hold_run_directory(run):
        with hold_run_directory(run):  # the CLI holds it around `train`, which takes it too
            pass
        # Still held by the outer block: another open file description cannot take it.
        descriptor = os.open(run, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(descriptor)
    descriptor = os.open(run, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released
    finally:
        os.close(descriptor)
    assert list(run.iterdir()) == []  # the lock leaves no file behind

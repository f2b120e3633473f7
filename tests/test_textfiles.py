"""`keras_transformer.textfiles`: the atomic writes' partial files."""

import os
import subprocess
import sys

import pytest

from keras_transformer import textfiles


def _dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_an_atomic_write_replaces_the_file_whole_and_leaves_no_partial_file(tmp_path):
    path = tmp_path / "vocab.model"
    path.write_bytes(b"old")
    textfiles.write_bytes_atomically(path, b"new")
    assert path.read_bytes() == b"new" and os.listdir(tmp_path) == ["vocab.model"]
    with pytest.raises(TypeError):
        textfiles.write_bytes_atomically(path, "not bytes")
    assert path.read_bytes() == b"new" and os.listdir(tmp_path) == ["vocab.model"]
    assert textfiles.partial_path(path) == tmp_path / f".partial-{os.getpid()}-vocab.model"


def _record_fsyncs(monkeypatch):
    """`os.fsync` recording, in order, what each call flushed (a path)."""
    synced, real = [], os.fsync

    def recording(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    return synced


def test_an_atomic_write_reaches_the_disk_before_it_is_named(tmp_path, monkeypatch):
    # Renamed into place but never flushed: after a power loss or a hard stop of the machine
    # (not a killed process) the new name could hold an empty or truncated file, which a
    # resumed run then trusted. The content is flushed before the rename, and the rename
    # (the directory) after it.
    synced = _record_fsyncs(monkeypatch)
    path = tmp_path / "model.keras"
    textfiles.write_bytes_atomically(path, b"weights")
    assert synced == [str(textfiles.partial_path(path)), str(tmp_path)]


def test_a_backup_is_on_the_disk_before_its_record_names_it(tmp_path, monkeypatch):
    import keras

    from keras_transformer.training.callbacks import AtomicBackupAndRestore

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    backup = AtomicBackupAndRestore(str(tmp_path / "backup"))
    backup.set_model(model)
    backup._current_epoch, backup._last_batch_seen = 1, 0
    synced = _record_fsyncs(monkeypatch)
    backup._save_model()
    weights = str(tmp_path / "backup" / "backup-000001.weights.h5")
    assert weights in synced
    record = [i for i, path in enumerate(synced) if "training_metadata.json" in path]
    assert record and synced.index(weights) < record[0]


def test_partial_files_of_processes_no_longer_running_are_removed(tmp_path):
    # A kill -9 during a write left `.partial-PID-name` (a model: tens of MB) for ever.
    dead = tmp_path / f".partial-{_dead_pid()}-model.keras"
    dead.write_bytes(b"half a model")
    dead_directory = tmp_path / f".partial-{_dead_pid()}-1"  # a directory written whole
    (dead_directory / "variables").mkdir(parents=True)
    alive = textfiles.partial_path(tmp_path / "config.json")  # this process: writing it
    alive.write_bytes(b"{")
    others = [tmp_path / "model.keras", tmp_path / ".partial-x-y", tmp_path / ".hidden"]
    for other in others:
        other.write_bytes(b"kept")
    assert sorted(textfiles.remove_stale_partials(tmp_path)) == sorted([dead, dead_directory])
    assert sorted(tmp_path.iterdir()) == sorted([alive, *others])
    assert textfiles.remove_stale_partials(tmp_path / "missing") == []
    # A run starting writes nothing yet: its own process id's files are stale too (in a
    # container every start may get the same id).
    assert textfiles.remove_stale_partials(tmp_path, keep_own=False) == [alive]


def test_the_advice_on_a_file_not_in_utf8_does_not_assume_latin1():
    # The message said `iconv -f latin1 -t utf-8` for every file: a Russian file in cp1251
    # converted that way became fluent-looking mojibake ("Íàø ñîñåä") that trained silently.
    from keras_transformer.textfiles import decode_utf8

    with pytest.raises(ValueError) as error:
        decode_utf8("Наш сосед".encode("cp1251"), "train.ru:1")
    message = str(error.value)
    assert "train.ru:1: invalid UTF-8" in message
    assert "latin1" not in message
    assert "file -i" in message and "iconv -f ENCODING -t utf-8" in message


@pytest.mark.parametrize("data, refused", [
    (b"un\rdeux\rtrois\r", True),  # classic Mac OS: the whole file is one line
    (b"un\rdeux\rtrois\n", True),
    (b"un\rdeux\rtrois", True),
    (b"un\r\ndeux\r\n", False),  # Windows
    (b"un\ndeux\n", False),
    (b"un\rdeux\n", False),  # one carriage return inside a sentence is only a character
    (b"un\rdeux", False),
    (b"un\rdeux\nfoo\rbar\nx\ry\n", False),  # a few, among more line ends
])
def test_carriage_return_line_endings_are_refused_with_how_to_convert(data, refused):
    if refused:
        with pytest.raises(ValueError, match=r"a.txt.*carriage return.*tr '\\r' '\\n'"):
            textfiles.check_line_endings(data, "a.txt")
        with pytest.raises(ValueError, match=r"gzip -dc a.txt.gz \| tr"):
            textfiles.check_line_endings(data, "a.txt.gz")
    else:
        textfiles.check_line_endings(data, "a.txt")


def test_a_sample_cut_inside_a_line_end_is_judged_on_its_whole_lines(tmp_path):
    # The first 64 KiB of a file of "abc\r\r\n" lines can end between a CR and its LF.
    for count in (10922, 10923, 20000):
        path = tmp_path / "a.txt"
        path.write_bytes(b"abc\r\r\n" * count)
        textfiles.check_line_endings(textfiles.line_endings_sample(path), "a.txt")

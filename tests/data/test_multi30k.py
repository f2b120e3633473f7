"""Tests of the Multi30K TFDS builder: local preparation, discovery, offline error."""

import gzip

import pytest

from keras_transformer.data import multi30k
from keras_transformer.data.multi30k import (
    ENV_VAR,
    Multi30k,
    Multi30kNotFoundError,
    find_local_multi30k,
    load_multi30k,
)


@pytest.fixture(scope="module")
def local_dir():
    path = find_local_multi30k()
    if path is None:
        pytest.skip("no local copy of Multi30K")
    return path


def _first_line(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.readline().rstrip("\n")


def _no_network(*args, **kwargs):
    pytest.fail("the network was used")


@pytest.fixture(scope="module")
def prepared_dir(tmp_path_factory, local_dir):
    import tensorflow_datasets as tfds

    data_dir = tmp_path_factory.mktemp("tfds")
    builder = Multi30k(config="en-de", data_dir=str(data_dir), local_dir=local_dir)
    # Preparation from the local copy needs neither the network probe nor a download.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(multi30k, "_network_available", _no_network)
        patch.setattr(tfds.download.DownloadManager, "download", _no_network)
        builder.download_and_prepare()
    return data_dir


def test_prepares_from_local_copy(prepared_dir, local_dir, monkeypatch):
    # Preparation is over and did not need the network (`prepared_dir`); loading must not.
    monkeypatch.setattr(multi30k, "_network_available", lambda: pytest.fail("network used"))
    builder = Multi30k(config="en-de", data_dir=str(prepared_dir))
    splits = builder.info.splits
    assert {name: splits[name].num_examples for name in splits} == {
        "train": 29000,
        "validation": 1014,
        "test_2016": 1000,
    }
    assert builder.info.features.keys() == {"en", "de"}
    for split, stem in [("train", "train"), ("val", "val"), ("test", "test_2016_flickr")]:
        first = next(iter(load_multi30k(split, data_dir=prepared_dir)))
        # File order is kept: the first example is the first line of both files.
        assert first["en"].numpy().decode() == _first_line(local_dir / f"{stem}.en.gz")
        assert first["de"].numpy().decode() == _first_line(local_dir / f"{stem}.de.gz")
    first_train = next(iter(load_multi30k("train", data_dir=prepared_dir)))
    assert first_train["en"].numpy() == b"Two young, White males are outside near many bushes."


def test_checksums_recorded_for_every_file():
    infos = Multi30k.url_infos
    # The builder's six En-De files are among the 22 of task 1 (every language, test set).
    expected = {
        multi30k._BASE_URL + name: name for name in multi30k._file_names()
    }
    assert expected.items() <= {url: info.filename for url, info in infos.items()}.items()
    assert len(infos) == 22
    assert infos[multi30k._BASE_URL + "train.en.gz"].size == 568929
    assert all(len(info.checksum) == 64 for info in infos.values())


def test_find_local_precedence(tmp_path, monkeypatch, local_dir):
    assert find_local_multi30k() is not None  # auto-discovered shared copy
    monkeypatch.setenv(ENV_VAR, str(local_dir))
    assert find_local_multi30k() == local_dir.resolve()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(Multi30kNotFoundError, match="lacks Multi30K files"):
        find_local_multi30k(empty)
    monkeypatch.setenv(ENV_VAR, str(empty))
    with pytest.raises(Multi30kNotFoundError, match=ENV_VAR):
        find_local_multi30k()


def test_offline_without_local_copy_raises_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setattr(multi30k, "_search_roots", lambda: [tmp_path])
    monkeypatch.setattr(multi30k, "_network_available", lambda: False)
    builder = Multi30k(config="en-de", data_dir=str(tmp_path / "tfds"))
    with pytest.raises(Multi30kNotFoundError) as info:
        builder.download_and_prepare()
    message = str(info.value)
    for hint in (ENV_VAR, "local_dir=", "manual_dir", "shared/data/multi30k"):
        assert hint in message


def test_downloads_when_online_and_no_local_copy(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setattr(multi30k, "_search_roots", lambda: [tmp_path])
    monkeypatch.setattr(multi30k, "_network_available", lambda: True)

    class FakeDownloadManager:
        manual_dir = None  # no manual directory
        requested = None

        def download(self, urls):
            FakeDownloadManager.requested = urls
            raise OSError("simulated network failure")

    builder = Multi30k(config="en-de", data_dir=str(tmp_path / "tfds"))
    with pytest.raises(Multi30kNotFoundError, match="simulated network failure"):
        builder._split_generators(FakeDownloadManager())
    assert FakeDownloadManager.requested == {
        name: multi30k._BASE_URL + name for name in multi30k._file_names()
    }


def test_manual_dir_is_used(tmp_path, monkeypatch, local_dir):
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setattr(multi30k, "_search_roots", lambda: [tmp_path])
    monkeypatch.setattr(multi30k, "_network_available", lambda: pytest.fail("network used"))

    class ManualDownloadManager:
        manual_dir = local_dir

    builder = Multi30k(config="en-de", data_dir=str(tmp_path / "tfds"))
    generators = builder._split_generators(ManualDownloadManager())
    key, example = next(iter(generators["validation"]))
    assert key == 0
    assert example["en"] == _first_line(local_dir / "val.en.gz")

"""The data sources: parallel files, TSV, TFDS (mocked), Multi30K in every language."""

import pytest

from keras_transformer.data import multi30k
from keras_transformer.data.multi30k import Multi30kNotFoundError, multi30k_split_files
from keras_transformer.data.sources import (
    FileSource,
    Multi30kSource,
    TfdsSource,
    language_from_path,
    open_source,
)

from tests.data.conftest import write_lines


def test_files_source_infers_languages_and_streams(toy_corpus):
    files = {"train": toy_corpus["gz"]["train"], "valid": toy_corpus["gz"]["val"],
             "toy_test": toy_corpus["gz"]["test"]}
    source = FileSource(files)
    assert (source.source_lang, source.target_lang) == ("fr", "en")
    assert source.splits() == ["train", "validation", "toy_test"]
    assert source.resolve("val") == "validation" and source.resolve("test") == "toy_test"
    assert list(source.pairs("test")) == toy_corpus["splits"]["test"]
    examples = list(source.dataset("train", limit=5).as_numpy_iterator())
    assert [(e["fr"].decode(), e["en"].decode()) for e in examples] == (
        toy_corpus["splits"]["train"][:5])
    with pytest.raises(ValueError, match="no split 'test_2099'"):
        source.resolve("test_2099")
    # The spec reopens the same source (what the run directory and the export record).
    assert list(open_source(**source.spec()).pairs("toy_test")) == toy_corpus["splits"]["test"]


def test_language_from_path():
    assert language_from_path("corpus/train.fr.gz") == "fr"
    assert language_from_path("news.pt_br") == "pt_br"
    assert language_from_path("train.txt") is None and language_from_path("train") is None


def test_files_named_with_one_suffix_are_told_to_name_their_languages(tmp_path):
    # `train.en.bpe` / `train.zh.bpe`: "two different codes, got 'bpe'", without saying
    # that the code was read from the file names, or what to do.
    source = write_lines(tmp_path / "train.en.bpe", ["a"])
    target = write_lines(tmp_path / "train.zh.bpe", ["b"])
    with pytest.raises(ValueError, match=r"file names end in 'bpe'.*--source-lang"):
        open_source("files", {"train": [source, target]})
    assert open_source("files", {"train": [source, target]}, "en", "zh").source_lang == "en"


def test_tsv_source_needs_languages(toy_corpus):
    with pytest.raises(ValueError, match="two different codes"):
        open_source("tsv", {"train": toy_corpus["tsv"]["train"]})
    source = open_source("tsv", {"train": toy_corpus["tsv"]["train"]}, "fr", "en")
    assert list(source.pairs("train")) == toy_corpus["splits"]["train"]


@pytest.mark.parametrize("source_lang,target_lang", [("fr", "en"), ("cs", "fr")])
def test_multi30k_any_direction_and_every_test_set(toy_corpus, source_lang, target_lang):
    source = Multi30kSource(source_lang, target_lang, local_dir=toy_corpus["multi30k"])
    source.check()
    expected_tests = ["test_2016_flickr", "test_2018_flickr"] if "cs" in (
        source_lang, target_lang) else list(multi30k.TEST_SETS)
    assert source.test_sets() == expected_tests
    sides = {"fr": 0, "en": 1, "cs": 1}
    for split in ["train", "val", *expected_tests]:
        pairs = list(source.pairs(split))
        stem = {"train": "train", "val": "val"}.get(split, "test")
        assert pairs == [(p[sides[source_lang]], p[sides[target_lang]])
                         for p in toy_corpus["splits"][stem]], split
    assert source.resolve("test_2018") == "test_2018_flickr"


def test_multi30k_has_no_czech_2017_test_sets():
    with pytest.raises(ValueError, match="no split 'test_2017_mscoco' for cs-en"):
        multi30k_split_files("cs", "en", "test_2017_mscoco")
    with pytest.raises(ValueError, match="languages"):
        multi30k_split_files("ja", "en", "train")


def test_multi30k_missing_files_offline_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv(multi30k.ENV_VAR, raising=False)
    monkeypatch.setenv(multi30k.CACHE_ENV_VAR, str(tmp_path / "cache"))
    monkeypatch.setattr(multi30k, "_search_roots", lambda: [tmp_path])
    monkeypatch.setattr(multi30k, "_network_available", lambda: False)
    source = Multi30kSource("fr", "en")
    with pytest.raises(Multi30kNotFoundError) as info:
        source.check(["train", "validation"])
    message = str(info.value)
    for name in ("train.fr.gz", "train.en.gz", "val.fr.gz", "val.en.gz"):
        assert name in message
    assert multi30k.ENV_VAR in message and multi30k._BASE_URL in message
    assert str(tmp_path / "cache") in message


def test_multi30k_download_is_verified(tmp_path, monkeypatch):
    monkeypatch.delenv(multi30k.ENV_VAR, raising=False)
    monkeypatch.setenv(multi30k.CACHE_ENV_VAR, str(tmp_path / "cache"))
    monkeypatch.setattr(multi30k, "_search_roots", lambda: [tmp_path])
    monkeypatch.setattr(multi30k, "_network_available", lambda: True)

    class Response:  # what urlopen returns: bytes that are not the published file
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self):
            return b"tampered"

    monkeypatch.setattr("urllib.request.urlopen", lambda url, timeout: Response())
    with pytest.raises(Multi30kNotFoundError, match="does not match checksums.tsv"):
        multi30k_split_files("fr", "en", "test_2017_mscoco")
    assert not list((tmp_path / "cache").glob("*.gz"))


def test_checksums_cover_every_task1_file():
    table = multi30k._read_checksums()
    expected = {f"{stem}.{lang}.gz" for stem in ("train", "val") for lang in multi30k.ALL_LANGUAGES}
    expected |= {f"{t}.{lang}.gz" for t, langs in multi30k.TEST_SETS.items() for lang in langs}
    assert set(table) == expected and len(expected) == 22
    assert table["train.en.gz"] == (
        568929, "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f")
    assert all(len(sha) == 64 and size > 0 for size, sha in table.values())


@pytest.fixture
def mocked_ted(tmp_path):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):
        yield str(tmp_path / "tfds")


def test_tfds_source_languages_from_supervised_keys(mocked_ted):
    source = open_source("tfds:ted_hrlr_translate/pt_to_en", tfds_dir=mocked_ted)
    assert isinstance(source, TfdsSource)
    assert (source.source_lang, source.target_lang) == ("pt", "en")
    assert source.splits() == ["train", "validation", "test"]
    assert source.spec()["data"] == "tfds:ted_hrlr_translate/pt_to_en"
    pairs = list(source.pairs("validation", keep_all=True))
    assert len(pairs) == 6 and all(isinstance(s, str) for pair in pairs for s in pair)
    # The other direction of the same dataset, and a key it does not have.
    reverse = open_source("tfds:ted_hrlr_translate/pt_to_en", source_lang="en",
                          target_lang="pt", tfds_dir=mocked_ted)
    assert list(reverse.pairs("test", keep_all=True)) == [
        (t, s) for s, t in source.pairs("test", keep_all=True)]
    with pytest.raises(ValueError, match=r"language keys \['en', 'pt'\], not 'de'"):
        open_source("tfds:ted_hrlr_translate/pt_to_en", "en", "de", tfds_dir=mocked_ted)


def test_a_config_of_files_takes_its_languages_from_the_names(toy_corpus):
    # The config's languages defaulted to Multi30K's en->de: a Python run on train.fr /
    # train.en trained, reported and exported as en->de (and scored BLEU for German).
    from keras_transformer.data.preparation import open_run_source
    from keras_transformer.training import get_preset

    files = {"train": toy_corpus["files"]["train"]}
    config = get_preset("tiny").replace(data="files", data_files=files)
    source = open_run_source(config)
    assert (source.source_lang, source.target_lang) == ("fr", "en")
    assert open_run_source(get_preset("tiny"), check=False).source_lang == "en"  # Multi30K
    swapped = config.replace(data_files={"train": files["train"][::-1]}, source_lang="fr",
                             target_lang="en")
    with pytest.raises(ValueError, match=r"named the other way round.*source file first"):
        open_run_source(swapped, check=False)


@pytest.mark.parametrize("split", ["validation", "news"])
def test_validation_and_test_files_named_the_other_way_round_are_refused(toy_corpus, split):
    # Only the train files were checked: dev.en dev.fr beside train.fr train.en scored a
    # fr->en model's validation BLEU (which picks best.keras) on en->fr pairs, and
    # `evaluate --split news` fed it English.
    files = toy_corpus["files"]
    source = FileSource({"train": files["train"], split: files["val"][::-1]})
    with pytest.raises(ValueError, match=rf"'{split}'.*other way round.*source file first"):
        source.check_directions()
    with pytest.raises(ValueError, match="other way round"):
        source.check_directions([split])
    source.check_directions(["train"])
    # Not when the source is opened: a run made before the check still resumes.
    FileSource({"train": files["train"], split: files["val"][::-1]}, "fr", "en")


def test_a_tfds_dataset_is_prepared_for_real(tmp_path):
    # tensorflow-datasets 4.9.10 imports importlib_resources while preparing a dataset but
    # declares it for Python < 3.9 only (tensorflow/datasets#11212): every real
    # `--data tfds:NAME` failed with "No module named 'importlib_resources'"; the mocked
    # tests above never prepare anything.
    import tensorflow_datasets as tfds

    class KtToyTranslation(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return self.dataset_info_from_configs(
                features=tfds.features.Translation(languages=("en", "fr")),
                supervised_keys=("fr", "en"))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(6),
                    "validation": self._generate_examples(3)}

        def _generate_examples(self, count):
            for i in range(count):
                yield i, {"en": f"the dog {i}", "fr": f"le chien {i}"}

    source = open_source("tfds:kt_toy_translation", tfds_dir=tmp_path)
    assert (source.source_lang, source.target_lang) == ("fr", "en")
    assert sorted(source.pairs("validation")) == [(f"le chien {i}", f"the dog {i}")
                                                   for i in range(3)]


def test_a_misspelled_tfds_name_is_refused_in_a_few_lines(tmp_path):
    # TFDS's error listed its whole catalogue (8,700 characters) into the cell or terminal,
    # its suggestion at the very end.
    with pytest.raises(ValueError) as error:
        open_source("tfds:ted_hrlr_translat/pt_to_en", tfds_dir=tmp_path)
    message = str(error.value)
    assert "ted_hrlr_translat" in message and "Did you mean" in message
    assert "ted_hrlr_translate" in message and len(message) < 600

"""Every data source through the real pipeline: `train` (one `model.fit` epoch of a tiny
model) and an export whose `translate` and `metadata` signatures run."""

import json
import os

import pytest
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the SentencePiece ops of the export)

from keras_transformer.export import DecodingConfig, Translator, export_translator
from keras_transformer.training import get_preset
from keras_transformer.training.trainer import train

# A tiny model: the point is the data path, not the translations.
TINY = dict(vocab_size=290, d_model=16, num_heads=2, ff_dim=32, num_layers=1, max_length=16,
            batch_size=32, tokens_per_batch=None, train_subset=None, steps_per_epoch=None,
            epochs=1, bleu_sentences=0, drop_long_pairs=True)


def _train_and_export(tmp_path, config, **train_kwargs):
    run = train(get_preset("tiny").replace(**{**TINY, **config}), tmp_path / "run",
                report_padding=False, verbose=0, **train_kwargs)
    source_lang, target_lang = run.config.source_lang, run.config.target_lang
    translator = Translator(
        run.model, run.source_tokenizer, run.target_tokenizer,
        DecodingConfig(search="greedy", max_input_length=16, max_output_length=16),
        metadata={"source_lang": source_lang, "target_lang": target_lang,
                  "data": run.config.data})
    path = export_translator(translator, tmp_path / "export")
    loaded = tf.saved_model.load(str(path))
    outputs = loaded.signatures["translate"](text=tf.constant(["le chat", ""]))
    assert outputs["translation"].shape == (2,)
    metadata = {k: v.numpy().decode() for k, v in loaded.signatures["metadata"]().items()}
    report = json.loads((tmp_path / "run" / "data_report.json").read_text())
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert len(run.history["loss"]) == 1
    return metadata, report, config


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["files_and_gz", "tsv"])
def test_files_gz_and_tsv(toy_corpus, tmp_path, kind):
    if kind == "tsv":
        data, train_files, other = "tsv", toy_corpus["tsv"], toy_corpus["tsv"]
    else:  # one run reads both kinds: .gz for training, plain files for the rest
        data, train_files, other = "files", toy_corpus["gz"], toy_corpus["files"]
    files = {"train": train_files["train"], "validation": other["val"],
             "toy_test": other["test"]}
    metadata, report, config = _train_and_export(
        tmp_path, dict(data=data, data_files=files, source_lang="fr", target_lang="en"))
    assert metadata == {"source_lang": "fr", "target_lang": "en", "data": data}
    assert config["data"] == data and config["data_files"]["toy_test"] == files["toy_test"]
    assert report["splits"]["train"]["read"] == 96
    assert report["splits"]["validation"]["read"] == 16


@pytest.mark.slow
@pytest.mark.parametrize("source_lang,target_lang", [("fr", "en"), ("cs", "fr")])
def test_multi30k_other_languages(toy_corpus, tmp_path, source_lang, target_lang):
    metadata, report, config = _train_and_export(
        tmp_path, dict(data="multi30k", source_lang=source_lang, target_lang=target_lang),
        local_dir=str(toy_corpus["multi30k"]))
    assert (metadata["source_lang"], metadata["target_lang"]) == (source_lang, target_lang)
    assert report["splits"]["train"]["origin"] == f"multi30k train {source_lang}->{target_lang}"
    assert (config["source_lang"], config["target_lang"]) == (source_lang, target_lang)


@pytest.mark.slow
def test_tfds_translation_dataset_mocked(tmp_path):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=40, policy=tfds.testing.MockPolicy.USE_CODE):
        metadata, report, config = _train_and_export(
            tmp_path, dict(data="tfds:ted_hrlr_translate/pt_to_en", source_lang=None,
                           target_lang=None, drop_long_pairs=False),
            data_dir=str(tmp_path / "tfds"))
    # The languages came from the dataset's supervised keys and were recorded.
    assert metadata == {"source_lang": "pt", "target_lang": "en",
                        "data": "tfds:ted_hrlr_translate/pt_to_en"}
    assert (config["source_lang"], config["target_lang"]) == ("pt", "en")
    assert report["splits"]["train"]["read"] == 40


@pytest.mark.slow
def test_a_vocabulary_is_trained_again_on_training_files_changed_before_any_epoch(
        tmp_path, capsys):
    # A first start stopped after its vocabulary (here on a bad byte in the validation file);
    # the user then replaced the training files and ran the same command again. The old
    # vocabulary, made from the old text, was reused without a word.
    from keras_transformer.data import DataError
    from tests.data.conftest import toy_pairs, write_bytes, write_lines

    pairs = toy_pairs(96, 0)
    cyrillic = str.maketrans("abcdefghiklmnoprstuxyz", "абцдефгхиклмнопрстухыз")
    greek = str.maketrans("abcdefghiklmnoprstuxyz", "αβψδεφγηικλμνοπρστυχυζ")
    train_fr, train_en = tmp_path / "train.fr", tmp_path / "train.en"
    write_lines(train_fr, [fr for fr, _ in pairs] * 2)
    write_lines(train_en, [en for _, en in pairs] + [en.translate(cyrillic) for _, en in pairs])
    val_fr, val_en = tmp_path / "val.fr", tmp_path / "val.en"
    write_lines(val_fr, [fr for fr, _ in pairs[:16]])
    write_bytes(val_en, b"a dog\n\xff\n" * 8)
    files = {"train": [str(train_fr), str(train_en)], "validation": [str(val_fr), str(val_en)]}
    config = get_preset("tiny").replace(**{**TINY, "vocab_size": 320, "data": "files", "data_files": files,
                                           "source_lang": "fr", "target_lang": "en"})
    run_dir = tmp_path / "run"
    with pytest.raises(DataError):
        train(config, run_dir, report_padding=False, verbose=0)
    vocabulary = run_dir / "tokenizer" / "tokenizer.model"
    first = vocabulary.read_bytes()

    # Only touched (the same bytes at a new time): the vocabulary is kept.
    os.utime(train_en, ns=(10**18, 10**18))
    capsys.readouterr()
    with pytest.raises(DataError):  # the validation file is still bad
        train(config, run_dir, report_padding=False, verbose=0)
    assert "trained again" not in capsys.readouterr().out
    assert vocabulary.read_bytes() == first

    # New sentences in a training file: trained again, and said so.
    write_lines(train_en, [en for _, en in pairs] + [en.translate(greek) for _, en in pairs])
    write_lines(val_en, [en.translate(greek) for _, en in pairs[:16]])
    run = train(config, run_dir, report_padding=False, verbose=0)
    out = capsys.readouterr().out
    assert "changed since it was trained on it" in out and "trained again" in out
    assert vocabulary.read_bytes() != first
    # Greek letters are pieces of the new vocabulary (in the old one, two byte pieces each).
    sentence = pairs[0][1].translate(greek)
    assert len(run.target_tokenizer.tokenize([sentence])[0]) <= len(sentence)

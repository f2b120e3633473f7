"""Tests of train_tokenizers / load_tokenizers: shared and separate vocabularies."""

import tensorflow as tf

from keras_transformer.text import load_tokenizers, train_tokenizers

from tests.text.conftest import read_lines


def _pairs():
    en, de = read_lines("train", "en")[::20], read_lines("train", "de")[::20]
    return tf.data.Dataset.from_tensor_slices({"en": en, "de": de})


def test_shared_vocabulary(tmp_path):
    source, target = train_tokenizers(_pairs(), "en", "de", vocab_size=800, output_dir=tmp_path)
    assert source is target
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.model"]
    # One vocabulary covers both languages without byte fallback for ordinary words.
    ids = source.tokenize(tf.constant(["Ein Hund läuft.", "A dog runs."]))
    assert source.detokenize(ids).numpy().tolist() == [b"Ein Hund l\xc3\xa4uft.", b"A dog runs."]
    reloaded_source, reloaded_target = load_tokenizers(tmp_path)
    assert reloaded_source is reloaded_target
    assert reloaded_source.tokenize(tf.constant(["Ein Hund"])).to_list() == (
        source.tokenize(tf.constant(["Ein Hund"])).to_list()
    )


def test_separate_vocabularies(tmp_path):
    en, de = read_lines("train", "en")[::20], read_lines("train", "de")[::20]
    source, target = train_tokenizers(
        list(zip(en, de)), "en", "de", vocab_size=700, shared=False, output_dir=tmp_path
    )
    assert source is not target
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source.model", "target.model"]
    # Trained on different languages, the two vocabularies split German differently.
    german = tf.constant(["Die Frauen unterhalten sich auf der Straße."])
    assert len(target.tokenize(german).to_list()[0]) < len(source.tokenize(german).to_list()[0])
    reloaded_source, reloaded_target = load_tokenizers(tmp_path)
    assert reloaded_source.tokenize(german).to_list() == source.tokenize(german).to_list()
    assert reloaded_target.tokenize(german).to_list() == target.tokenize(german).to_list()

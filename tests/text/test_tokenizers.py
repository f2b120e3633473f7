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


def test_reservoir_sample_is_bounded_uniform_and_deterministic():
    from keras_transformer.text.tokenizers import reservoir_sample

    assert reservoir_sample(range(5), 10) == [0, 1, 2, 3, 4]  # fewer items: all, in order
    sample = reservoir_sample(iter(range(100_000)), 1000, seed=3)
    assert len(sample) == 1000 and len(set(sample)) == 1000
    assert sample == reservoir_sample(iter(range(100_000)), 1000, seed=3)
    # Uniform: each tenth of the stream holds about a tenth of the sample.
    tenths = [sum(1 for x in sample if x // 10_000 == i) for i in range(10)]
    assert all(60 <= n <= 140 for n in tenths), tenths


def _record_sentencepiece_input(monkeypatch):
    """`{"sentences": [...]}`, filled with the lines `train_tokenizers` passes on to
    SentencePiece (training as usual)."""
    from keras_transformer.text import tokenizers

    seen = {}
    real = tokenizers.train_sentencepiece

    def recording(sentences, *args, **kwargs):
        seen["sentences"] = list(sentences)
        return real(sentences, *args, **kwargs)

    monkeypatch.setattr(tokenizers, "train_sentencepiece", recording)
    return seen


def test_train_tokenizers_reads_a_bounded_sample_of_a_stream(tmp_path, monkeypatch):
    seen = _record_sentencepiece_input(monkeypatch)
    words = ["dog", "cat", "runs", "the", "a", "red", "ball", "Hund", "Katze", "rennt"]
    # A generator: read once, never listed whole.
    stream = ((" ".join(words[(i + k) % 10] for k in range(5)), words[i % 10] * 3)
              for i in range(3000))
    train_tokenizers(stream, "en", "de", vocab_size=290, output_dir=tmp_path, max_pairs=500,
                     hard_vocab_limit=False)
    assert len(seen["sentences"]) == 1000  # 500 pairs, both sides of a shared vocabulary


def test_the_vocabulary_sample_is_bounded_in_characters_too(tmp_path, monkeypatch):
    # `max_pairs` bounded pairs, not text: SentencePiece's memory grows with the characters
    # (about 20 MiB of RSS per MiB of text), so a corpus of paragraph-long lines made the
    # 200,000-pair sample take many GiB. `max_chars` bounds the sample's text as well, by a
    # uniform subset of the pairs; a sample within it is passed on unchanged.
    seen = _record_sentencepiece_input(monkeypatch)
    words = ["dog", "cat", "runs", "the", "a", "red", "ball", "Hund", "Katze", "rennt"]
    pairs = [(" ".join(words[(i + k) % 10] for k in range(200)), words[i % 10] * 3)
             for i in range(400)]  # about 1,000 characters a pair
    chars = lambda: sum(len(line) for line in seen["sentences"])  # noqa: E731
    train_tokenizers(iter(pairs), "en", "de", vocab_size=300, output_dir=tmp_path / "a",
                     max_pairs=300, max_chars=50_000, hard_vocab_limit=False)
    assert 40_000 < chars() <= 50_000
    # Uniform over the stream: the cut has its own random numbers. Drawn from the sample's
    # own stream, it left out first the slots the sample had filled last (a corpus made
    # with `cat`: its last source).
    from keras_transformer.text.tokenizers import _split_pairs

    stream = [(f"{i:06d}" + "x" * 94, "y" * 100) for i in range(25_000)]
    sources, _ = _split_pairs(stream, "en", "de", max_pairs=20_000, seed=1234,
                              max_chars=2_000_000)
    late = sum(int(line[:6]) >= 20_000 for line in sources)
    assert len(sources) == 10_000 and 1800 < late < 2200, late  # a fifth of them: 2,000
    train_tokenizers(iter(pairs[:40]), "en", "de", vocab_size=300, output_dir=tmp_path / "b",
                     max_pairs=300, max_chars=50_000, hard_vocab_limit=False)
    assert seen["sentences"] == [p[0] for p in pairs[:40]] + [p[1] for p in pairs[:40]]


def test_a_target_vocabulary_that_fails_leaves_no_source_model(tmp_path):
    # With separate vocabularies the source model was written before the target's failed:
    # the run then held a tokenizer/ and a retry with the advised vocab_size was refused as
    # "trained with a different configuration".
    import random

    import pytest

    from keras_transformer.text import train_tokenizers

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnop") for _ in range(6)) for _ in range(400)]
    pairs = {"fr": [" ".join(rng.sample(words, 8)) for _ in range(300)],
             "en": ["a b c"] * 300}  # too few pieces for the vocabulary
    # The message names the side (one vocab_size serves both: the audit could not tell).
    with pytest.raises(ValueError, match=r"^The target \(en\) vocabulary.*vocab_size=300"):
        train_tokenizers(pairs, "fr", "en", vocab_size=300, shared=False,
                         output_dir=tmp_path / "tokenizer")
    assert not (tmp_path / "tokenizer").exists()


def test_a_vocabulary_trained_again_in_the_other_layout_replaces_the_first(tmp_path):
    # Shared, then separate into the same directory: `load_tokenizers` found the shared
    # `tokenizer.model` first and returned the old vocabulary; and the other way round.
    shared, _ = train_tokenizers(_pairs(), "en", "de", vocab_size=800, output_dir=tmp_path)
    source, target = train_tokenizers(_pairs(), "en", "de", vocab_size=600, shared=False,
                                      output_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source.model", "target.model"]
    loaded_source, loaded_target = load_tokenizers(tmp_path)
    assert loaded_source is not loaded_target and loaded_source.vocab_size == 600
    train_tokenizers(_pairs(), "en", "de", vocab_size=800, output_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.model"]
    assert load_tokenizers(tmp_path)[0].vocab_size == 800

"""SegmentationSampler: n-best segmentations drawn per seed (subword regularization)."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.text import normalize, train_sentencepiece
from keras_transformer.text import subword_sampling
from keras_transformer.text.subword_sampling import SegmentationSampler, _fingerprints
from keras_transformer.text.subword_tokenizer import SubwordTokenizer
from keras_transformer.text.special_tokens import END_ID, START_ID


@pytest.fixture(scope="module")
def sentences(train_sentences):
    # Real sentences of both languages, a repeated one, an empty one, invalid UTF-8.
    return train_sentences[:150] + train_sentences[-150:] + [
        train_sentences[0], "", "  Zwei  Hunde\tspielen. ", b"caf\xc3 au lait"]


def _rows(ragged):
    return [list(row) for row in ragged.to_list()]


def test_every_draw_is_the_sentence_and_a_sharp_draw_is_the_tokenizers(tokenizer, sentences):
    sampler = SegmentationSampler(tokenizer, sentences, nbest=8, alpha=0.0)
    assert sampler.num_sentences == len(sentences) - 1  # the repeated one is kept once
    assert sampler.num_candidates > 4 * sampler.num_sentences
    expected = normalize(list(sentences))
    for seed in ([0, 0], [5, 1]):
        ids = sampler.tokenizer(seed).tokenize(sentences)
        text = [t.decode("utf-8") for t in tokenizer.detokenize(ids).numpy()]
        assert text == expected

    best = _rows(tokenizer.tokenize(sentences))
    sharp = SegmentationSampler(tokenizer, sentences, nbest=8, alpha=1000.0)
    assert _rows(sharp.tokenizer([3, 4]).tokenize(sentences)) == best
    single = SegmentationSampler(tokenizer, sentences, nbest=1, alpha=0.0)
    assert _rows(single.tokenizer([3, 4]).tokenize(sentences)) == best


def test_the_seed_fixes_the_draw_and_alpha_how_often_the_best_is_drawn(tokenizer, sentences):
    best = _rows(tokenizer.tokenize(sentences))
    shares = {}
    for alpha in (0.1, 1.0):
        sampler = SegmentationSampler(tokenizer, sentences, nbest=16, alpha=alpha)
        first = _rows(sampler.tokenizer([7, 0]).tokenize(sentences))
        # The same seed in another sampler built from the same sentences (as in a resumed
        # process), as a list or as a tensor, in any order of the sentences: the same ids.
        again = SegmentationSampler(tokenizer, sentences[::-1], nbest=16, alpha=alpha)
        assert _rows(again.tokenizer(tf.constant([7, 0], tf.int64)).tokenize(
            sentences[::-1])) == first[::-1]
        assert _rows(sampler.tokenizer([7, 1]).tokenize(sentences)) != first
        shares[alpha] = np.mean([a == b for a, b in zip(first, best)])
    assert shares[0.1] < 0.4 < 0.7 < shares[1.0]


def test_special_tokens_and_truncation_as_the_tokenizer_does(tokenizer, sentences):
    sampler = SegmentationSampler(tokenizer, sentences, nbest=1, alpha=1.0)
    for kwargs in ({"add_end": True}, {"add_start": True, "max_length": 6},
                   {"add_start": True, "add_end": True, "max_length": 5}):
        sampled = _rows(sampler.tokenizer([1, 1]).tokenize(sentences, **kwargs))
        assert sampled == _rows(tokenizer.tokenize(sentences, **kwargs))
    rows = _rows(sampler.tokenizer([1, 1]).tokenize(sentences[:3], add_start=True,
                                                    add_end=True, max_length=5))
    assert all(row[0] == START_ID and row[-1] == END_ID and len(row) <= 5 for row in rows)


def test_works_inside_a_dataset_function(tokenizer, sentences):
    sampler = SegmentationSampler(tokenizer, sentences, nbest=8, alpha=0.2)
    texts = [s for s in sentences if isinstance(s, str)][:40]
    dataset = tf.data.Dataset.range(3).map(
        lambda e: sampler.tokenizer(tf.stack([e, tf.constant(0, tf.int64)])).tokenize(
            tf.constant(texts)).to_tensor())
    epochs = [np.asarray(batch) for batch in dataset]
    eager = sampler.tokenizer([1, 0]).tokenize(texts).to_tensor().numpy()
    np.testing.assert_array_equal(epochs[1], eager)
    assert not np.array_equal(epochs[0], epochs[1]) or epochs[0].shape != epochs[1].shape


def test_an_unknown_sentence_raises(tokenizer, sentences):
    sampler = SegmentationSampler(tokenizer, sentences[:10], nbest=4, alpha=0.2)
    # Unknown sentences whose fingerprints fall before, between and after the known ones.
    unknown = [f"A sentence it never saw, number {i}." for i in range(200)]
    keys = _fingerprints(tf.constant(unknown)).numpy()
    known = sampler._keys.numpy()[:-1]  # without the sentinel
    between = (keys > known.min()) & (keys < known.max())
    assert min(keys) < known.min() and max(keys) > known.max() and between.any()
    picks = [unknown[np.argmin(keys)], unknown[np.argmax(keys)], unknown[np.argmax(between)]]
    for sentence in picks:
        with pytest.raises(tf.errors.InvalidArgumentError, match="not built with"):
            sampler.tokenizer([0, 0]).tokenize([sentences[0], sentence])
    empty = SegmentationSampler(tokenizer, [], nbest=4, alpha=0.2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="not built with"):
        empty.tokenizer([0, 0]).tokenize([sentences[0]])


def test_large_inputs_report_progress(tokenizer, sentences, monkeypatch):
    monkeypatch.setattr(subword_sampling, "_ENCODE_CHUNK", 20)
    monkeypatch.setattr(subword_sampling, "_PROGRESS_EVERY", 100)
    lines = []
    sampler = SegmentationSampler(tokenizer, sentences, nbest=4, alpha=0.2, log=lines.append)
    assert [line.split(" sentences")[0] for line in lines[:-1]] == [
        f"Subword sampling: {done:,} of {sampler.num_sentences:,}" for done in (100, 200, 300)]
    assert lines[-1].startswith(
        f"Subword sampling: the 4 best segmentations of {sampler.num_sentences} sentences")
    # Chunked, the candidates are those of one call.
    monkeypatch.setattr(subword_sampling, "_ENCODE_CHUNK", 4096)
    whole = SegmentationSampler(tokenizer, sentences, nbest=4, alpha=0.2)
    assert _rows(sampler.tokenizer([2, 0]).tokenize(sentences)) == _rows(
        whole.tokenizer([2, 0]).tokenize(sentences))


def test_invalid_settings_and_a_bpe_model_raise(tokenizer, sentences, tmp_path):
    with pytest.raises(ValueError, match="nbest"):
        SegmentationSampler(tokenizer, sentences, nbest=0, alpha=0.2)
    with pytest.raises(ValueError, match="alpha"):
        SegmentationSampler(tokenizer, sentences, nbest=4, alpha=-1.0)
    # SentencePiece's limit of 512 failed after the data report; an infinite alpha made
    # every weight -inf and the first draw failed in a gather.
    with pytest.raises(ValueError, match="nbest.*512"):
        SegmentationSampler(tokenizer, sentences, nbest=513, alpha=0.2)
    with pytest.raises(ValueError, match="alpha.*finite"):
        SegmentationSampler(tokenizer, sentences, nbest=4, alpha=float("inf"))
    bpe = SubwordTokenizer(train_sentencepiece(
        [s for s in sentences if isinstance(s, str)] * 3, tmp_path / "bpe.model",
        vocab_size=600, model_type="bpe"))
    with pytest.raises(ValueError, match="unigram"):
        SegmentationSampler(bpe, sentences, nbest=4, alpha=0.2)


def test_the_candidates_are_held_in_a_few_bytes_an_id(tokenizer, sentences):
    # One Python int object and a list slot per candidate id (36 bytes): at the allowed
    # 300,000 pairs, nbest 16 held ~9 GiB while building the samplers. 4-byte arrays now.
    import tracemalloc

    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=tokenizer.model_path)
    texts = [normalize(s) if isinstance(s, str) else "" for s in sentences] * 4
    tracemalloc.start()
    try:
        flat, lengths, counts, scores = subword_sampling._nbest_lists(processor, texts, 16)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    ids = len(flat)
    assert ids > 100_000 and len(counts) == len(texts)
    assert peak < 8 * ids + 8 * len(lengths) + scores.nbytes + 2_000_000, (peak, ids)

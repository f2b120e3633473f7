"""Tests of make_translation_dataset: shift right, truncation, bucketing, determinism."""

import gzip

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.data import (
    compare_padding,
    default_bucket_boundaries,
    find_local_multi30k,
    make_translation_dataset,
    padding_fraction,
)
from keras_transformer.text import END_ID, PAD_ID, START_ID, train_sentencepiece


class _WordTokenizer:
    """Whitespace tokenizer with a fixed table: ids are easy to write by hand."""

    VOCAB = {"a": 10, "b": 11, "c": 12, "d": 13, "x": 20, "y": 21, "z": 22}

    def tokenize(self, strings, max_length=None, add_start=False, add_end=False):
        keys = tf.constant(list(self.VOCAB))
        values = tf.constant(list(self.VOCAB.values()), tf.int32)
        table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, values), 3)
        ids = tf.ragged.map_flat_values(table.lookup, tf.strings.split(strings))
        budget = None if max_length is None else max_length - add_start - add_end
        if budget is not None:
            ids = ids[:, :budget]
        batch = ids.nrows()
        parts = [ids]
        if add_start:
            parts.insert(0, tf.RaggedTensor.from_tensor(tf.fill([batch, 1], START_ID)))
        if add_end:
            parts.append(tf.RaggedTensor.from_tensor(tf.fill([batch, 1], END_ID)))
        return tf.concat(parts, axis=1) if len(parts) > 1 else ids


def _pairs(sources, targets):
    return tf.data.Dataset.from_tensor_slices({"en": sources, "de": targets})


def test_shift_right_and_padding():
    tok = _WordTokenizer()
    ds = make_translation_dataset(
        _pairs(["a b c", "d"], ["x y", "z x y z"]), tok, tok, batch_size=2, shuffle=False
    )
    inputs, labels = next(iter(ds))
    np.testing.assert_array_equal(
        inputs["encoder_tokens"], [[10, 11, 12, END_ID], [13, END_ID, PAD_ID, PAD_ID]]
    )
    np.testing.assert_array_equal(
        inputs["decoder_tokens"], [[START_ID, 20, 21, PAD_ID, PAD_ID], [START_ID, 22, 20, 21, 22]]
    )
    np.testing.assert_array_equal(
        labels, [[20, 21, END_ID, PAD_ID, PAD_ID], [22, 20, 21, 22, END_ID]]
    )
    assert inputs["encoder_tokens"].dtype == tf.int32 and labels.dtype == tf.int32


def test_truncation_keeps_special_tokens_within_max_length():
    tok = _WordTokenizer()
    ds = make_translation_dataset(
        _pairs(["a b c d a b"], ["x y z x y z"]), tok, tok, max_length=4, batch_size=1,
        shuffle=False,
    )
    inputs, labels = next(iter(ds))
    np.testing.assert_array_equal(inputs["encoder_tokens"], [[10, 11, 12, END_ID]])
    np.testing.assert_array_equal(inputs["decoder_tokens"], [[START_ID, 20, 21, 22]])
    np.testing.assert_array_equal(labels, [[20, 21, 22, END_ID]])


def test_batch_multiple_and_token_budget():
    tok = _WordTokenizer()
    sources = ["a " * n for n in range(1, 41) for _ in range(10)]
    ds = make_translation_dataset(
        _pairs(sources, sources), tok, tok, max_length=64, tokens_per_batch=120,
        batch_multiple=4, shuffle=False, drop_remainder=True,
    )
    sizes = []
    for inputs, labels in ds:
        batch, length = labels.shape
        sizes.append(batch)
        assert batch % 4 == 0
        # About tokens_per_batch tokens, never more than one multiple of 4 beyond it.
        assert batch * length <= 120 or batch == 4
    assert sizes and max(sizes) > min(sizes)  # short buckets get bigger batches


@pytest.fixture(scope="module")
def real_pairs():
    local = find_local_multi30k()
    if local is None:
        pytest.skip("no local copy of Multi30K")
    lines = {}
    for lang in ("en", "de"):
        with gzip.open(local / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            lines[lang] = [line.rstrip("\n") for line in f][:3000]
    return lines


@pytest.fixture(scope="module")
def real_tokenizer(real_pairs, tmp_path_factory):
    from keras_transformer.text import SubwordTokenizer

    path = train_sentencepiece(
        real_pairs["en"] + real_pairs["de"],
        tmp_path_factory.mktemp("vocab") / "tokenizer.model",
        vocab_size=1000,
    )
    return SubwordTokenizer(path)


def test_bucketing_reduces_padding(real_pairs, real_tokenizer):
    pairs = _pairs(real_pairs["en"], real_pairs["de"])
    common = dict(max_length=64, batch_size=32, shuffle=True, seed=3, shuffle_buffer=3000)
    plain = make_translation_dataset(pairs, real_tokenizer, real_tokenizer, **common)
    bucketed = make_translation_dataset(
        pairs, real_tokenizer, real_tokenizer,
        bucket_boundaries=default_bucket_boundaries(64), **common,
    )
    without, with_buckets = padding_fraction(plain), padding_fraction(bucketed)
    assert 0.2 < without < 0.8
    assert with_buckets < 0.6 * without
    # Bucketing regroups, it neither drops nor duplicates examples.
    assert sum(int(l.shape[0]) for _, l in bucketed) == 3000
    report = compare_padding(
        pairs, real_tokenizer, real_tokenizer, num_batches=20, **common
    )
    assert report.with_bucketing < report.without_bucketing
    assert "without bucketing" in str(report)


def test_same_seed_same_batches(real_pairs, real_tokenizer):
    pairs = _pairs(real_pairs["en"][:500], real_pairs["de"][:500])

    def batches(seed):
        ds = make_translation_dataset(
            pairs, real_tokenizer, real_tokenizer, tokens_per_batch=400, seed=seed,
            shuffle_buffer=500,
        )
        return [labels.numpy().tolist() for _, labels in ds]

    first, again, other = batches(7), batches(7), batches(8)
    assert first == again
    assert first != other


_LONG_PAIR_SCRIPT = r"""
import resource, sys
import tensorflow as tf
from keras_transformer.data import make_translation_dataset

class Words:  # every word one id
    def tokenize(self, strings, max_length=None, add_start=False, add_end=False):
        ids = tf.ragged.map_flat_values(lambda w: tf.fill(tf.shape(w), 10),
                                        tf.strings.split(strings))
        if max_length is not None:
            ids = ids[:, :max_length - int(add_end)]
        if add_end:
            ids = tf.concat([ids, tf.RaggedTensor.from_tensor(tf.fill([ids.nrows(), 1], 2))], 1)
        return ids

sources = ["a b c"] * 1023 + [" ".join(["a"] * 100_000)]  # one 100,000-word line
ds = make_translation_dataset(
    tf.data.Dataset.from_tensor_slices({"en": sources, "de": sources}), Words(), Words(),
    batch_size=64, max_length=16, drop_long=True, shuffle=False)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
pairs = sum(int(labels.shape[0]) for _, labels in ds)
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(pairs, round(grown))
"""


def test_one_very_long_pair_is_dropped_without_padding_its_chunk_to_its_length():
    # Tokenized 1,024 pairs at a time, a chunk was padded to its longest row, three times
    # (encoder, decoder, labels), before the long pairs were dropped: one 100,000-token
    # line (a misaligned corpus) cost 1,024 x 100,000 x 4 bytes x 3 = 1.2 GB, every epoch.
    import subprocess
    import sys

    completed = subprocess.run([sys.executable, "-c", _LONG_PAIR_SCRIPT], capture_output=True,
                               text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    pairs, grown_mb = map(int, completed.stdout.split()[-2:])
    assert pairs == 1023  # the long pair dropped, the others kept
    assert grown_mb < 300, f"peak memory grew by {grown_mb} MB"

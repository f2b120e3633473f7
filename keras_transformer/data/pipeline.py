"""tf.data pipeline from sentence pairs to padded, bucketed teacher-forcing batches.

Each pair becomes (Vaswani et al., 2017, with the shift right of teacher forcing):

* `encoder_tokens = source_ids + [END]` (no START on the source side),
* `decoder_tokens = [START] + target_ids`,
* `labels = target_ids + [END]`,

all int32 and padded with `PAD_ID = 0`. Truncation keeps the first `max_length - 1` text
ids, so each of the three sequences, special token included, fits `max_length`; with
`drop_long=True` (what the trainer uses for training and validation loss) pairs with more
than `max_length - 1` ids on either side are dropped instead, as most toolkits do: a cut
target followed by END would teach the model to stop mid-sentence.

The pipeline streams: nothing needs the whole corpus in memory unless `cache=True`, and the
shuffle buffer and the length buckets hold a bounded number of examples. When the number of
batches of one pass is known (`count_batches`), `num_batches` declares it to tf.data, so
Keras' progress bar has a total and no "ran out of data" warning.
"""

import dataclasses

import tensorflow as tf

from keras_transformer.text.special_tokens import END_ID, PAD_ID, START_ID

# Sentences tokenized per call: one op call per chunk instead of one per sentence.
_TOKENIZE_CHUNK = 1024
# Default shuffle buffer: holds all of Multi30K's 29,000 training pairs.
DEFAULT_SHUFFLE_BUFFER = 32768


def default_bucket_boundaries(max_length, min_length=8, growth=1.25):
    """Geometric bucket boundaries from `min_length` up to `max_length`.

    Buckets grow by `growth` (at least by 1 token), so the padding inside a bucket is at
    most about `1 - 1 / growth` of its tokens.

    Args:
        max_length: int, the longest sequence; boundaries stay `<= max_length`.
        min_length: int, the first boundary. Defaults to `8`.
        growth: float, ratio of consecutive boundaries. Defaults to `1.25`.

    Returns:
        A sorted list of int boundaries for `tf.data.Dataset.bucket_by_sequence_length`
        (bucket i holds lengths in `[b[i-1], b[i])`).

    Example:

    >>> default_bucket_boundaries(32)
    [8, 10, 12, 15, 18, 22, 27]
    """
    boundaries, boundary = [], min_length
    while boundary <= max_length:
        boundaries.append(int(boundary))
        boundary = max(int(boundary) + 1, int(boundary * growth))
    return boundaries


def batch_plan(max_length, batch_size=64, tokens_per_batch=None, bucket_boundaries=None,
               batch_multiple=1):
    """How `make_translation_dataset` batches: `(boundaries, batch sizes)`.

    Returns:
        `(boundaries, sizes)`: `boundaries` is a list of bucket edges (empty without
        bucketing) and `sizes` one batch size per bucket (one size without bucketing).
    """
    if tokens_per_batch is not None and bucket_boundaries is None:
        bucket_boundaries = default_bucket_boundaries(max_length)
    if bucket_boundaries:
        boundaries = list(bucket_boundaries)
        return boundaries, _bucket_batch_sizes(
            boundaries, max_length, batch_size, tokens_per_batch, batch_multiple)
    return [], [max(batch_multiple, batch_size // batch_multiple * batch_multiple)]


def count_batches(lengths, boundaries, sizes, drop_remainder=False, counts=None):
    """Batches of one pass, from the example lengths alone (the order does not matter).

    Each bucket of `bucket_by_sequence_length` (or the single `padded_batch`) emits
    `ceil(n / size)` batches for its `n` examples (`floor` with `drop_remainder`), whatever
    the shuffle, so one counting pass gives the exact epoch length.

    Args:
        lengths: array-like of int, `max(len(encoder_tokens), len(decoder_tokens))` per
            example.
        boundaries: list of int, bucket edges (`[]` for no bucketing).
        sizes: list of int, batch size per bucket.
        drop_remainder: bool, as in `make_translation_dataset`.
        counts: array-like of int or None, how many examples have each of `lengths` (a
            histogram, so that memory does not grow with the corpus); None: one each.

    Returns:
        int, the number of batches.

    Example:

    >>> count_batches([3, 4, 9, 9, 9], [8], [2, 2])
    3
    """
    import numpy as np

    lengths = np.asarray(lengths, dtype=np.int64)
    # bucket i holds lengths in [b[i-1], b[i]), as in `bucket_by_sequence_length`.
    buckets = np.searchsorted(np.asarray(boundaries, dtype=np.int64), lengths, side="right")
    counts = np.bincount(buckets, minlength=len(sizes), weights=(
        None if counts is None else np.asarray(counts, dtype=np.float64))).astype(np.int64)
    if drop_remainder:
        return int(sum(n // size for n, size in zip(counts, sizes)))
    return int(sum(-(-n // size) for n, size in zip(counts, sizes)))


def _bucket_batch_sizes(boundaries, max_length, batch_size, tokens_per_batch, batch_multiple):
    """Batch size per bucket: constant, or about `tokens_per_batch` tokens per batch."""
    sizes = []
    # The longest sequence of bucket i is boundaries[i] - 1 (the last one: max_length).
    for longest in [b - 1 for b in boundaries] + [max_length]:
        size = batch_size if tokens_per_batch is None else tokens_per_batch // max(longest, 1)
        # Round down to a multiple of the replica count, keeping at least one per replica.
        sizes.append(max(batch_multiple, size // batch_multiple * batch_multiple))
    return sizes


def make_translation_dataset(
    ds,
    source_tokenizer,
    target_tokenizer,
    source_lang="en",
    target_lang="de",
    max_length=128,
    batch_size=64,
    tokens_per_batch=None,
    bucket_boundaries=None,
    shuffle=True,
    shuffle_buffer=DEFAULT_SHUFFLE_BUFFER,
    seed=None,
    drop_remainder=False,
    repeat=False,
    batch_multiple=1,
    cache=True,
    drop_long=False,
    num_batches=None,
):
    """Builds `({"encoder_tokens", "decoder_tokens"}, labels)` batches from sentence pairs.

    Pipeline: tokenize in chunks -> truncate and add START/END -> cache -> shuffle ->
    batch (padded; bucketed by length if asked) -> repeat -> prefetch. With a `seed` the
    batches and their order are the same on every run (and each epoch of `repeat`
    reshuffles deterministically).

    Bucketing: an example goes to the bucket of `max(len(encoder_tokens),
    len(decoder_tokens))`; batches are padded to their own longest sequence, which cuts
    padding (see `padding_fraction`). With `tokens_per_batch` each bucket's batch size is
    `tokens_per_batch // longest length of the bucket`, so batches hold about the same
    number of tokens; `tokens_per_batch` without `bucket_boundaries` uses
    `default_bucket_boundaries(max_length)`.

    Replicas: every batch size is rounded down to a multiple of `batch_multiple` (e.g.
    `strategy.num_replicas_in_sync`). Only `drop_remainder=True` also makes the last,
    partial batch of each bucket divisible; `MirroredStrategy` accepts uneven batches.

    Args:
        ds: `tf.data.Dataset` of `{lang: tf.string}` scalars (e.g. `load_multi30k`).
        source_tokenizer: `SubwordTokenizer` (anything with `tokenize(strings)`
            returning a ragged int32 `(B, None)`) for the source language.
        target_tokenizer: the target language's tokenizer (may be the same object).
        source_lang: str, source key of `ds`. Defaults to `"en"`.
        target_lang: str, target key of `ds`. Defaults to `"de"`.
        max_length: int, longest sequence including its START or END. Defaults to `128`.
        batch_size: int, examples per batch without `tokens_per_batch`. Defaults to `64`.
        tokens_per_batch: int or None, token budget per batch (turns bucketing on).
            Defaults to `None`.
        bucket_boundaries: list of int or None, length boundaries of the buckets.
            Defaults to `None` (no bucketing unless `tokens_per_batch` is set).
        shuffle: bool, shuffle examples. Defaults to `True`.
        shuffle_buffer: int, shuffle buffer size. Defaults to `32768`.
        seed: int or None, shuffle seed for reproducible batches. Defaults to `None`.
        drop_remainder: bool, drop partial batches. Defaults to `False`.
        repeat: bool, repeat forever (for `steps_per_epoch`). Defaults to `False`.
        batch_multiple: int, batch sizes are multiples of it. Defaults to `1`.
        cache: bool, keep the tokenized examples in memory after the first pass so
            later epochs skip tokenization. Defaults to `True`; pass `False` for corpora
            that do not fit in memory.
        drop_long: bool, drop pairs with more than `max_length - 1` ids on either side
            instead of truncating them. Defaults to `False` (truncate).
        num_batches: int or None, the number of batches of one pass (`count_batches`),
            declared with `assert_cardinality` (tf.data raises if it is wrong). Defaults
            to `None` (unknown).

    Returns:
        A `tf.data.Dataset` of `({"encoder_tokens": int32 (B, S), "decoder_tokens":
        int32 (B, T)}, labels int32 (B, T))`.

    Example:

    >>> from keras_transformer.text import train_tokenizers
    >>> pairs = {"en": ["A dog runs.", "Two dogs play in the snow."] * 20,
    ...          "de": ["Ein Hund rennt.", "Zwei Hunde spielen im Schnee."] * 20}
    >>> tokenizer, _ = train_tokenizers(pairs, vocab_size=290, output_dir="vocab")
    >>> train = make_translation_dataset(tf.data.Dataset.from_tensor_slices(pairs),
    ...                                  tokenizer, tokenizer, batch_size=8, seed=0)
    >>> inputs, labels = next(iter(train))
    >>> sorted(inputs), labels.shape[0]
    (['decoder_tokens', 'encoder_tokens'], 8)
    """
    if max_length < 2:
        raise ValueError(f"max_length must be at least 2 (text + START/END), got {max_length}.")
    if batch_multiple < 1:
        raise ValueError(f"batch_multiple must be positive, got {batch_multiple}.")

    # Dropping needs the full lengths; truncating cuts text to max_length - 1 ids, leaving
    # room for one special token per sequence.
    limit = None if drop_long else max_length

    def tokenize(pairs):
        encoder = source_tokenizer.tokenize(pairs[source_lang], max_length=limit, add_end=True)
        target = target_tokenizer.tokenize(
            pairs[target_lang], max_length=None if limit is None else limit - 1)
        decoder = tf.concat(
            [tf.RaggedTensor.from_tensor(tf.fill([target.nrows(), 1], START_ID)), target], axis=1
        )
        labels = tf.concat(
            [target, tf.RaggedTensor.from_tensor(tf.fill([target.nrows(), 1], END_ID))], axis=1
        )
        # Dense rows plus lengths: unbatched ragged rows are not accepted by padded_batch.
        # The lengths are the full ones (dropping reads them); the rows are cut to
        # `max_length` before they are made dense: a chunk is padded to its longest row, and
        # one pair of 100,000 tokens, dropped anyway, cost the chunk 1.2 GB.
        sequences = (encoder, decoder, labels)
        return tuple(r[:, :max_length].to_tensor(PAD_ID) for r in sequences), tuple(
            tf.cast(r.row_lengths(), tf.int32) for r in sequences
        )

    def trim(padded, lengths):
        encoder, decoder, labels = (row[:n] for row, n in zip(padded, lengths))
        return {"encoder_tokens": encoder, "decoder_tokens": decoder}, labels

    examples = (
        ds.batch(_TOKENIZE_CHUNK)
        .map(tokenize, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .unbatch()
    )
    if drop_long:
        examples = examples.filter(lambda padded, lengths: tf.reduce_max(lengths) <= max_length)
    examples = examples.map(trim, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if cache:
        examples = examples.cache()
    if shuffle:
        examples = examples.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)

    padded_shapes = ({"encoder_tokens": [None], "decoder_tokens": [None]}, [None])
    padding_values = (
        {"encoder_tokens": PAD_ID, "decoder_tokens": PAD_ID},
        PAD_ID,
    )
    bucket_boundaries, sizes = batch_plan(
        max_length, batch_size, tokens_per_batch, bucket_boundaries, batch_multiple)
    if bucket_boundaries:
        batches = examples.bucket_by_sequence_length(
            element_length_func=lambda inputs, labels: tf.maximum(
                tf.shape(inputs["encoder_tokens"])[0], tf.shape(inputs["decoder_tokens"])[0]
            ),
            bucket_boundaries=bucket_boundaries,
            bucket_batch_sizes=sizes,
            padded_shapes=padded_shapes,
            padding_values=padding_values,
            drop_remainder=drop_remainder,
        )
    else:
        batches = examples.padded_batch(
            sizes[0],
            padded_shapes=padded_shapes,
            padding_values=padding_values,
            drop_remainder=drop_remainder,
        )
    if num_batches is not None:
        batches = batches.apply(tf.data.experimental.assert_cardinality(num_batches))
    if repeat:
        batches = batches.repeat()
    return batches.prefetch(tf.data.AUTOTUNE)


def padding_fraction(dataset, num_batches=None):
    """Fraction of padding among the encoder and decoder tokens of a batched dataset.

    Args:
        dataset: output of `make_translation_dataset`.
        num_batches: int or None, batches to read. Defaults to `None` (all; the dataset
            must be finite).

    Returns:
        float in `[0, 1)`: padded positions / all positions of `encoder_tokens` and
        `decoder_tokens`.

    Example:

    >>> from keras_transformer.text import train_tokenizers
    >>> pairs = {"en": ["A dog runs.", "Two dogs play in the snow."] * 20,
    ...          "de": ["Ein Hund rennt.", "Zwei Hunde spielen im Schnee."] * 20}
    >>> tokenizer, _ = train_tokenizers(pairs, vocab_size=290, output_dir="vocab")
    >>> train = make_translation_dataset(tf.data.Dataset.from_tensor_slices(pairs),
    ...                                  tokenizer, tokenizer, batch_size=8, seed=0)
    >>> 0 < padding_fraction(train, num_batches=3) < 1  # two lengths share each batch
    True
    """
    if num_batches is not None:
        dataset = dataset.take(num_batches)
    padding = total = 0
    for inputs, _ in dataset:
        for key in ("encoder_tokens", "decoder_tokens"):
            tokens = inputs[key]
            padding += int(tf.reduce_sum(tf.cast(tf.equal(tokens, PAD_ID), tf.int64)))
            total += int(tf.size(tokens, out_type=tf.int64))
    return padding / total if total else 0.0


@dataclasses.dataclass(frozen=True)
class PaddingReport:
    """Padding fractions of the same data batched without and with bucketing."""

    # Fraction of padding with plain `padded_batch`.
    without_bucketing: float
    # Fraction of padding with `bucket_by_sequence_length`.
    with_bucketing: float
    # Batches read for each figure.
    num_batches: int

    def __str__(self):
        return (
            f"padding: {self.without_bucketing:.1%} of tokens without bucketing, "
            f"{self.with_bucketing:.1%} with bucketing (first {self.num_batches} batches)"
        )


def compare_padding(ds, source_tokenizer, target_tokenizer, num_batches=50, **kwargs):
    """Measures padding without and with bucketing, for the trainer to print.

    Args:
        ds: the sentence pairs, as for `make_translation_dataset`.
        source_tokenizer: the source tokenizer.
        target_tokenizer: the target tokenizer.
        num_batches: int, batches read for each figure. Defaults to `50`.
        **kwargs: `make_translation_dataset` arguments of the bucketed pipeline. The
            baseline uses the same ones without `bucket_boundaries` and
            `tokens_per_batch` (so with the constant `batch_size`).

    Returns:
        A `PaddingReport`; `str()` of it is a one-line summary.

    Example:

    >>> from keras_transformer.text import train_tokenizers
    >>> pairs = {"en": ["A dog runs.", "Two dogs play in the snow."] * 20,
    ...          "de": ["Ein Hund rennt.", "Zwei Hunde spielen im Schnee."] * 20}
    >>> tok, _ = train_tokenizers(pairs, vocab_size=290, output_dir="vocab")
    >>> train_pairs = tf.data.Dataset.from_tensor_slices(pairs)
    >>> print(compare_padding(train_pairs, tok, tok, batch_size=8, num_batches=4, seed=0))
    padding: ...% of tokens without bucketing, 0.0% with bucketing (first 4 batches)
    """
    # No cache: only `num_batches` batches are read, and a partly read cache is discarded
    # with a warning.
    kwargs = dict(kwargs, repeat=False, cache=False, num_batches=None)
    if kwargs.get("bucket_boundaries") is None and kwargs.get("tokens_per_batch") is None:
        kwargs["bucket_boundaries"] = default_bucket_boundaries(kwargs.get("max_length", 128))
    plain = dict(kwargs, bucket_boundaries=None, tokens_per_batch=None)
    without = make_translation_dataset(ds, source_tokenizer, target_tokenizer, **plain)
    bucketed = make_translation_dataset(ds, source_tokenizer, target_tokenizer, **kwargs)
    return PaddingReport(
        without_bucketing=padding_fraction(without, num_batches),
        with_bucketing=padding_fraction(bucketed, num_batches),
        num_batches=num_batches,
    )

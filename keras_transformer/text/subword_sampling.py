"""Subword regularization: each training epoch reads a sentence in one of its likely
segmentations, drawn deterministically from a seed.

SentencePiece can sample segmentations itself (`nbest_size`, `alpha` of its tokenize op),
but from a random generator TensorFlow does not seed: a resumed run would not read what an
uninterrupted one does. `SegmentationSampler` instead computes each training sentence's
`nbest` most likely segmentations and their log-probabilities once, in Python, and draws
one per sentence with `tf.random.stateless_categorical` from a seed, so a seed (the run's
seed and the epoch) fixes every segmentation.

References:
    Kudo, 2018, "Subword Regularization: Improving Neural Network Translation Models with
    Multiple Subword Candidates".
"""

import array
import math
import time

import numpy as np
import sentencepiece as spm
import tensorflow as tf

from keras_transformer.text.subword_tokenizer import SubwordTokenizer

# Sentences handed to SentencePiece per `nbest_encode` call (bounds the protos in memory).
# The most segmentations SentencePiece's `nbest_encode` gives (`nbest_size <= 512`).
MAX_NBEST = 512
_ENCODE_CHUNK = 4096
# A progress line every this many sentences (about 10 s of `nbest_encode` at nbest 16).
_PROGRESS_EVERY = 50_000
# 64-bit fingerprints identify sentences: `tf.strings.to_hash_bucket_fast` into this many
# buckets (Fingerprint64 modulo it). Two of a million sentences collide with probability
# about 1e-7; a collision is detected when the sampler is built.
_HASH_BUCKETS = 2**62


def _fingerprints(strings):
    return tf.strings.to_hash_bucket_fast(strings, _HASH_BUCKETS)


def _nbest_lists(processor, texts, nbest, log=None):
    """Every text's `nbest` best segmentations, as flat lists.

    Candidates are kept as one flat id list and their lengths (`tf.ragged.constant` is
    quadratic in the number of rows), in arrays of machine integers: a Python list holds a
    36-byte int object per id, 9 GiB for 300,000 pairs at nbest 16.

    Args:
        processor: `sentencepiece.SentencePieceProcessor` of a unigram model.
        texts: list of str.
        nbest: int, candidates per text.
        log: callable taking a str, or None: told the progress every
            `_PROGRESS_EVERY` texts.

    Returns:
        `(flat, lengths, counts, scores)` (the first three `array.array`s of int32, int64,
        int64): the candidates' ids one after the other, each
        candidate's length, each text's number of candidates (the empty text has one, of
        no ids) and float32 `(len(texts), nbest)` log-probabilities, -inf where a text has
        fewer candidates.
    """
    flat, lengths, counts = array.array("i"), array.array("q"), array.array("q")
    scores = np.full((len(texts), nbest), -np.inf, np.float32)
    started = time.perf_counter()
    for start in range(0, len(texts), _ENCODE_CHUNK):
        chunk = processor.nbest_encode(
            texts[start:start + _ENCODE_CHUNK], nbest_size=nbest, return_type="proto")
        for row, result in enumerate(chunk, start):
            candidates = list(result.nbests) or [None]  # "" has no segmentation
            counts.append(len(candidates))
            for j, candidate in enumerate(candidates):
                before = len(flat)
                if candidate is not None:
                    flat.extend(p.id for p in candidate.pieces)
                lengths.append(len(flat) - before)
                scores[row, j] = 0.0 if candidate is None else candidate.score
        done = min(start + _ENCODE_CHUNK, len(texts))
        if log is not None and done < len(texts) and done % _PROGRESS_EVERY < _ENCODE_CHUNK:
            log(f"Subword sampling: {done:,} of {len(texts):,} sentences segmented "
                f"({time.perf_counter() - started:.0f} s)")
    return flat, lengths, counts, scores


class SegmentationSampler:
    """The `nbest` best segmentations of a fixed set of sentences, sampled per seed.

    `tokenizer(seed)` returns an object with `SubwordTokenizer.tokenize`'s signature that
    gives each known sentence segmentation `j` of its n-best list with probability
    proportional to `P(segmentation j) ** alpha` (Kudo, 2018: alpha near 0 draws almost
    uniformly among the candidates, a large alpha almost always the best one). The draw
    depends only on the seed and the sentence: the same seed gives the same ids in any
    process, so a resumed training run reads what an uninterrupted one did.

    The candidates stay in memory as int32 ids (about `nbest` times the ids of one
    tokenized copy of the sentences). Every candidate detokenizes to the same normalized
    text; candidate 0 is the tokenizer's own (Viterbi) segmentation.

    Args:
        tokenizer: `SubwordTokenizer` of a unigram SentencePiece model (BPE models have no
            n-best list).
        sentences: iterable of str or bytes, the sentences `tokenize` will be asked for
            (duplicates are kept once).
        nbest: int, candidates per sentence (>= 1; 1 always gives the best one).
        alpha: float, the sharpness of the draw (>= 0).
        log: callable taking a str, or None: told the progress of the n-best lists (on
            large inputs) and how long they took.
            Defaults to `None`.

    Example:

    >>> from keras_transformer.text import train_tokenizers
    >>> pairs = {"en": ["A dog runs.", "Two dogs play in the snow."] * 20,
    ...          "de": ["Ein Hund rennt.", "Zwei Hunde spielen im Schnee."] * 20}
    >>> tokenizer, _ = train_tokenizers(pairs, vocab_size=290, output_dir="vocab")
    >>> sampler = SegmentationSampler(tokenizer, pairs["en"], nbest=8, alpha=0.1)
    >>> ids = sampler.tokenizer(seed=[0, 0]).tokenize(["Two dogs play in the snow."])
    >>> tokenizer.detokenize(ids).numpy()
    array([b'Two dogs play in the snow.'], dtype=object)
    """

    def __init__(self, tokenizer, sentences, nbest, alpha, log=None):
        if int(nbest) != nbest or not 1 <= nbest <= MAX_NBEST:
            raise ValueError(f"`nbest` must be an integer in [1, {MAX_NBEST}] (SentencePiece's "
                             f"limit). Received: {nbest}")
        if not 0 <= alpha < math.inf:
            raise ValueError(f"`alpha` must be a finite number >= 0. Received: {alpha}")
        self.nbest = int(nbest)
        self.alpha = float(alpha)
        started = time.perf_counter()
        processor = spm.SentencePieceProcessor(model_file=tokenizer.model_path)
        try:
            processor.nbest_encode("a b", nbest_size=2)
        except RuntimeError as error:  # "NBestEncode is not available for the current model"
            raise ValueError(
                "Subword sampling needs a unigram SentencePiece model; "
                f"{tokenizer.model_path} gives no n-best segmentations ({error}).") from None
        unique = {}
        for sentence in sentences:
            if isinstance(sentence, str):
                sentence = sentence.encode("utf-8")
            unique.setdefault(bytes(sentence), None)
        raw = list(unique)
        # The tokenizer op reads invalid UTF-8 as U+FFFD (`SubwordTokenizer.tokenize`):
        # the same transcoding here, so the candidates are those of the text it sees.
        texts = [t.decode("utf-8") for t in tf.strings.unicode_transcode(
            tf.constant(raw or [b""], tf.string)[: len(raw)], "UTF-8", "UTF-8",
            errors="replace", replacement_char=0xFFFD).numpy()]
        flat, lengths, counts, scores = _nbest_lists(processor, texts, self.nbest, log)
        keys = _fingerprints(tf.constant(raw, tf.string)).numpy() if raw else np.zeros(
            [0], np.int64)
        order = np.argsort(keys, kind="stable")
        if len(keys) > 1 and np.any(keys[order][1:] == keys[order][:-1]):
            raise ValueError("Two different sentences share a 64-bit fingerprint; "
                             "subword sampling cannot tell them apart.")
        counts = np.frombuffer(counts, np.int64)
        first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        # Sentences sorted by fingerprint; row i's candidates are rows first[i] + j. The
        # keys end in a sentinel above every fingerprint (< 2**62) that equals none, so a
        # sentence past the last key finds it and fails the check like any unknown one.
        self._keys = tf.constant(np.append(keys[order], np.iinfo(np.int64).max), tf.int64)
        self._first = tf.constant(first[order] if len(first) else first, tf.int64)
        scores = scores[order]
        # alpha * -inf would be NaN at alpha 0: missing candidates stay -inf.
        logits = np.full_like(scores, -np.inf)
        finite = np.isfinite(scores)
        logits[finite] = self.alpha * scores[finite]
        self._logits = tf.constant(logits)
        self._candidates = tf.RaggedTensor.from_row_lengths(
            tf.constant(np.frombuffer(flat, np.int32)),
            tf.constant(np.frombuffer(lengths, np.int64)))
        self.num_sentences = len(raw)
        self.num_candidates = len(lengths)
        self.seconds = time.perf_counter() - started
        if log is not None:
            log(f"Subword sampling: the {self.nbest} best segmentations of "
                f"{self.num_sentences:,} sentences ({self.num_candidates:,} candidates) in "
                f"{self.seconds:.1f} s")

    def choices(self, seed):
        """int64 `(num_sentences,)`: the candidate drawn for each sentence with `seed`.

        Sentences are in fingerprint order. `seed` is a shape `(2,)` integer tensor, as
        for `tf.random.stateless_categorical`.
        """
        if self.num_sentences == 0:
            return tf.zeros([0], tf.int64)
        # logits: (N, nbest), -inf where a sentence has fewer candidates.
        return tf.random.stateless_categorical(
            self._logits, 1, seed=tf.cast(seed, tf.int64))[:, 0]

    def tokenizer(self, seed):
        """A tokenizer that gives each sentence the candidate `seed` draws for it.

        Args:
            seed: int `(2,)` (list or tensor; a tensor works inside `tf.data` functions).

        Returns:
            An object whose `tokenize(strings, max_length=None, add_start=False,
            add_end=False)` works as `SubwordTokenizer.tokenize`; it raises
            `InvalidArgumentError` on a sentence the sampler was not built with.
        """
        return _SampledTokenizer(self, seed)


class _SampledTokenizer:
    """`SegmentationSampler.tokenizer(seed)`: the candidates drawn with one seed."""

    def __init__(self, sampler, seed):
        self._sampler = sampler
        # Drawn once here, not per `tokenize` call: inside a `tf.data` function (an epoch
        # of `flat_map`) the draw is one op of that function, and the pipeline's `map`
        # functions capture its result.
        self._choices = sampler.choices(seed)

    def tokenize(self, strings, max_length=None, add_start=False, add_end=False):
        sampler = self._sampler
        strings = tf.convert_to_tensor(strings, dtype=tf.string)
        keys = _fingerprints(strings)
        position = tf.searchsorted(sampler._keys, keys)  # the sentinel's at most
        with tf.control_dependencies([tf.debugging.assert_equal(
                tf.gather(sampler._keys, position), keys,
                message="Subword sampling was asked for a sentence it was not built with "
                "(only the training sentences have n-best segmentations).")]):
            position = tf.identity(position)
        choice = tf.gather(self._choices, position)
        ids = tf.gather(sampler._candidates, tf.gather(sampler._first, position) + choice)
        return SubwordTokenizer.add_special_tokens(ids, max_length, add_start, add_end)

"""Training of SentencePiece vocabularies with the reserved ids of keras_transformer."""

import gzip
import io
import os
import pathlib
import re
import warnings

import sentencepiece as spm

from keras_transformer.text.normalization import NORMALIZATION_RULE
from keras_transformer.text.special_tokens import END_ID, PAD_ID, START_ID, UNK_ID
from keras_transformer.textfiles import write_bytes_atomically


def _open_text(path):
    path = os.fspath(path)
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, "rt", encoding="utf-8", errors="replace")


def _iter_file_lines(paths):
    for path in paths:
        with _open_text(path) as f:
            for line in f:
                yield line.rstrip("\r\n")


def _iter_sentences(sentences):
    """Yields str sentences from sentences, file path(s) or a dataset of strings."""
    if isinstance(sentences, (str, os.PathLike)):
        # A bare str is read as a file name: a single sentence is no training corpus.
        yield from _iter_file_lines([sentences])
        return
    if hasattr(sentences, "as_numpy_iterator"):  # a tf.data.Dataset of strings
        sentences = sentences.as_numpy_iterator()
    for item in sentences:
        if isinstance(item, pathlib.PurePath):
            yield from _iter_file_lines([item])
        elif isinstance(item, bytes):
            yield item.decode("utf-8", errors="replace")
        elif hasattr(item, "numpy"):  # an eager scalar string tensor
            yield item.numpy().decode("utf-8", errors="replace")
        else:
            yield str(item)


def train_sentencepiece(
    sentences,
    output_path,
    vocab_size=8000,
    model_type="unigram",
    character_coverage=1.0,
    byte_fallback=True,
    normalization_rule_name=NORMALIZATION_RULE,
    max_sentences=None,
    max_sentence_length=4192,
    num_threads=2,
    **extra_options,
):
    """Trains a SentencePiece model with the reserved ids of keras_transformer.

    Training reads the sentences through SentencePiece's `sentence_iterator` and gets the
    model back through `model_writer`, so nothing is written but `output_path`, whole or
    not at all (a temporary file renamed over it). The reserved ids are `0` = `<pad>`,
    `1` = `<s>` (start), `2` = `</s>` (end), `3` = `<unk>`.
    The result is deterministic: the same sentences in the same order give the same bytes.

    Text is normalized with `normalization_rule_name` (see
    `keras_transformer.text.normalization`); with `byte_fallback=True` characters missing
    from the vocabulary are encoded as UTF-8 byte pieces (`<0xF0>` ...) instead of `<unk>`,
    so decoding is lossless on normalized text for any script or emoji. Byte fallback
    takes 256 ids of the vocabulary.

    Args:
        sentences: the training text: an iterable of str (or bytes, or a
            `tf.data.Dataset` of scalar strings), or a file path (`str` or
            `os.PathLike`, `.gz` allowed) or a list of `pathlib.Path`, one sentence a line.
            A bare `str` is always taken as a file path.
        output_path: str or path-like, where the `.model` file is written. Parent
            directories are created.
        vocab_size: int, number of pieces including the 4 reserved ones (and the 256 byte
            pieces with `byte_fallback`). Defaults to `8000`.
        model_type: str, `"unigram"`, `"bpe"`, `"char"` or `"word"`. Defaults to
            `"unigram"`.
        character_coverage: float, fraction of characters covered by the vocabulary.
            Defaults to `1.0` (all characters of the corpus; right for European languages).
        byte_fallback: bool, encode unknown characters as bytes. Defaults to `True`.
        normalization_rule_name: str, SentencePiece normalization rule. Defaults to
            `"nmt_nfkc"`; `normalize()` must use the same rule.
        max_sentences: int or None, sample at most this many sentences (SentencePiece's
            `input_sentence_size`, with its fixed-seed shuffling). Defaults to `None`
            (all sentences).
        max_sentence_length: int, longer sentences (in bytes) are skipped in training.
            Defaults to `4192`.
        num_threads: int, training threads. Defaults to `2`.
        **extra_options: further `spm.SentencePieceTrainer.train` options.

    Returns:
        The `pathlib.Path` of the written model file.

    Example:

    >>> path = train_sentencepiece(
    ...     ["A dog runs.", "Ein Hund rennt."] * 50, "tiny.model",
    ...     vocab_size=290, hard_vocab_limit=False)
    """
    output_path = pathlib.Path(output_path)
    model = io.BytesIO()
    counts = {"sentences": 0, "long": 0}

    def counted(items):  # what SentencePiece skips for its length, counted
        for sentence in items:
            counts["sentences"] += 1
            if (len(sentence) * 4 > max_sentence_length
                    and len(sentence.encode("utf-8", "surrogatepass")) > max_sentence_length):
                counts["long"] += 1
            yield sentence

    options = dict(
        sentence_iterator=counted(_iter_sentences(sentences)),
        model_writer=model,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        byte_fallback=byte_fallback,
        normalization_rule_name=normalization_rule_name,
        pad_id=PAD_ID,
        bos_id=START_ID,
        eos_id=END_ID,
        unk_id=UNK_ID,
        pad_piece="<pad>",
        bos_piece="<s>",
        eos_piece="</s>",
        unk_piece="<unk>",
        input_sentence_size=max_sentences or 0,
        shuffle_input_sentence=True,
        max_sentence_length=max_sentence_length,
        num_threads=num_threads,
        # Training logs go to stderr from C++ and would flood test and training output.
        minloglevel=2,
    )
    options.update(extra_options)
    try:
        spm.SentencePieceTrainer.train(**options)
    except RuntimeError as error:
        # "... smaller than required_chars. 300 vs 318. Increase vocab_size or decrease
        # character_coverage with --character_coverage option." (not an option of ours)
        too_small = re.search(r"smaller than required_chars\. \d+ vs (\d+)", str(error))
        if too_small:
            coverage = options["character_coverage"]
            fewer = ("--set character_coverage=0.9995, for Chinese or Japanese" if coverage >= 1
                     else f"with character_coverage={coverage:g} now, set it lower, down to "
                     "0.98")
            raise ValueError(
                f"A vocabulary of vocab_size={vocab_size} pieces is too small for this "
                f"corpus: its characters and the special tokens need {too_small[1]}. Train "
                "with a larger one (--set vocab_size=N, N well above that), or give only the "
                "commoner characters pieces of their own and spell the rarest in UTF-8 "
                f"bytes ({fewer})."
            ) from None
        no_text = "sentences_.empty()" in str(error) or "all_chars_count" in str(error)
        if no_text and not counts["long"]:
            raise ValueError(
                f"The vocabulary's training text has no text: {counts['sentences']:,} "
                "sentence(s), all empty.") from None
        if "sentences_.empty()" in str(error):
            raise ValueError(
                f"No training sentence is {max_sentence_length} bytes or shorter: "
                f"SentencePiece leaves out lines longer than {max_sentence_length} bytes, "
                "and every line of this corpus is (paragraphs, or a file read as one line). "
                "Give it sentences: split the text into sentence pairs, one a line."
            ) from None
        if "Vocabulary size too high" not in str(error):
            raise
        # "Vocabulary size too high (8000). Please set it to a value <= N."
        raise ValueError(
            f"The training sentences cannot fill a vocabulary of vocab_size={vocab_size} "
            f"pieces ({error}): train with a smaller one (--set vocab_size=N) or on more data."
        ) from None
    if counts["long"]:
        warnings.warn(
            f"{counts['long']:,} of the {counts['sentences']:,} training sentences are longer "
            f"than {max_sentence_length} bytes: SentencePiece left them out of the "
            "vocabulary's training. Split such text into sentences.", UserWarning,
            stacklevel=2)
    output_path.parent.mkdir(parents=True, exist_ok=True)
    # Whole or not at all: a kill or a full disk during the write leaves the previous file
    # or none, never a truncated model no run can read.
    write_bytes_atomically(output_path, model.getvalue())
    return output_path

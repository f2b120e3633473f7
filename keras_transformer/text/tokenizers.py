"""Source and target tokenizers for a language pair: shared vocabulary or one each."""

import pathlib
import random

from keras_transformer.text.sentencepiece_trainer import train_sentencepiece
from keras_transformer.text.subword_tokenizer import MODEL_FILENAME, SubwordTokenizer

# File names `train_tokenizers` writes for separate vocabularies.
SOURCE_FILENAME = "source.model"
TARGET_FILENAME = "target.model"


def _as_str(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if hasattr(value, "numpy"):
        return _as_str(value.numpy())
    return str(value)


def reservoir_sample(items, max_items, seed=0):
    """A uniform random sample of at most `max_items` items, in one pass over `items`.

    Reservoir sampling (Vitter's algorithm R): memory holds `max_items` items whatever the
    length of the stream. With fewer items than `max_items` every item is returned, in
    order.

    Args:
        items: any iterable.
        max_items: int, the sample size.
        seed: int, seed of the sample. Defaults to `0`.

    Returns:
        list, the sample.

    Example:

    >>> len(reservoir_sample(range(10**5), 1000))
    1000
    """
    rng = random.Random(seed)
    reservoir = []
    for index, item in enumerate(items):
        if index < max_items:
            reservoir.append(item)
        else:
            slot = rng.randint(0, index)
            if slot < max_items:
                reservoir[slot] = item
    return reservoir


def _split_pairs(pairs, src_lang, tgt_lang, max_pairs=None, seed=0, max_chars=None):
    """Returns (source sentences, target sentences) as two lists of str.

    With `max_pairs`, a uniform sample of at most that many pairs (one streaming pass);
    with `max_chars`, a sample of more characters (both sides) is cut to a uniform subset
    of its pairs within that many (at least one pair), keeping their order.
    """
    if hasattr(pairs, "as_numpy_iterator"):  # tf.data.Dataset of {lang: string}
        pairs = pairs.as_numpy_iterator()
    elif isinstance(pairs, dict):  # {lang: list of sentences}
        pairs = zip(pairs[src_lang], pairs[tgt_lang])
    if max_pairs:
        pairs = reservoir_sample(pairs, max_pairs, seed)
    sources, targets = [], []
    for pair in pairs:
        if isinstance(pair, dict):
            source, target = pair[src_lang], pair[tgt_lang]
        else:  # a (source, target) tuple
            source, target = pair
        sources.append(_as_str(source))
        targets.append(_as_str(target))
    if max_chars and sum(map(len, sources)) + sum(map(len, targets)) > max_chars:
        order = list(range(len(sources)))
        # Its own random numbers: the sample's stream (the same seed) would leave out first
        # the slots the sample filled last.
        random.Random(f"{seed}:max_chars").shuffle(order)
        kept, total = [], 0
        for index in order:
            total += len(sources[index]) + len(targets[index])
            if total > max_chars and kept:
                break
            kept.append(index)
        kept.sort()
        sources, targets = [sources[i] for i in kept], [targets[i] for i in kept]
    return sources, targets


def train_tokenizers(
    pairs,
    src_lang="en",
    tgt_lang="de",
    vocab_size=8000,
    shared=True,
    output_dir=".",
    max_pairs=None,
    seed=0,
    max_chars=None,
    **sentencepiece_options,
):
    """Trains the tokenizers of a language pair and saves their `.model` files.

    With `shared=True` (the default) one vocabulary is trained on the source and target
    sentences together and saved as `output_dir/tokenizer.model`; both returned tokenizers
    are the same object, so a model can tie its embeddings and a SavedModel stores one
    asset. With `shared=False` each language gets its own vocabulary of `vocab_size`
    pieces, saved as `source.model` and `target.model`. The other layout's files in
    `output_dir` (from an earlier call) are removed.

    Args:
        pairs: the parallel text: a `tf.data.Dataset` of `{lang: string}` (what
            `load_multi30k` returns), an iterable of such dicts or of
            `(source, target)` tuples, or a dict `{lang: list of str}`.
        src_lang: str, source language key. Defaults to `"en"`.
        tgt_lang: str, target language key. Defaults to `"de"`.
        vocab_size: int, pieces per vocabulary. Defaults to `8000`.
        shared: bool, one vocabulary for both languages. Defaults to `True`.
        output_dir: str or path-like, created if missing. Defaults to `"."`.
        max_pairs: int or None, train on a uniform random sample of at most this many
            pairs, drawn in one streaming pass (reservoir sampling), so a corpus of
            millions of pairs costs only the sample in memory and in SentencePiece's
            training time. Defaults to `None` (every pair).
        seed: int, seed of the sample. Defaults to `0`.
        max_chars: int or None, at most this many characters (both sides) of text: a
            larger sample is cut to a uniform subset of its pairs. SentencePiece's memory
            grows with the text (about 20 MiB of RSS per MiB), not with the number of
            lines, so `max_pairs` alone does not bound it on long lines. Defaults to
            `None` (no bound).
        **sentencepiece_options: passed on to `train_sentencepiece`.

    Returns:
        `(source_tokenizer, target_tokenizer)`, two `SubwordTokenizer`s (the same object
        when shared).

    Example:

    >>> pairs = {"en": ["A dog runs.", "Two dogs play in the snow."] * 20,
    ...          "de": ["Ein Hund rennt.", "Zwei Hunde spielen im Schnee."] * 20}
    >>> src_tok, tgt_tok = train_tokenizers(pairs, "en", "de", vocab_size=290,
    ...                                     output_dir="vocab")
    >>> src_tok is tgt_tok
    True
    """
    output_dir = pathlib.Path(output_dir)
    sources, targets = _split_pairs(pairs, src_lang, tgt_lang, max_pairs, seed, max_chars)
    if shared:
        path = train_sentencepiece(
            sources + targets, output_dir / MODEL_FILENAME, vocab_size, **sentencepiece_options
        )
        # The other layout's files go: `load_tokenizers` would read them first, or both.
        for name in (SOURCE_FILENAME, TARGET_FILENAME):
            (output_dir / name).unlink(missing_ok=True)
        tokenizer = SubwordTokenizer(path)
        return tokenizer, tokenizer

    def train_side(side, language, sentences, filename):
        try:
            return train_sentencepiece(sentences, output_dir / filename, vocab_size,
                                       **sentencepiece_options)
        except ValueError as error:  # which side: one vocab_size serves both
            raise ValueError(f"The {side} ({language}) vocabulary: {error}") from None

    source_path = train_side("source", src_lang, sources, SOURCE_FILENAME)
    try:
        target_path = train_side("target", tgt_lang, targets, TARGET_FILENAME)
    except BaseException:
        # No half vocabulary left behind: a retry with other settings starts clean.
        source_path.unlink()
        if not any(output_dir.iterdir()):
            output_dir.rmdir()
        raise
    (output_dir / MODEL_FILENAME).unlink(missing_ok=True)  # the shared layout's
    return SubwordTokenizer(source_path), SubwordTokenizer(target_path)


def load_tokenizers(directory):
    """Loads the tokenizers `train_tokenizers` saved in `directory`.

    Args:
        directory: str or path-like holding `tokenizer.model` (shared) or `source.model`
            and `target.model`.

    Returns:
        `(source_tokenizer, target_tokenizer)`, the same object twice when shared.

    Example:

    >>> pairs = {"en": ["A dog runs.", "Two dogs play in the snow."] * 20,
    ...          "de": ["Ein Hund rennt.", "Zwei Hunde spielen im Schnee."] * 20}
    >>> _ = train_tokenizers(pairs, "en", "de", vocab_size=290, output_dir="vocab")
    >>> src_tok, tgt_tok = load_tokenizers("vocab")
    >>> src_tok.vocab_size
    290
    """
    directory = pathlib.Path(directory)
    if (directory / MODEL_FILENAME).is_file():
        tokenizer = SubwordTokenizer(directory / MODEL_FILENAME)
        return tokenizer, tokenizer
    source, target = directory / SOURCE_FILENAME, directory / TARGET_FILENAME
    if source.is_file() and target.is_file():
        return SubwordTokenizer(source), SubwordTokenizer(target)
    raise FileNotFoundError(
        f"{directory} holds neither {MODEL_FILENAME} nor {SOURCE_FILENAME} and "
        f"{TARGET_FILENAME}; train them with train_tokenizers(..., output_dir=...)."
    )

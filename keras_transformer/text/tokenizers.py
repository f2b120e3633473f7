"""Source and target tokenizers for a language pair: shared vocabulary or one each."""

import pathlib

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


def _split_pairs(pairs, src_lang, tgt_lang):
    """Returns (source sentences, target sentences) as two lists of str."""
    if hasattr(pairs, "as_numpy_iterator"):  # tf.data.Dataset of {lang: string}
        pairs = pairs.as_numpy_iterator()
    elif isinstance(pairs, dict):  # {lang: list of sentences}
        return [_as_str(s) for s in pairs[src_lang]], [_as_str(s) for s in pairs[tgt_lang]]
    sources, targets = [], []
    for pair in pairs:
        if isinstance(pair, dict):
            source, target = pair[src_lang], pair[tgt_lang]
        else:  # a (source, target) tuple
            source, target = pair
        sources.append(_as_str(source))
        targets.append(_as_str(target))
    return sources, targets


def train_tokenizers(
    pairs,
    src_lang="en",
    tgt_lang="de",
    vocab_size=8000,
    shared=True,
    output_dir=".",
    **sentencepiece_options,
):
    """Trains the tokenizers of a language pair and saves their `.model` files.

    With `shared=True` (the default) one vocabulary is trained on the source and target
    sentences together and saved as `output_dir/tokenizer.model`; both returned tokenizers
    are the same object, so a model can tie its embeddings and a SavedModel stores one
    asset. With `shared=False` each language gets its own vocabulary of `vocab_size`
    pieces, saved as `source.model` and `target.model`.

    Args:
        pairs: the parallel text: a `tf.data.Dataset` of `{lang: string}` (what
            `load_multi30k` returns), an iterable of such dicts or of
            `(source, target)` tuples, or a dict `{lang: list of str}`.
        src_lang: str, source language key. Defaults to `"en"`.
        tgt_lang: str, target language key. Defaults to `"de"`.
        vocab_size: int, pieces per vocabulary. Defaults to `8000`.
        shared: bool, one vocabulary for both languages. Defaults to `True`.
        output_dir: str or path-like, created if missing. Defaults to `"."`.
        **sentencepiece_options: passed on to `train_sentencepiece`.

    Returns:
        `(source_tokenizer, target_tokenizer)`, two `SubwordTokenizer`s (the same object
        when shared).

    Example:

    >>> src_tok, tgt_tok = train_tokenizers(
    ...     load_multi30k("train"), "en", "de", vocab_size=8000, output_dir="runs/vocab")
    >>> src_tok is tgt_tok
    True
    """
    output_dir = pathlib.Path(output_dir)
    sources, targets = _split_pairs(pairs, src_lang, tgt_lang)
    if shared:
        path = train_sentencepiece(
            sources + targets, output_dir / MODEL_FILENAME, vocab_size, **sentencepiece_options
        )
        tokenizer = SubwordTokenizer(path)
        return tokenizer, tokenizer
    source_path = train_sentencepiece(
        sources, output_dir / SOURCE_FILENAME, vocab_size, **sentencepiece_options
    )
    target_path = train_sentencepiece(
        targets, output_dir / TARGET_FILENAME, vocab_size, **sentencepiece_options
    )
    return SubwordTokenizer(source_path), SubwordTokenizer(target_path)


def load_tokenizers(directory):
    """Loads the tokenizers `train_tokenizers` saved in `directory`.

    Args:
        directory: str or path-like holding `tokenizer.model` (shared) or `source.model`
            and `target.model`.

    Returns:
        `(source_tokenizer, target_tokenizer)`, the same object twice when shared.

    Example:

    >>> src_tok, tgt_tok = load_tokenizers("runs/vocab")
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

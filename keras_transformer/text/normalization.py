"""The text normalization every tokenizer of keras_transformer applies.

SentencePiece normalizes its input before segmenting it, so `detokenize(tokenize(s))`
returns the *normalized* text, not `s`. `normalize(s)` applies exactly the same rule in
Python, so tests and BLEU can compare a detokenized output with `normalize(reference)`.

The rule (`nmt_nfkc`, SentencePiece's default and the vocabularies' unless trained with
another `normalization`: `nfkc` is step 1 alone, `identity` none; `model_normalization`
reads a model's) is:

1. Unicode NFKC: compatibility characters are folded (`"ﬁ"` -> `"fi"`, full-width
   `"Ｆ"` -> `"F"`, `"½"` -> `"1⁄2"`), composed characters stay composed.
2. NMT rules on top of NFKC: control characters (e.g. `"\\x07"`) are removed, except NUL
   (`"\\x00"`, kept, and tokenized as the byte piece `<0x00>`: in training text and in an
   export's input alike, and a sentence of NUL bytes alone translates to `""`), every
   whitespace variant (tab, newline, no-break space, ideographic space, zero-width space)
   and the replacement character U+FFFD (what invalid UTF-8 bytes become) turn into an
   ASCII space.
3. Whitespace collapsing: leading and trailing spaces are stripped and runs of spaces are
   collapsed to one.

Ordinary cased text (Multi30K, for instance) is unchanged by it except for whitespace.
"""

import functools

import sentencepiece as spm

# The normalization rule name shared by `train_sentencepiece` and `normalize`.
NORMALIZATION_RULE = "nmt_nfkc"


@functools.lru_cache(maxsize=None)
def _normalizer(rule_name):
    # `add_dummy_prefix` and `escape_whitespaces` are segmentation details (the leading
    # "▁"); the detokenized text has neither, so the reference must not have them either.
    return spm.SentencePieceNormalizer(
        rule_name=rule_name,
        add_dummy_prefix=False,
        escape_whitespaces=False,
        remove_extra_whitespaces=True,
    )


def model_normalization(path):
    """The normalization rule a SentencePiece `.model` file was trained with, e.g.
    `"nmt_nfkc"`."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    with open(path, "rb") as f:
        proto.ParseFromString(f.read())
    return proto.normalizer_spec.name


def normalize(text, rule_name=NORMALIZATION_RULE):
    """Normalizes text the way the SentencePiece tokenizers of this package do.

    `detokenize(tokenize(s)) == normalize(s)` for any valid UTF-8 text `s` when the
    tokenizer was trained by `train_sentencepiece` (whose byte fallback makes even
    characters never seen in training round-trip).

    Args:
        text: str, bytes (decoded as UTF-8, invalid bytes replaced by U+FFFD, which the
            rule then turns into a space), or a list of them.
        rule_name: str, the SentencePiece normalization rule. Defaults to `"nmt_nfkc"`,
            the rule `train_sentencepiece` uses.

    Returns:
        The normalized str, or a list of str for a list input.

    Example:

    >>> normalize("  Two\\tdogs  play ﬁne. ")
    'Two dogs play fine.'
    """
    if isinstance(text, (list, tuple)):
        return [normalize(t, rule_name) for t in text]
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    return _normalizer(rule_name).normalize(text)

"""Language codes: read from file names, and what BLEU needs to know of a language.

A module of its own, without TensorFlow: the data sources, the command line, training's
validation BLEU and `evaluate` all use it.
"""

import importlib.util
import pathlib
import re

# A language code inferred from a file name: `train.fr`, `train.fr.gz`, `news.pt_br.txt`.
_LANG_SUFFIX = re.compile(r"^[A-Za-z]{2,3}([_-][A-Za-z]{2,4})?$")
# File suffixes that look like a language code but are not one.
_NOT_LANGUAGES = {"txt", "tsv", "csv", "tok", "raw", "src", "tgt", "ref", "out", "hyp"}
# Languages written without spaces between words, for which sacreBLEU has no tokenizer of
# their own: scored on characters.
# Chinese: `zh` and its ISO 639-3 codes (the macrolanguage's members written in Han
# characters: Mandarin, Cantonese, Literary Chinese, Wu, Hakka, Min, Gan, Xiang), and `cn`,
# a country code used for it.
_CHINESE = {"zh", "zho", "chi", "cn", "cmn", "yue", "lzh", "wuu", "hak", "nan", "cdo", "cpx",
            "czh", "czo", "mnp", "gan", "hsn", "cjy"}
_CHARACTER_SCRIPTS = {"th", "lo", "km", "my", "bo", "dz", "tha", "lao", "khm", "mya", "bod",
                      "dzo"}


def language_from_path(path):
    """The language code in a file name (`train.fr.gz`, `train.fr.txt` -> `fr`), or None.

    The last suffix that is not a compression or a text format (`.gz`, `.txt`, `.tsv`, ...)
    is the code when it looks like one.
    """
    name = pathlib.Path(path).name
    if name.endswith(".gz"):
        name = name[: -len(".gz")]
    suffix = pathlib.Path(name).suffix.lstrip(".")
    if suffix.lower() in _NOT_LANGUAGES:  # `train.fr.txt`: the code comes before
        suffix = pathlib.Path(pathlib.Path(name).stem).suffix.lstrip(".")
    if suffix.lower() in _NOT_LANGUAGES or not _LANG_SUFFIX.match(suffix):
        return None
    return suffix


def languages_from_paths(source_path, target_path):
    """`[source code, target code]` read from two file names (`language_from_path`, None
    where a name has none); `ValueError` when both names give the same code (`train.en.bpe`
    and `train.zh.bpe` both end in `bpe`), which is no direction."""
    named = [language_from_path(source_path), language_from_path(target_path)]
    if named[0] and named[0] == named[1]:
        raise ValueError(
            f"Both file names end in {named[0]!r} ({source_path}, {target_path}), read as "
            "their languages, which must differ: pass --source-lang and --target-lang "
            "(source_lang and target_lang)."
        )
    return named


def bleu_tokenizer(language):
    """The sacreBLEU tokenizer for translations into `language` (a code such as `de`,
    `zh_CN`, or None).

    sacreBLEU's default, `13a`, splits words at spaces and punctuation: a Chinese or
    Japanese sentence would be one word, and BLEU about 0 whatever the translation. As WMT
    scores them: Chinese `zh` (for the codes `zh`, `zho`, `chi`, the country code `cn` and
    the Chinese languages' own codes: `cmn`, `yue`, `lzh`, `wuu`, ...); Japanese (`ja`,
    `jpn`, `jp`) `ja-mecab` when MeCab and its dictionary are installed, else characters; Thai, Lao, Khmer, Burmese, Tibetan and Dzongkha characters;
    every other language `13a`. The BLEU signature printed with a score names the one used.

    Example:

    >>> bleu_tokenizer("de"), bleu_tokenizer("zh_TW"), bleu_tokenizer("th")
    ('13a', 'zh', 'char')
    """
    code = re.split(r"[_-]", (language or "").lower())[0]
    if code in _CHINESE:
        return "zh"
    if code in ("ja", "jpn", "jp"):  # jp: a country code used for it
        mecab = all(importlib.util.find_spec(name) for name in ("MeCab", "ipadic"))
        return "ja-mecab" if mecab else "char"
    if code in _CHARACTER_SCRIPTS:
        return "char"
    return "13a"

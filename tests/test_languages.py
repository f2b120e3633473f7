"""BLEU tokenized as the target language is written: Chinese and Japanese have no spaces."""

import importlib.util

import pytest

from keras_transformer.languages import bleu_tokenizer, language_from_path
from tests.module_loading import pretend_installed

ZH_REFERENCES = ["一只狗在草地上奔跑。", "两个男人在街上说话。", "一个女孩在读书。", "孩子们在公园里玩耍。"]
ZH_HYPOTHESES = ["一只狗在草地上奔跑。", "两个男人在街上说话。", "一个女孩在看书。", "孩子们在公园里玩耍。"]


def test_bleu_tokenizer_by_target_language():
    assert bleu_tokenizer("zh") == bleu_tokenizer("zh_cn") == bleu_tokenizer("ZH-TW") == "zh"
    mecab = all(importlib.util.find_spec(name) for name in ("MeCab", "ipadic"))
    assert bleu_tokenizer("ja") == ("ja-mecab" if mecab else "char")
    assert bleu_tokenizer("th") == bleu_tokenizer("tha") == "char"
    assert bleu_tokenizer("zho") == bleu_tokenizer("zho_Hans") == "zh"  # ISO 639-3 as well
    assert bleu_tokenizer("jpn") == bleu_tokenizer("ja")
    # The other Chinese languages, written in Han characters (FLORES-200 `yue_Hant`):
    # scored with 13a they had BLEU about 0.
    for language in ("yue", "yue_Hant", "lzh", "wuu", "hak", "nan", "gan", "hsn", "cdo"):
        assert bleu_tokenizer(language) == "zh", language
    for language in ("de", "en", "fr", "ko", "el", None, ""):
        assert bleu_tokenizer(language) == "13a"


@pytest.mark.parametrize("installed, expected", [((), "char"), (("MeCab",), "char"),
                                                 (("MeCab", "ipadic"), "ja-mecab")])
def test_japanese_is_tokenized_by_mecab_only_with_its_dictionary(monkeypatch, installed,
                                                                 expected):
    # sacreBLEU's ja-mecab needs both; without them it fails when scoring, not here.
    pretend_installed(monkeypatch, {name: name in installed for name in ("MeCab", "ipadic")})
    assert bleu_tokenizer("ja") == bleu_tokenizer("jpn") == expected


def test_language_from_path_moved_here_and_still_in_sources():
    from keras_transformer.data import sources

    assert language_from_path("corpus/train.fr.gz") == "fr"
    assert sources.language_from_path is language_from_path


def test_chinese_translations_are_scored_on_words_not_whole_sentences():
    # With 13a a Chinese sentence is one token: three of four sentences exactly right
    # scored 0.0 BLEU (a helper's Greek->Chinese run; its best.keras was chosen on zeros).
    from keras_transformer.export.inference import evaluate_translations

    default = evaluate_translations(ZH_HYPOTHESES, ZH_REFERENCES)
    chinese = evaluate_translations(ZH_HYPOTHESES, ZH_REFERENCES, target_lang="zh")
    assert default["bleu"] < 1.0
    assert chinese["bleu"] > 70.0 and "tok:zh" in chinese["bleu_signature"]
    assert "tok:13a" in evaluate_translations(["a b"], ["a b"], target_lang="de")[
        "bleu_signature"]


def test_validation_bleu_of_a_chinese_target_is_tokenized_for_it():
    from keras_transformer.training.callbacks import BleuCallback

    def translate(sentences):
        return ZH_HYPOTHESES[:len(sentences)]

    sources = ["a", "b", "c", "d"]
    assert BleuCallback(translate, sources, ZH_REFERENCES, verbose=0).compute_bleu() < 1.0
    assert BleuCallback(translate, sources, ZH_REFERENCES, verbose=0,
                        target_lang="zh").compute_bleu() == pytest.approx(
        __import__("sacrebleu").corpus_bleu(ZH_HYPOTHESES, [ZH_REFERENCES],
                                            tokenize="zh").score)


def test_a_language_code_before_a_text_suffix_is_read():
    # `train.fr.txt` and `news.pt_br.txt` (the module's own example) gave None, and `train`
    # stopped with "Could not tell the languages".
    assert language_from_path("corpus/train.fr.txt") == "fr"
    assert language_from_path("news.pt_br.txt") == "pt_br"
    assert language_from_path("train.de.txt.gz") == "de"
    assert language_from_path("train.txt") is None and language_from_path("test.tsv.gz") is None


def test_country_codes_used_for_chinese_and_japanese_are_scored_as_those_languages():
    # `train.cn` / `train.jp` (country codes, common in corpora) were scored with 13a: a
    # whole Chinese or Japanese sentence as one word, BLEU near 0.
    assert bleu_tokenizer("cn") == "zh"
    assert bleu_tokenizer("jp") == bleu_tokenizer("ja")

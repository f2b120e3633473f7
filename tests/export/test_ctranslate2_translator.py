"""`keras_transformer.export.ctranslate2_translator`: a converted directory translates raw
sentences as our `translate` signatures do (greedy: the same strings and flags), and
`translate`/`evaluate` take it as `--export`."""

import json

import pytest
import tensorflow as tf

pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install -e .[bench])")

from keras_transformer.export import ctranslate2_converter  # noqa: E402
from keras_transformer.export.ctranslate2_translator import (  # noqa: E402
    CTranslate2Translator,
    read_metadata,
)
from keras_transformer.export.inference import (  # noqa: E402
    evaluate_export,
    is_ctranslate2_model,
    open_translator,
    read_export_metadata,
)

# Short bounds, as the copy task's export: a long sentence is cut.
DECODING = {"beam_size": 3, "length_penalty": 1.0, "max_input_length": 16,
            "max_output_length": 32}


@pytest.fixture(scope="module")
def converted(copy_task, tmp_path_factory):
    path = tmp_path_factory.mktemp("ct2") / "model"
    return ctranslate2_converter.convert(
        copy_task.model, copy_task.tokenizer, copy_task.tokenizer, path,
        metadata={"target_lang": "xx", "decoding": DECODING})


def _ours(copy_task, sentences, model=None, **config):
    """Our in-graph translator's outputs as lists (translation str, flags bool, ...)."""
    from keras_transformer.export import DecodingConfig, Translator

    translator = Translator(model or copy_task.model, copy_task.tokenizer, copy_task.tokenizer,
                            DecodingConfig(max_input_length=DECODING["max_input_length"],
                                           max_output_length=DECODING["max_output_length"],
                                           **config))
    outputs = translator.translate(tf.constant(sentences))
    return {name: [v.decode() if isinstance(v, bytes) else v
                   for v in outputs[name].numpy().tolist()]
            for name in ("translation", "truncated", "length", "unfinished", "score")}


@pytest.mark.slow
def test_greedy_translations_and_flags_are_those_of_our_translator(copy_task, converted):
    long_sentence = " ".join(copy_task.held_out[:6])  # more than 16 pieces: cut
    no_text = ["", " \n ", "\x00", "\u200b\u2060", "\ufeff\u200f"]  # NUL, zero-width, bidi
    sentences = copy_task.held_out[:12] + [f"  {copy_task.held_out[0]}\t", long_sentence,
                                           *no_text]
    ours = _ours(copy_task, sentences, search="greedy")
    theirs = CTranslate2Translator(converted, signature="translate_greedy").translate(sentences)
    for name in ("translation", "truncated", "length", "unfinished"):
        assert [r[name] for r in theirs] == ours[name], name
    # Greedy scores are log-probabilities in both (UNK masked before or after the softmax).
    # CTranslate2's float32 kernels round otherwise than TensorFlow's, by CPU: on an AMD
    # EPYC the cut sentence's -2.1384 was -2.1366 there (0.08%; UNK masking changes
    # neither), which the absolute 1e-3 that held on Intel Xeons refused.
    assert [r["score"] for r in theirs] == pytest.approx(ours["score"], rel=2e-3, abs=1e-3)
    assert ours["truncated"][13] and not any(ours["truncated"][:13])
    assert ours["translation"][-5:] == [""] * 5 and ours["score"][-5:] == [0.0] * 5
    # The copy model copies: compared on real translations, not empty ones.
    assert sum(t == s for t, s in zip(ours["translation"], sentences[:12])) >= 10


@pytest.mark.slow
@pytest.mark.parametrize("alpha", [0.6, 3.0])
def test_beam_search_is_ours_with_ctranslate2s_penalty_and_early_stopping(
        copy_task, tmp_path, alpha):
    """On a model unsure enough that the penalty changes translations (as the converter's
    test), so a translator that dropped its beam size or penalty would differ."""
    from tests.export.conftest import flattened_copy

    model = flattened_copy(copy_task.model, 0.25)
    path = ctranslate2_converter.convert(model, copy_task.tokenizer, copy_task.tokenizer,
                                         tmp_path / "ct2", metadata={"decoding": DECODING})
    sentences = copy_task.held_out[:16]
    ours = _ours(copy_task, sentences, model=model, beam_size=3, alpha=alpha,
                 length_penalty_form="power", early_stopping=True)
    theirs = CTranslate2Translator(path, length_penalty=alpha)(sentences)  # beam 3: recorded
    # Float32 in both engines, UNK masked at another place: one near-tie may flip.
    assert sum(a != b for a, b in zip(theirs, ours["translation"])) <= 1
    greedy = _ours(copy_task, sentences, model=model, search="greedy")["translation"]
    assert theirs != greedy  # the beam reaches other translations here


@pytest.mark.slow
def test_a_translation_cut_by_the_length_bound_is_unfinished(copy_task, converted):
    sentence = copy_task.held_out[0]  # 2-6 words, more than 2 pieces with END
    result = CTranslate2Translator(converted, max_output_length=2).translate([sentence])[0]
    assert result["unfinished"] and result["length"] == 2
    finished = CTranslate2Translator(converted).translate([sentence])[0]
    assert not finished["unfinished"] and finished["translation"] == sentence


def test_the_directory_is_self_contained_and_recognized(converted, tmp_path):
    metadata = read_metadata(converted)
    assert metadata["decoding"] == DECODING and metadata["target_lang"] == "xx"
    assert read_export_metadata(converted) == metadata
    assert is_ctranslate2_model(converted) and not is_ctranslate2_model(tmp_path)
    for name in ("model.bin", "config.json", "source.model", "target.model"):
        assert (converted / name).is_file(), name
    with pytest.raises(FileNotFoundError, match="no model.bin, source.model"):
        read_metadata(tmp_path)
    with pytest.raises(FileExistsError, match="already holds a CTranslate2 model"):
        ctranslate2_converter.convert(None, None, None, converted)


def test_settings_are_checked(converted, tmp_path):
    with pytest.raises(ValueError, match="no signature 'translate_seeded'"):
        CTranslate2Translator(converted, signature="translate_seeded")
    with pytest.raises(ValueError, match="compute_type 'int9' is not supported"):
        CTranslate2Translator(converted, compute_type="int9")
    with pytest.raises(ValueError, match="beam_size must be an integer >= 1, got 0"):
        CTranslate2Translator(converted, beam_size=0)
    with pytest.raises(ValueError, match="max_output_length must be an integer >= 1"):
        CTranslate2Translator(converted, max_output_length=0)
    with pytest.raises(ValueError, match="length_penalty must be a number >= 0"):
        CTranslate2Translator(converted, length_penalty=float("nan"))
    with pytest.raises(TypeError, match="got one str"):
        CTranslate2Translator(converted).translate("ka lo")
    # A directory that is not a CTranslate2 model (a SavedModel) takes no compute type.
    (tmp_path / "saved_model.pb").write_bytes(b"")  # found as a SavedModel, not loaded
    with pytest.raises(ValueError, match="compute_type='int8' is a setting of CTranslate2"):
        open_translator(tmp_path, compute_type="int8")


def test_lengths_past_the_position_table_are_refused_before_any_translation(
        copy_task, converted, tmp_path):
    # A translation reaching past the position table failed inside CTranslate2, its whole
    # batch lost (a traceback from `translate`): only `export-ctranslate2` checked.
    from keras_transformer.model import build_transformer

    assert read_metadata(converted)["positions"] == {"source": 1024, "target": 1024}
    with pytest.raises(ValueError, match="max_output_length=1025 exceeds the target "
                       "position table \\(1024 positions\\)"):
        CTranslate2Translator(converted, max_output_length=1025)
    CTranslate2Translator(converted, max_output_length=1024)  # the table's last position

    # `convert` itself, with a learned table shorter than the decoding bounds.
    learned = build_transformer(copy_task.tokenizer.vocab_size, d_model=16, num_heads=2,
                                ff_dim=32, num_layers=1, learned_positions=True, max_length=20)
    with pytest.raises(ValueError, match="max_output_length=32 exceeds the target position "
                       "table \\(20 positions"):
        ctranslate2_converter.convert(learned, copy_task.tokenizer, copy_task.tokenizer,
                                      tmp_path / "learned", metadata={"decoding": DECODING})
    assert not (tmp_path / "learned").exists()
    # A sinusoid table is written as long as the bounds need.
    longer = ctranslate2_converter.convert(
        copy_task.model, copy_task.tokenizer, copy_task.tokenizer, tmp_path / "long",
        metadata={"decoding": {"max_input_length": 16, "max_output_length": 2000}})
    assert read_metadata(longer)["positions"] == {"source": 2000, "target": 2000}


def test_a_missing_ctranslate2_says_how_to_install_it(converted, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import fails
    with pytest.raises(ImportError, match=r"pip install 'keras-transformer\[ctranslate2\]'"):
        CTranslate2Translator(converted)


@pytest.mark.slow
def test_evaluate_export_scores_a_ctranslate2_model(copy_task, converted):
    sentences = copy_task.held_out[:8]
    scores = evaluate_export(converted, sentences, sentences, batch_size=4,
                             signature="translate_greedy", compute_type="int8")
    assert scores["bleu"] > 80 and scores["model_path"] == str(converted)
    # Two evaluations of one directory, in int8 and as saved, are told apart.
    assert scores["compute_type"] == "int8"
    json.dumps({k: v for k, v in scores.items() if k != "translations"})


@pytest.mark.slow
def test_the_readmes_serving_code_gives_the_translators_translations(copy_task, tmp_path):
    # README, "The same weights in CTranslate2": ctranslate2 and sentencepiece alone, with
    # the settings CTranslate2Translator uses (the directory's defaults: beam 4, alpha 1.0,
    # 128 tokens in and out), translate as it does, a source cut to 128 tokens included.
    import pathlib
    import re

    path = ctranslate2_converter.convert(copy_task.model, copy_task.tokenizer,
                                         copy_task.tokenizer, tmp_path / "ct2")
    readme = pathlib.Path(__file__).resolve().parents[2] / "README.md"
    text = readme.read_text(encoding="utf-8")
    section = text[text.index("### The same weights in CTranslate2"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    code = code.replace('"runs/quick/ctranslate2"', repr(str(path)))
    long_sentence = " ".join(copy_task.held_out[:40])
    # Lines without text: empty, NUL and C1 controls (byte-fallback pieces, which the
    # snippet translated into garbage), a zero-width space and a BOM.
    no_text = ["", "\x00", "\u0080", "\u200b", "\ufeff "]
    sentences = [f" {s} " for s in copy_task.held_out[:8]] + [long_sentence, *no_text]
    names = {"sentences": sentences}
    exec(compile(code, "README.md", "exec"), names)
    translator = CTranslate2Translator(path, compute_type="int8")
    expected = translator.translate(sentences)
    assert expected[-len(no_text) - 1]["truncated"]  # the README's cut is exercised
    assert names["translations"] == [r["translation"] for r in expected]
    assert names["translations"][-len(no_text):] == [""] * len(no_text)
    assert sum(r["translation"] == s.strip() for r, s in zip(expected, sentences)) >= 6

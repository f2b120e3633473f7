"""Mixed precision for real: a few training steps with loss scaling, the cached decoder
and an export, under `mixed_float16` and `mixed_bfloat16` (tiny models); `precision="auto"`
read from the CPU's flags."""

import random

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.export import DecodingConfig, Translator, export_translator
from keras_transformer.model import build_transformer
from keras_transformer.text import SubwordTokenizer, train_sentencepiece
from keras_transformer.training import get_preset, presets
from keras_transformer.training.presets import cpu_has_native_bf16, resolve_precision
from keras_transformer.training.trainer import compile_model, train

WORDS = "ka lo mi nu pe ra si tu vo xe bal dor fen gim".split()
# Byte fallback alone needs 256 pieces plus the 4 reserved ids.
VOCAB_SIZE = 300
STEPS = 8


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    rng = random.Random(0)
    sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5)))
                 for _ in range(500)]
    path = train_sentencepiece(sentences, tmp_path_factory.mktemp("vocab") / "tokenizer.model",
                               vocab_size=VOCAB_SIZE, hard_vocab_limit=False)
    return SubwordTokenizer(path), sentences


def _batch(tokenizer, sentences):
    """A copy-task batch: the source is the target."""
    source = tokenizer.tokenize(tf.constant(sentences), add_end=True).to_tensor().numpy()
    decoder = tokenizer.tokenize(tf.constant(sentences), add_start=True).to_tensor().numpy()
    return {"encoder_tokens": source, "decoder_tokens": decoder}, source


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_policy_trains_decodes_and_exports(policy, tokenizer, tmp_path):
    tokenizer, sentences = tokenizer
    keras.config.set_dtype_policy(policy)
    config = get_preset("tiny").replace(precision=policy, warmup_steps=2, lr_scale=0.1,
                                        global_clipnorm=1.0)
    model = build_transformer(tokenizer.vocab_size, d_model=16, num_heads=2, ff_dim=32,
                              num_layers=1, dropout=0.0, max_length=32)
    compile_model(model, config)
    if policy == "mixed_float16":  # Keras wraps the optimizer for loss scaling itself
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert any(layer.compute_dtype == policy.split("_")[1] for layer in model.layers)

    inputs, labels = _batch(tokenizer, sentences[:32])
    losses = [float(np.ravel(model.train_on_batch(inputs, labels))[0]) for _ in range(STEPS)]
    assert np.all(np.isfinite(losses)), losses
    assert losses[-1] < losses[0], losses
    assert all(np.all(np.isfinite(w)) for w in model.get_weights())

    sources = sentences[:3]
    cached = Translator(model, tokenizer, tokenizer, DecodingConfig(
        search="greedy", max_input_length=16, extra_length=4, max_output_length=16))
    translations = cached(sources)
    assert len(translations) == 3 and all(isinstance(t, str) for t in translations)

    path = export_translator(cached, tmp_path / "export")
    loaded = tf.saved_model.load(str(path))
    result = loaded.signatures["translate"](text=tf.constant(sources))
    exported = [t.decode("utf-8") for t in result["translation"].numpy()]
    assert exported == translations
    assert np.all(np.isfinite(result["score"].numpy()))


_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse2 avx2 avx512f avx512_vnni {extra}
bogomips\t: 4800.00
"""


@pytest.mark.parametrize("extra,native", [("avx512_bf16", True), ("amx_bf16 amx_tile", True),
                                          ("avx512bw", False), ("", False)])
def test_native_bf16_is_read_from_the_cpu_flags(tmp_path, extra, native):
    path = tmp_path / "cpuinfo"
    path.write_text(_CPUINFO.format(extra=extra))
    assert cpu_has_native_bf16(path) is native
    assert resolve_precision("auto", path, gpus=0) == ("mixed_bfloat16" if native else None)
    # A GPU machine keeps float32: the flag says nothing about the GPU's arithmetic.
    assert resolve_precision("auto", path, gpus=1) is None


def test_flag_names_match_whole_words_and_a_missing_file_means_no(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(_CPUINFO.format(extra="avx512_bf16x"))  # not a real flag: no substring match
    assert not cpu_has_native_bf16(path)
    assert not cpu_has_native_bf16(tmp_path / "missing")
    for policy in (None, "mixed_bfloat16", "mixed_float16"):
        assert resolve_precision(policy, tmp_path / "missing", gpus=0) == policy


@pytest.mark.slow
@pytest.mark.parametrize("native", [True, False], ids=["bf16_cpu", "other_cpu"])
def test_auto_precision_trains_in_bf16_only_on_a_bf16_cpu(tmp_path, monkeypatch, capsys, native):
    """`precision="auto"` through `train`: the policy follows the (patched) CPU check."""
    monkeypatch.setattr(presets, "cpu_has_native_bf16", lambda *args: native)
    pairs = [f"{a} {b}\t{b} {a}" for a in WORDS for b in WORDS[:6]]
    (tmp_path / "train.tsv").write_text("\n".join(pairs) + "\n")
    config = get_preset("tiny").replace(
        data="tsv", data_files={"train": str(tmp_path / "train.tsv")}, source_lang="fr",
        target_lang="en", vocab_size=290, d_model=16, num_heads=2, ff_dim=32, num_layers=1,
        max_length=16, epochs=1, bleu_sentences=0, precision="auto")
    run = train(config, tmp_path / "run", report_padding=False, verbose=0)
    expected = "bfloat16" if native else "float32"
    assert run.model.get_layer("encoder").compute_dtype == expected
    assert np.isfinite(run.history["loss"][-1])
    assert f"precision 'auto': {'mixed_bfloat16' if native else 'float32'}" in capsys.readouterr().out

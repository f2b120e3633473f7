"""Mixed precision for real: a few training steps with loss scaling, the cached decoder
and an export, under `mixed_float16` and `mixed_bfloat16` (tiny models)."""

import random

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.export import DecodingConfig, Translator, export_translator
from keras_transformer.model import build_transformer
from keras_transformer.text import SubwordTokenizer, train_sentencepiece
from keras_transformer.training import get_preset
from keras_transformer.training.trainer import compile_model

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

"""The README's Python examples run as written, given the inputs they leave to the reader."""

import pathlib
import re

import numpy as np

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _python_block(after_heading):
    text = README.read_text(encoding="utf-8")
    section = text[text.index(after_heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_layers_example_runs_and_gives_the_shapes_it_shows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    source_ids = rng.integers(1, 8000, size=(2, 7)).astype("int32")
    source_ids[1, 5:] = 0  # padding
    target_in = rng.integers(1, 8000, size=(2, 5)).astype("int32")
    names = {"source_ids": source_ids, "target_in": target_in}
    exec(compile(_python_block("## Using the layers"), "README.md", "exec"), names)
    assert tuple(names["logits"].shape) == (2, 5, 8000)  # (B, T, 8000)
    assert tuple(names["x"].shape) == (2, 7, 256)  # (B, S, 256)
    assert tuple(names["out"].shape) == (2, 7, 256)
    assert tuple(names["scores"].shape) == (2, 4, 7, 7)  # (B, heads, T, S)


def test_the_scores_of_a_layer_already_in_a_model_as_the_readme_says():
    # README, "Attention scores of a layer already in a model": a second symbolic call
    # cannot make a keras.Model (a Keras limit); the eager call and a fresh layer with the
    # same weights give the scores, the same ones.
    import keras
    import pytest

    from keras_transformer import build_transformer
    from keras_transformer.layers import Encoder

    model = build_transformer(vocab_size=50, d_model=16, num_heads=2, ff_dim=32, num_layers=1)
    tokens = model.input["encoder_tokens"]
    encoder, embedding = model.get_layer("encoder"), model.get_layer("embedding")
    _, scores = encoder(embedding(tokens), return_attention_scores=True)
    with pytest.raises(ValueError, match="not connected"):
        keras.Model(tokens, scores)
    fresh = Encoder.from_config(encoder.get_config())
    _, scores = fresh(embedding(tokens), return_attention_scores=True)
    fresh.set_weights(encoder.get_weights())
    ids = np.array([[5, 6, 7, 2, 0]], "int32")
    eager = encoder(embedding(ids), return_attention_scores=True)[1]
    np.testing.assert_allclose(np.asarray(keras.Model(tokens, scores)(ids)),
                               np.asarray(eager[0]), atol=1e-6)

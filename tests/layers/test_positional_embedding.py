import math

import numpy as np
import pytest

from keras_transformer.layers import PositionalEmbedding, sinusoidal_encoding
from tests.layer_checks import to_numpy, run_layer_checks

V, D = 20, 8


IDS = np.array([[3, 4, 5, 0], [6, 7, 0, 0]], "int32")


@pytest.mark.parametrize("learned", [False, True], ids=["sinusoidal", "learned"])
def test_standard_layer_checks(learned):
    run_layer_checks(
        PositionalEmbedding,
        {"vocab_size": V, "d_model": D, "max_length": 16, "dropout": 0.1,
         "learned_positions": learned},
        IDS,
        expected_output_shape=(2, 4, D),
        expected_num_trainable_weights=2 if learned else 1,
        expected_num_params=V * D + (16 * D if learned else 0),
    )


def test_sinusoid_values_are_the_papers():
    encoding = to_numpy(sinusoidal_encoding(3, 4))
    # PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...); d = 4 -> rates 1, 1/100.
    expected = np.array(
        [
            [0.0, 1.0, 0.0, 1.0],
            [0.8414709848, 0.5403023059, 0.0099998333, 0.9999500004],
            [0.9092974268, -0.4161468365, 0.0199986667, 0.9998000067],
        ]
    )
    np.testing.assert_allclose(encoding, expected, atol=1e-6)
    wide = to_numpy(sinusoidal_encoding(50, 512))
    # Position 49, dimensions 100 and 101: i = 50, rate 10000^(-100/512).
    angle = 49 / 10000 ** (100 / 512)
    np.testing.assert_allclose(wide[49, 100:102], [math.sin(angle), math.cos(angle)], atol=1e-5)


def test_sinusoid_start_index_continues_the_sequence():
    np.testing.assert_allclose(
        to_numpy(sinusoidal_encoding(3, D, start_index=5)), to_numpy(sinusoidal_encoding(8, D))[5:],
        atol=1e-6,
    )


def test_output_is_scaled_embedding_plus_encoding():
    layer = PositionalEmbedding(V, D, dropout=0.5)
    out = to_numpy(layer(IDS, training=False))
    table = to_numpy(layer.embeddings)
    expected = table[IDS] * math.sqrt(D) + to_numpy(sinusoidal_encoding(4, D))[None]
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)


def test_dropout_applies_to_the_sum_in_training_only():
    layer = PositionalEmbedding(V, D, dropout=0.5)
    inference = to_numpy(layer(IDS, training=False))
    training = to_numpy(layer(IDS, training=True))
    zeroed = training == 0.0
    assert 0.2 < zeroed.mean() < 0.8
    np.testing.assert_allclose(training[~zeroed], 2.0 * inference[~zeroed], rtol=1e-5)


def test_padding_id_zero_produces_a_keras_mask():
    layer = PositionalEmbedding(V, D)
    np.testing.assert_array_equal(to_numpy(layer.compute_mask(IDS)), IDS != 0)
    out = layer(IDS)
    np.testing.assert_array_equal(to_numpy(out._keras_mask), IDS != 0)
    assert PositionalEmbedding(V, D, mask_zero=False).compute_mask(IDS) is None


@pytest.mark.parametrize("learned", [False, True], ids=["sinusoidal", "learned"])
def test_start_index_matches_the_full_sequence(learned):
    layer = PositionalEmbedding(V, D, learned_positions=learned, max_length=8)
    full = to_numpy(layer(IDS))
    np.testing.assert_allclose(to_numpy(layer(IDS[:, 2:], start_index=2)), full[:, 2:], atol=1e-6)


def test_reverse_projects_onto_the_embedding_matrix():
    layer = PositionalEmbedding(V, D)
    layer.build()
    hidden = np.random.default_rng(0).normal(size=(2, 3, D)).astype("float32")
    logits = to_numpy(layer(hidden, reverse=True))
    np.testing.assert_allclose(logits, hidden @ to_numpy(layer.embeddings).T, rtol=1e-5, atol=1e-5)
    assert layer.compute_mask(hidden) is None


def test_invalid_settings_raise():
    with pytest.raises(ValueError, match="d_model=7"):
        PositionalEmbedding(V, 7)
    PositionalEmbedding(V, 7, learned_positions=True)  # odd width is fine when learned
    with pytest.raises(ValueError, match="vocab_size=0"):
        PositionalEmbedding(0, D)

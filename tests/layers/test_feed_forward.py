import keras
import numpy as np
import pytest

from keras_transformer.layers import FeedForward
from tests.layer_checks import run_layer_checks


def test_standard_layer_checks():
    run_layer_checks(
        FeedForward,
        {"ff_dim": 16, "dropout": 0.1},
        np.random.default_rng(0).normal(size=(2, 4, 8)).astype("float32"),
        expected_output_shape=(2, 4, 8),
        expected_num_trainable_weights=4,
        expected_num_params=2 * 8 * 16 + 16 + 8,
    )


def test_computes_relu_network_per_position():
    layer = FeedForward(ff_dim=16)
    x = np.random.default_rng(1).normal(size=(2, 4, 8)).astype("float32")
    out = keras.ops.convert_to_numpy(layer(x))
    w1, b1, w2, b2 = (keras.ops.convert_to_numpy(w) for w in layer.weights)
    np.testing.assert_allclose(out, np.maximum(x @ w1 + b1, 0) @ w2 + b2, rtol=1e-5, atol=1e-5)


def test_a_seeded_initializer_gives_each_kernel_its_own_values():
    def kernels():
        layer = FeedForward(ff_dim=16, kernel_initializer=keras.initializers.GlorotUniform(seed=3))
        layer.build((2, 4, 8))
        dense_layers = (layer._inner_dense, layer._output_dense)
        return [keras.ops.convert_to_numpy(dense.kernel) for dense in dense_layers]

    inner, output = kernels()
    # (8, 16) and (16, 8) kernels from one seed would hold the same values in the same order.
    assert not np.array_equal(inner.ravel(), output.ravel())
    again = kernels()
    np.testing.assert_array_equal(again[0], inner)  # and the seed still fixes them
    np.testing.assert_array_equal(again[1], output)


def test_invalid_ff_dim_raises():
    with pytest.raises(ValueError, match="ff_dim=0"):
        FeedForward(ff_dim=0)

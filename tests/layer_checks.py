"""The standard checks every layer of the package passes (STYLE.md: one shared helper)."""

import json

import keras
import numpy as np


def to_numpy(x):
    """A tensor as a NumPy array."""
    return keras.ops.convert_to_numpy(x)


def random_array(*shape, seed=0):
    """Standard-normal float32 array of `shape`, reproducible by `seed`."""
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def run_layer_checks(
    layer_cls,
    init_kwargs,
    inputs,
    expected_output_shape,
    expected_num_trainable_weights,
    call_kwargs=None,
    expected_num_params=None,
):
    """Config/JSON round trip, symbolic call, eager call, weight count and one `fit` step.

    Args:
        layer_cls: the layer class.
        init_kwargs: dict of constructor arguments.
        inputs: a NumPy array, or a tuple of arrays passed positionally.
        expected_output_shape: tuple, shape of the (first) output for `inputs`.
        expected_num_trainable_weights: int, number of trainable variables after building.
        call_kwargs: dict of extra call keyword arguments.
        expected_num_params: int or None, total trainable parameter count.
    """
    call_kwargs = call_kwargs or {}
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)

    # Config round trip, through JSON like a .keras file.
    layer = layer_cls(**init_kwargs)
    config = layer.get_config()
    for key in init_kwargs:
        assert key in config, f"get_config() lacks constructor argument {key!r}"
    revived = layer_cls.from_config(config)
    assert revived.get_config() == config
    serialized = json.dumps(keras.saving.serialize_keras_object(layer))
    revived = keras.saving.deserialize_keras_object(json.loads(serialized))
    assert type(revived) is layer_cls and revived.get_config() == config

    # Symbolic call (functional API).
    symbolic_inputs = [
        keras.Input(shape=x.shape[1:], batch_size=x.shape[0], dtype=str(x.dtype)) for x in inputs
    ]
    symbolic_output = layer_cls(**init_kwargs)(*symbolic_inputs, **call_kwargs)
    assert tuple(symbolic_output.shape) == tuple(expected_output_shape)

    # Eager call.
    layer = layer_cls(**init_kwargs)
    output = layer(*inputs, **call_kwargs)
    assert tuple(output.shape) == tuple(expected_output_shape)
    assert np.all(np.isfinite(keras.ops.convert_to_numpy(output)))
    assert len(layer.trainable_weights) == expected_num_trainable_weights
    if expected_num_params is not None:
        assert sum(int(np.prod(w.shape)) for w in layer.trainable_weights) == expected_num_params

    # One fit step moves every trainable weight.
    model = keras.Model(symbolic_inputs, layer_cls(**init_kwargs)(*symbolic_inputs, **call_kwargs))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = [keras.ops.convert_to_numpy(w).copy() for w in model.trainable_weights]
    target = np.random.default_rng(0).normal(size=expected_output_shape).astype("float32")
    model.fit(list(inputs) if len(inputs) > 1 else inputs[0], target, epochs=1, verbose=0)
    after = [keras.ops.convert_to_numpy(w) for w in model.trainable_weights]
    unchanged = [w.path for w, b, a in zip(model.trainable_weights, before, after)
                 if np.array_equal(b, a)]
    assert not unchanged, f"weights not updated by one fit step: {unchanged}"
    return layer

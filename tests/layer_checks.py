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


def _symbolic_like(x):
    """A `keras.Input` with the shape (batch included) and dtype of array `x`."""
    return keras.Input(shape=x.shape[1:], batch_size=x.shape[0], dtype=str(x.dtype))


def assert_symbolic_call_matches_eager(layer, inputs, call_kwargs=None):
    """A symbolic call returns the same nest of tensors as an eager call of the same layer.

    The structure (tuples, lists, dicts), every dtype and every statically known dimension
    must agree; a dimension the symbolic call leaves `None` may be anything eagerly.

    Args:
        layer: a layer instance (built by the eager call if not yet built).
        inputs: a NumPy array, or a tuple of arrays passed positionally.
        call_kwargs: dict of extra call keyword arguments (tensors in it stay eager).
    """
    call_kwargs = call_kwargs or {}
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    eager = layer(*inputs, **call_kwargs)
    symbolic = layer(*[_symbolic_like(x) for x in inputs], **call_kwargs)
    keras.tree.assert_same_structure(eager, symbolic)
    # One tensor object in two places of the nest is one output to a functional model
    # (`Decoder`'s blocks' scores had been the last block's).
    flat = keras.tree.flatten(symbolic)
    assert len({id(spec) for spec in flat}) == len(flat), "a symbolic output is repeated"
    for eager_tensor, spec in zip(keras.tree.flatten(eager), flat):
        assert isinstance(spec, keras.KerasTensor), type(spec)
        eager_dtype = keras.backend.standardize_dtype(eager_tensor.dtype)
        assert spec.dtype == eager_dtype, (spec, eager_dtype)
        assert len(spec.shape) == len(eager_tensor.shape), (spec, eager_tensor.shape)
        for static, actual in zip(spec.shape, eager_tensor.shape):
            assert static is None or static == actual, (spec.shape, eager_tensor.shape)


def assert_functional_model_round_trip(layer_cls, init_kwargs, inputs, call_kwargs, path):
    """A functional model with every output of one call builds, fits, saves and reloads.

    The model outputs the flattened nest the layer returns (for instance `[outputs,
    scores]`); one `fit` step trains on the first output; the `.keras` file at `path` must
    load with `safe_mode=True` and give identical outputs.

    Args:
        layer_cls: the layer class.
        init_kwargs: dict of constructor arguments.
        inputs: a NumPy array, or a tuple of arrays passed positionally.
        call_kwargs: dict of call keyword arguments that ask for extra outputs.
        path: where to write the `.keras` file.

    Returns:
        The list of the reloaded model's outputs on `inputs`.
    """
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    symbolic_inputs = [_symbolic_like(x) for x in inputs]
    layer = layer_cls(**init_kwargs)
    outputs = keras.tree.flatten(layer(*symbolic_inputs, **call_kwargs))
    assert len(outputs) > 1, "the call asked for extra outputs but returned one tensor"
    model = keras.Model(symbolic_inputs, outputs)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=["mse"] + [None] * (len(outputs) - 1))
    target = random_array(*inputs[0].shape[:-1], outputs[0].shape[-1], seed=3)
    before = [to_numpy(w).copy() for w in model.trainable_weights]
    model.fit(list(inputs), target, epochs=1, batch_size=inputs[0].shape[0], verbose=0)
    assert any(not np.array_equal(b, to_numpy(w)) for b, w in zip(before, model.trainable_weights))
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    expected = model.predict(list(inputs), verbose=0)
    actual = reloaded.predict(list(inputs), verbose=0)
    assert len(actual) == len(expected) == len(outputs)
    for a, e in zip(actual, expected):
        np.testing.assert_array_equal(a, e)
    # Each output is the one the layer returns there when called on the arrays (not only
    # of its shape: a functional model had output one block's scores for every block).
    eager = keras.tree.flatten(layer(*inputs, **call_kwargs))
    for a, e in zip(actual, eager, strict=True):
        np.testing.assert_allclose(a, to_numpy(e), rtol=1e-5, atol=1e-5)
    return actual

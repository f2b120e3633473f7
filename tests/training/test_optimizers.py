"""Gradient clipping: per-variable `clipnorm` vs the global norm papers mean."""

import keras
import numpy as np
import pytest

from keras_transformer.training.optimizers import make_optimizer
from keras_transformer.training.presets import get_preset
from keras_transformer.training.trainer import compile_model


def _clipped_gradients(**clipping):
    """The gradients the optimizer applies for two variables with norms 3 and 4."""
    optimizer = make_optimizer(d_model=4, warmup_steps=1, **clipping)
    gradients = [np.array([3.0, 0.0], "float32"), np.array([0.0, 4.0], "float32")]
    return [np.array(g) for g in optimizer._clip_gradients(
        [keras.ops.convert_to_tensor(g) for g in gradients])]


def test_global_clipnorm_keeps_the_update_direction():
    clipped = _clipped_gradients(global_clipnorm=1.0)
    # The global norm is 5: every gradient is divided by 5.
    np.testing.assert_allclose(clipped[0], [0.6, 0.0], rtol=1e-6)
    np.testing.assert_allclose(clipped[1], [0.0, 0.8], rtol=1e-6)


def test_clipnorm_clips_each_variable_separately():
    clipped = _clipped_gradients(clipnorm=1.0)
    np.testing.assert_allclose(clipped[0], [1.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(clipped[1], [0.0, 1.0], rtol=1e-6)


def test_config_global_clipnorm_reaches_the_compiled_optimizer():
    config = get_preset("tiny").replace(global_clipnorm=1.0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    compile_model(model, config)
    assert model.optimizer.global_clipnorm == 1.0 and model.optimizer.clipnorm is None


def test_reference_recipe_clips_the_global_norm():
    config = get_preset("multi30k")
    assert config.global_clipnorm == 1.0 and config.clipnorm is None


def test_both_clippings_are_refused():
    with pytest.raises(ValueError, match="at most one of `clipnorm` and `global_clipnorm`"):
        get_preset("tiny").replace(clipnorm=1.0, global_clipnorm=1.0)


def test_config_lr_cooldown_becomes_the_schedules_cooldown():
    config = get_preset("tiny").replace(lr_cooldown=0.25)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    compile_model(model, config, total_steps=40)
    schedule = model.optimizer._learning_rate
    assert (schedule.total_steps, schedule.cooldown_steps) == (40, 10)
    with pytest.raises(ValueError, match="total_steps"):
        compile_model(model, config)
    with pytest.raises(ValueError, match="lr_cooldown"):
        get_preset("tiny").replace(lr_cooldown=1.5)


def test_config_lr_cooldown_shape_becomes_the_schedules_shape():
    config = get_preset("tiny").replace(lr_cooldown=0.25, lr_cooldown_shape="1-sqrt")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    compile_model(model, config, total_steps=40)
    assert model.optimizer._learning_rate.cooldown_shape == "1-sqrt"
    with pytest.raises(ValueError, match="lr_cooldown_shape"):
        get_preset("tiny").replace(lr_cooldown_shape="cosine")
    # The config's list is the schedule's (a copy: the config's module loads no TensorFlow).
    from keras_transformer.training import presets, schedules

    assert presets.COOLDOWN_SHAPES == schedules.COOLDOWN_SHAPES


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_learning_rate_schedule_finds_the_schedule_under_loss_scaling(policy):
    from keras_transformer.training.optimizers import learning_rate_schedule
    from keras_transformer.training.schedules import TransformerSchedule

    config = get_preset("tiny").replace(lr_cooldown=0.5)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        compile_model(model, config, total_steps=10)
    finally:
        keras.config.set_dtype_policy(previous)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer) == (
        policy == "mixed_float16")
    schedule = learning_rate_schedule(model.optimizer)
    assert isinstance(schedule, TransformerSchedule)
    assert (schedule.total_steps, schedule.cooldown_steps) == (10, 5)
    assert learning_rate_schedule(keras.optimizers.SGD(0.1)) is None


def test_reference_recipe_cools_down_within_its_budget_and_quick_over_its_two_epochs():
    config = get_preset("multi30k")
    assert config.lr_cooldown == 0.3 and config.time_budget_minutes == 55.0
    quick = get_preset("quick")  # no budget: its length, epochs x batches, is known
    assert quick.lr_cooldown == 0.3 and quick.time_budget_minutes is None and quick.epochs == 2


# --- The fused Adam update -------------------------------------------------------------


def _step_ops(optimizer, variables, gradients):
    """The op types of one traced `apply` of `optimizer`."""
    import tensorflow as tf

    @tf.function
    def apply():
        optimizer.apply(gradients, variables)

    graph = apply.get_concrete_function().graph
    types = [node.op for node in graph.as_graph_def().node]
    for function in graph.as_graph_def().library.function:
        types += [node.op for node in function.node_def]
    return types


def test_make_optimizer_updates_each_variable_with_one_fused_kernel():
    # Keras' Adam updates a variable with about a dozen elementwise ops, each a pass over
    # the variable; ours with TensorFlow's one `ResourceApplyAdam` kernel.
    optimizer = make_optimizer(d_model=4, warmup_steps=1, global_clipnorm=1.0)
    variables = [keras.Variable(np.ones((3, 2), "float32")), keras.Variable(np.ones(2, "float32"))]
    optimizer.build(variables)
    gradients = [keras.ops.ones((3, 2)), keras.ops.ones(2)]
    types = _step_ops(optimizer, variables, gradients)
    assert types.count("ResourceApplyAdam") == 2
    assert "AssignSubVariableOp" not in types


@pytest.mark.parametrize("clipping", [{}, {"global_clipnorm": 0.5}, {"clipnorm": 0.5}])
def test_fused_adam_follows_keras_adam(clipping):
    rng = np.random.default_rng(0)
    shapes = [(5, 3), (3,)]
    start = [rng.normal(size=s).astype("float32") for s in shapes]
    steps = [[rng.normal(size=s).astype("float32") for s in shapes] for _ in range(6)]
    results = []
    for fused in (True, False):
        optimizer = make_optimizer(d_model=4, warmup_steps=2, **clipping)
        if not fused:
            optimizer = keras.optimizers.Adam.from_config(optimizer.get_config())
        variables = [keras.Variable(value) for value in start]
        for gradients in steps:
            optimizer.apply([keras.ops.convert_to_tensor(g) for g in gradients], variables)
        results.append([np.array(v) for v in variables] + [
            np.array(m) for m in optimizer._momentums + optimizer._velocities])
    for fused, reference in zip(*results):
        np.testing.assert_allclose(fused, reference, rtol=2e-5, atol=1e-6)
    assert int(optimizer.iterations) == 6


def test_fused_adam_round_trips_and_falls_back_for_amsgrad():
    from keras_transformer.training.optimizers import FusedAdam

    optimizer = make_optimizer(d_model=4, warmup_steps=1)
    assert isinstance(optimizer, FusedAdam)
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(restored, FusedAdam)
    assert restored.get_config() == optimizer.get_config()
    # AMSGrad has no fused kernel here: Keras' own update runs, and still learns.
    amsgrad = FusedAdam(learning_rate=0.1, amsgrad=True)
    variable = keras.Variable(np.array([1.0], "float32"))
    amsgrad.apply([keras.ops.ones(1)], [variable])
    np.testing.assert_allclose(np.array(variable), [0.9], rtol=1e-5)


def test_a_model_saved_with_keras_adam_continues_with_fused_adam(tmp_path):
    # Runs saved before `make_optimizer` returned `FusedAdam` hold Keras' Adam: their
    # optimizer state (step, moments) loads into it unchanged.
    def model(optimizer):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer=optimizer, loss="mse")
        return model

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 3)), rng.normal(size=(8, 2))
    adam = keras.optimizers.Adam.from_config(make_optimizer(d_model=4, warmup_steps=1).get_config())
    assert type(adam) is keras.optimizers.Adam
    saved = model(adam)
    saved.fit(x, y, epochs=3, verbose=0)
    saved.save(tmp_path / "model.keras")
    loaded = model(make_optimizer(d_model=4, warmup_steps=1))
    loaded.optimizer.build(loaded.trainable_variables)
    loaded.load_weights(tmp_path / "model.keras")
    assert int(loaded.optimizer.iterations) == int(saved.optimizer.iterations) == 3
    for mine, theirs in zip(loaded.optimizer.variables, saved.optimizer.variables):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(mine),
                                      keras.ops.convert_to_numpy(theirs))


def test_fused_adam_trains_the_same_under_xla():
    from keras_transformer.training.optimizers import FusedAdam

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 3)), rng.normal(size=(16, 2))
    weights = []
    for jit_compile in (False, True):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
        model.compile(optimizer=FusedAdam(0.01), loss="mse", jit_compile=jit_compile)
        model.fit(x, y, epochs=3, verbose=0)
        assert model.jit_compile == jit_compile
        weights.append(model.get_weights())
    for eager, compiled in zip(*weights):
        np.testing.assert_allclose(compiled, eager, rtol=1e-5, atol=1e-6)


def test_a_saved_training_model_loads_after_importing_the_package_only(tmp_path):
    """The README: the package's `.keras` files load once `keras_transformer` is imported.
    A run's model.keras holds `FusedAdam`, its `TransformerSchedule`, the masked loss and
    metric, which had been registered only by importing `keras_transformer.training`."""
    import subprocess
    import sys

    from keras_transformer.model import build_transformer

    model = build_transformer(20, d_model=8, num_heads=2, ff_dim=16, num_layers=1,
                              max_length=16)
    compile_model(model, get_preset("tiny").replace(d_model=8, num_heads=2))
    path = tmp_path / "model.keras"
    model.save(path)
    code = (
        "import sys, keras, keras_transformer; "
        f"model = keras.saving.load_model({str(path)!r}); "
        "print(type(model.optimizer).__name__, type(model.optimizer._learning_rate).__name__,"
        " type(model.loss).__name__); "
        # Importing the package still loads neither the data pipeline nor training's
        # callbacks (and with them TensorFlow Datasets).
        "print(sorted(m for m in sys.modules if m.startswith(('tensorflow_datasets', "
        "'keras_transformer.data', 'keras_transformer.training.callbacks', "
        "'keras_transformer.training.trainer'))))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-2:] == [
        "FusedAdam TransformerSchedule MaskedSparseCategoricalCrossentropy", "[]"]
    # ... without training's modules as names of the package (`keras_transformer.metrics`).
    import keras_transformer

    assert not {"losses", "metrics", "optimizers", "schedules"} & set(vars(keras_transformer))


def test_train_is_importable_from_the_training_package():
    # The README's Python path: `from keras_transformer.training import train` raised
    # ImportError (only `keras_transformer.training.trainer` had it).
    from keras_transformer.training import TrainingRun, train
    from keras_transformer.training.trainer import TrainingRun as run_class, train as function

    assert train is function and TrainingRun is run_class

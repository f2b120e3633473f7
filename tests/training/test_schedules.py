"""TransformerSchedule follows the paper's formula and serializes; make_optimizer uses it."""

import keras
import numpy as np
import pytest

from keras_transformer.training.optimizers import make_optimizer
from keras_transformer.training.schedules import TransformerSchedule, cooldown_steps


def _paper_rate(step, d_model, warmup, scale=1.0):
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


@pytest.mark.parametrize("iterations", [0, 1, 99, 3999, 4000, 10_000, 99_999])
def test_matches_formula_with_steps_counted_from_one(iterations):
    schedule = TransformerSchedule(d_model=512, warmup_steps=4000, scale=2.0)
    expected = _paper_rate(iterations + 1, 512, 4000, scale=2.0)
    np.testing.assert_allclose(float(schedule(iterations)), expected, rtol=1e-5)


def test_peaks_at_warmup_end():
    schedule = TransformerSchedule(d_model=256, warmup_steps=100)
    rates = [float(schedule(i)) for i in range(300)]
    assert int(np.argmax(rates)) == 99  # paper step 100
    np.testing.assert_allclose(max(rates), (256 * 100) ** -0.5, rtol=1e-5)
    assert rates[0] > 0.0


def test_config_round_trip():
    schedule = TransformerSchedule(d_model=128, warmup_steps=300, scale=0.5)
    for restored in (
        TransformerSchedule.from_config(schedule.get_config()),
        keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule)),
    ):
        assert isinstance(restored, TransformerSchedule)
        assert restored.get_config() == schedule.get_config()
        np.testing.assert_allclose(float(restored(50)), float(schedule(50)))


def test_make_optimizer_is_paper_adam_with_schedule():
    optimizer = make_optimizer(d_model=64, warmup_steps=10, scale=0.5, clipnorm=1.0)
    assert isinstance(optimizer, keras.optimizers.Adam)
    schedule = keras.optimizers.schedules.deserialize(optimizer.get_config()["learning_rate"])
    assert schedule.get_config() == {"d_model": 64, "warmup_steps": 10, "scale": 0.5}
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    assert optimizer.clipnorm == 1.0
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    np.testing.assert_allclose(
        float(restored.learning_rate), _paper_rate(1, 64, 10, scale=0.5), rtol=1e-5
    )


def test_cooldown_falls_linearly_to_zero_at_total_steps():
    base = TransformerSchedule(d_model=64, warmup_steps=10)
    cooled = TransformerSchedule(d_model=64, warmup_steps=10, total_steps=100, cooldown_steps=20)
    for iterations in (0, 9, 50, 79):  # before the cooldown: the paper's rate
        np.testing.assert_allclose(float(cooled(iterations)), float(base(iterations)), rtol=1e-6)
    for iterations, factor in ((80, 1.0), (90, 0.5), (99, 1 / 20), (100, 0.0), (150, 0.0)):
        np.testing.assert_allclose(
            float(cooled(iterations)), factor * float(base(iterations)), rtol=1e-5, atol=1e-12
        )
    restored = TransformerSchedule.from_config(cooled.get_config())
    assert (restored.total_steps, restored.cooldown_steps) == (100, 20)
    np.testing.assert_allclose(float(restored(90)), float(cooled(90)))


@pytest.mark.parametrize("total_steps, cooldown_steps", [(None, 5), (4, 5), (10, -1)])
def test_cooldown_needs_a_run_length(total_steps, cooldown_steps):
    with pytest.raises(ValueError, match="cooldown_steps"):
        TransformerSchedule(64, 10, total_steps=total_steps, cooldown_steps=cooldown_steps)


def test_make_optimizer_passes_the_cooldown():
    optimizer = make_optimizer(d_model=64, warmup_steps=10, total_steps=50, cooldown_steps=10)
    schedule = optimizer._learning_rate
    assert (schedule.total_steps, schedule.cooldown_steps) == (50, 10)
    assert float(schedule(49)) > 0.0 == float(schedule(50))


def test_set_run_length_moves_the_cooldown_inside_a_compiled_function():
    import tensorflow as tf

    schedule = TransformerSchedule(d_model=64, warmup_steps=10, total_steps=100, cooldown_steps=20)
    rate = tf.function(lambda step: schedule(step))  # traced once, as in a train step
    base = float(TransformerSchedule(d_model=64, warmup_steps=10)(90))
    np.testing.assert_allclose(float(rate(tf.constant(90))), 0.5 * base, rtol=1e-5)
    schedule.set_run_length(200, 40)
    np.testing.assert_allclose(float(rate(tf.constant(90))), base, rtol=1e-5)
    np.testing.assert_allclose(float(rate(tf.constant(180))),
                               0.5 * float(TransformerSchedule(64, 10)(180)), rtol=1e-5)
    assert schedule.get_config()["total_steps"] == 200
    with pytest.raises(ValueError, match="cooldown_steps"):
        schedule.set_run_length(10, 40)
    with pytest.raises(ValueError, match="set_run_length"):
        TransformerSchedule(d_model=64, warmup_steps=10).set_run_length(100, 20)


def test_settings_the_schedule_would_ignore_or_turn_negative_are_refused():
    # `total_steps` without `cooldown_steps` was dropped (and from get_config) silently; a
    # negative `scale` gave a negative learning rate.
    with pytest.raises(ValueError, match="total_steps.*cooldown_steps"):
        TransformerSchedule(512, 4000, total_steps=100)
    # None failed with a bare TypeError; True was taken and saved as a bool.
    for scale in (-1.0, 0.0, float("nan"), float("inf"), None, True, "0.5"):
        with pytest.raises(ValueError, match="scale"):
            TransformerSchedule(512, 4000, scale=scale)


def test_run_lengths_that_are_not_whole_updates_or_not_numbers_are_refused():
    # `cooldown_steps=0.5` (a fraction, as `lr_cooldown` is) was accepted with no ramp,
    # then dropped by get_config (`int(0.5)` is 0): a restored schedule no longer reached
    # zero. `total_steps=100.7` lost its fraction in the round trip; None for "off", or a
    # None `d_model`, raised a bare TypeError.
    for total_steps, cooldown in ((100, 0.5), (100.7, 20), (100, True)):
        with pytest.raises(ValueError, match="cooldown_steps|total_steps"):
            TransformerSchedule(64, 10, total_steps=total_steps, cooldown_steps=cooldown)
    schedule = TransformerSchedule(64, 10, total_steps=100, cooldown_steps=20)
    with pytest.raises(ValueError, match="cooldown_steps|total_steps"):
        schedule.set_run_length(100, 0.5)
    for arguments in (dict(d_model=None), dict(warmup_steps=None), dict(d_model="512")):
        with pytest.raises(ValueError, match=next(iter(arguments))):
            TransformerSchedule(**{"d_model": 64, "warmup_steps": 10, **arguments})
    # None for no cooldown, as for `total_steps`.
    plain = TransformerSchedule(64, 10, cooldown_steps=None)
    assert plain.cooldown_steps == 0 and plain.total_steps is None
    # NumPy's integers are whole updates; a NumPy run length gives a whole cooldown.
    assert type(cooldown_steps(0.3, np.int64(2152))) is int
    assert TransformerSchedule(64, 10, total_steps=np.int64(100),
                               cooldown_steps=np.int64(20)).cooldown_steps == 20


def test_a_one_minus_sqrt_cooldown_follows_hageles_shape():
    # Hägele et al. (2024): over the cooldown the rate is multiplied by 1 - sqrt(progress),
    # which falls faster than the linear ramp at first and more slowly at the end.
    base = TransformerSchedule(d_model=64, warmup_steps=10)
    cooled = TransformerSchedule(d_model=64, warmup_steps=10, total_steps=100, cooldown_steps=20,
                                 cooldown_shape="1-sqrt")
    for iterations in (0, 9, 50, 79):
        np.testing.assert_allclose(float(cooled(iterations)), float(base(iterations)), rtol=1e-6)
    for iterations, progress in ((80, 0.0), (85, 0.25), (90, 0.5), (99, 19 / 20), (100, 1.0),
                                 (150, 1.0)):
        np.testing.assert_allclose(float(cooled(iterations)),
                                   (1 - progress**0.5) * float(base(iterations)),
                                   rtol=1e-5, atol=1e-12)
    assert float(cooled(99)) > 0.0
    restored = TransformerSchedule.from_config(cooled.get_config())
    assert restored.cooldown_shape == "1-sqrt"
    np.testing.assert_allclose(float(restored(85)), float(cooled(85)))
    # The linear shape is the default, and what a config written before the shape existed
    # loads as; an unknown shape is refused.
    linear = TransformerSchedule(d_model=64, warmup_steps=10, total_steps=100, cooldown_steps=20)
    assert linear.cooldown_shape == "linear" == linear.get_config()["cooldown_shape"]
    earlier = {key: value for key, value in cooled.get_config().items()
               if key != "cooldown_shape"}
    assert TransformerSchedule.from_config(earlier).cooldown_shape == "linear"
    with pytest.raises(ValueError, match="cooldown_shape"):
        TransformerSchedule(64, 10, total_steps=100, cooldown_steps=20, cooldown_shape="cosine")


def test_make_optimizer_passes_the_cooldowns_shape():
    optimizer = make_optimizer(d_model=64, warmup_steps=10, total_steps=50, cooldown_steps=10,
                               cooldown_shape="1-sqrt")
    assert optimizer._learning_rate.cooldown_shape == "1-sqrt"
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert restored._learning_rate.cooldown_shape == "1-sqrt"


@pytest.mark.parametrize("shape", ["linear", "1-sqrt"])
@pytest.mark.parametrize("warmup, total, cooldown", [(400, 50, 15), (400, 50, 50),
                                                     (4000, 4000, 4000), (10, 100, 100)])
def test_peak_share_is_the_schedules_own_peak_over_the_run(shape, warmup, total, cooldown):
    # `warmup_warning` judges a run by `peak_share`, a NumPy copy of the schedule: both
    # cooldown shapes must agree with the schedule itself.
    from keras_transformer.training.trainer import peak_share

    schedule = TransformerSchedule(64, warmup, total_steps=total, cooldown_steps=cooldown,
                                   cooldown_shape=shape)
    peak = float(TransformerSchedule(64, warmup)(warmup - 1))
    rates = schedule(np.arange(total))
    np.testing.assert_allclose(peak_share(warmup, total, cooldown, shape),
                               float(np.max(rates)) / peak, rtol=1e-5)


def test_a_long_one_minus_sqrt_cooldown_keeps_its_last_updates_rate():
    # 1 - sqrt(1 - m) in float32 lost the last update's rate of a long cooldown (0.13% off
    # at 30,000 updates, 7% at 1M): it is about 1 / (2 * cooldown_steps) of the rate.
    for cooldown in (646, 30_000, 1_000_000):
        schedule = TransformerSchedule(64, 10, total_steps=cooldown, cooldown_steps=cooldown,
                                       cooldown_shape="1-sqrt")
        base = float(TransformerSchedule(64, 10)(cooldown - 1))
        exact = 1.0 / cooldown / (1.0 + (1.0 - 1.0 / cooldown) ** 0.5)
        np.testing.assert_allclose(float(schedule(cooldown - 1)) / base, exact, rtol=1e-4)


def test_a_model_saved_with_a_one_minus_sqrt_cooldown_loads_with_it(tmp_path):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=make_optimizer(d_model=64, warmup_steps=10, total_steps=40,
                                           cooldown_steps=20, cooldown_shape="1-sqrt"),
                  loss="mse")
    model.fit(np.ones((4, 2)), np.ones((4, 1)), epochs=1, verbose=0)
    model.save(tmp_path / "model.keras")
    schedule = keras.models.load_model(tmp_path / "model.keras").optimizer._learning_rate
    assert (schedule.total_steps, schedule.cooldown_steps, schedule.cooldown_shape) == (
        40, 20, "1-sqrt")
    np.testing.assert_allclose(float(schedule(30)), float(model.optimizer._learning_rate(30)))

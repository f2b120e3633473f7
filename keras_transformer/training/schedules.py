"""The learning-rate schedule of Vaswani et al. (2017): linear warmup, then 1/sqrt(step);
optionally a cooldown to zero (linear, or 1 - sqrt) at the end of a run of known length."""

import math
import numbers

import keras
import numpy as np
from keras import ops

# How the rate falls over a cooldown (`TransformerSchedule`'s `cooldown_shape`), `p` going
# from 0 to 1 over its updates: times `1 - p`, or times `1 - sqrt(p)`.
COOLDOWN_SHAPES = ("linear", "1-sqrt")


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Inverse-square-root learning rate with linear warmup ("Noam" schedule).

    `lrate = scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)`:
    the rate grows linearly for `warmup_steps` steps, peaks at
    `scale * (d_model * warmup_steps)**-0.5` when `step == warmup_steps`, then decays as
    `step**-0.5`.

    Step convention: Keras calls the schedule with the optimizer's `iterations`, which is
    `0` for the first update. The paper counts steps from 1 (its formula is 0 at step 0,
    and `step**-0.5` is undefined there), so this schedule uses `step = iterations + 1`:
    the first update uses `lrate(1)`, and `schedule(warmup_steps - 1)` is the peak.

    Cooldown: with `total_steps` and `cooldown_steps`, the rate is further multiplied by
    `m = min(1, (total_steps - iterations) / cooldown_steps)`, floored at 0: it falls
    linearly over the last `cooldown_steps` updates, the last update (`iterations == total_steps -
    1`) uses `1 / cooldown_steps` of the rate, and updates past `total_steps` use 0. This
    is the "cooldown" that lets an inverse-square-root run end as well as a cosine one of
    the same length (Zhai et al., 2022; Hägele et al., 2024), and it anneals the weights
    the way averaging the last checkpoints does. With `cooldown_shape="1-sqrt"` the
    multiplier is `1 - sqrt(1 - m)` instead of `m`: it falls faster at first and more slowly
    at the end, the shape Hägele et al. found better than the linear one.

    Args:
        d_model: int, the model width; the rate scales with `d_model**-0.5`.
        warmup_steps: int, number of steps of linear warmup. Defaults to `4000`.
        scale: float > 0, a constant multiplier of the whole rate (1.0 is the paper).
            Defaults to `1.0`.
        total_steps: int or `None`, the number of updates of the whole run; only with
            `cooldown_steps` (needed by it). Defaults to `None`.
        cooldown_steps: int, updates at the end of the run over which the rate falls to
            zero (as `cooldown_shape` says); `0` or `None` (no cooldown), or at most
            `total_steps`. Defaults to `0`.
        cooldown_shape: string, one of `COOLDOWN_SHAPES`: how the rate falls over the
            cooldown, `"linear"` or `"1-sqrt"`. Defaults to `"linear"`.

    Call arguments:
        step: int or tensor scalar, the optimizer's `iterations` (0-based).

    Returns:
        A float32 scalar, the learning rate for that update.

    Example:

    >>> schedule = TransformerSchedule(d_model=512, warmup_steps=4000)
    >>> round(float(schedule(3999)), 7)  # the peak, at paper step 4000
    0.0006988
    >>> cooled = TransformerSchedule(512, 4000, total_steps=10_000, cooldown_steps=2000)
    >>> round(float(cooled(8999) / schedule(8999)), 4)  # half-way through the cooldown
    0.5005

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), section 5.3.
        - [Zhai et al., 2022](https://arxiv.org/abs/2106.04560), "Scaling Vision
          Transformers" (inverse square root with a linear cooldown).
        - [Hägele et al., 2024](https://arxiv.org/abs/2405.18392), "Scaling Laws and
          Compute-Optimal Training Beyond Fixed Training Durations".
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0, total_steps=None,
                 cooldown_steps=0, cooldown_shape="linear"):
        if not all(_is_number(value) and 0 < value < math.inf
                   for value in (d_model, warmup_steps)):
            raise ValueError(
                "`d_model` and `warmup_steps` must be positive numbers. Received: "
                f"d_model={d_model!r}, warmup_steps={warmup_steps!r}"
            )
        cooldown_steps = cooldown_steps or 0  # None: no cooldown, as for `total_steps`
        if not (_is_number(scale) and 0 < scale < math.inf):
            raise ValueError(f"`scale` must be a positive number (the rate's multiplier). "
                             f"Received: scale={scale}")
        if total_steps is not None and not cooldown_steps:
            raise ValueError(
                "`total_steps` sets where a cooldown ends: give `cooldown_steps` with it "
                f"(without a cooldown the rate does not depend on the run's length). "
                f"Received: total_steps={total_steps}, cooldown_steps={cooldown_steps}")
        _check_run_length(total_steps, cooldown_steps)
        if cooldown_shape not in COOLDOWN_SHAPES:
            raise ValueError(f"`cooldown_shape` must be one of {COOLDOWN_SHAPES}. Received: "
                             f"cooldown_shape={cooldown_shape!r}")
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = scale
        self.cooldown_shape = cooldown_shape
        # In a variable, so that `set_run_length` can move the end of the run while a
        # compiled train step (which reads it at every update) keeps running.
        self._run_length = None
        if cooldown_steps:
            self._run_length = keras.Variable(
                [float(total_steps), float(cooldown_steps)], dtype="float32",
                trainable=False, name="schedule_run_length",
            )

    @property
    def total_steps(self):
        """int or `None`, the run's number of updates (with a cooldown)."""
        return None if self._run_length is None else int(self._run_length.numpy()[0])

    @property
    def cooldown_steps(self):
        """int, the updates of the cooldown (`0`: none)."""
        return 0 if self._run_length is None else int(self._run_length.numpy()[1])

    def set_run_length(self, total_steps, cooldown_steps):
        """Moves the cooldown to end at `total_steps` (a schedule made with a cooldown).

        For a run whose length is learned while it trains (a time budget): updates
        before the cooldown do not depend on the run's length, so the end can move
        until the cooldown begins.
        """
        if self._run_length is None:
            raise ValueError("`set_run_length` needs a schedule made with `cooldown_steps`.")
        _check_run_length(total_steps, cooldown_steps)
        if not cooldown_steps:
            raise ValueError(f"`cooldown_steps` must be positive. Received: {cooldown_steps}")
        self._run_length.assign([float(total_steps), float(cooldown_steps)])

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0  # paper steps count from 1
        warmup_steps = ops.cast(self.warmup_steps, "float32")
        decay = ops.rsqrt(step)
        warmup = step * warmup_steps**-1.5
        rate = (
            ops.cast(self.scale, "float32")
            * ops.cast(self.d_model, "float32") ** -0.5
            * ops.minimum(decay, warmup)
        )
        if self._run_length is None:
            return rate
        total_steps, cooldown_steps = self._run_length[0], self._run_length[1]
        # `step - 1` is the 0-based iteration: the last update keeps 1/cooldown_steps.
        return rate * cooldown_multiplier(step - 1.0, total_steps, cooldown_steps,
                                          self.cooldown_shape)

    def get_config(self):
        config = {
            "d_model": self.d_model,
            "warmup_steps": self.warmup_steps,
            "scale": self.scale,
        }
        if self.cooldown_steps:  # the cooldown's settings, with one
            config.update(total_steps=self.total_steps, cooldown_steps=self.cooldown_steps,
                          cooldown_shape=self.cooldown_shape)
        return config


def cooldown_multiplier(iterations, total_steps, cooldown_steps, shape, xp=ops):
    """The cooldown's multiplier of the rate at 0-based `iterations` (`TransformerSchedule`;
    `trainer.peak_share` computes it with NumPy). The linear one, `m = (total_steps -
    iterations) / cooldown_steps` clipped to [0, 1] (1 before the cooldown, 0 past its end),
    is the multiplier itself (`"linear"`), or gives `1 - sqrt(1 - m)` (`"1-sqrt"`), computed
    as `m / (1 + sqrt(1 - m))`, which keeps its precision near the end of a long cooldown.
    `xp` is `keras.ops` or `numpy`.

    Example:

    >>> round(float(cooldown_multiplier(95, 100, 20, "1-sqrt", np)), 4)  # m = 0.25
    0.134
    """
    remaining = xp.clip((total_steps - iterations) / cooldown_steps, 0.0, 1.0)
    if shape == "1-sqrt":
        return remaining / (1.0 + xp.sqrt(1.0 - remaining))
    return remaining


def cooldown_steps(fraction, total_steps):
    """The updates of a cooldown over `fraction` of `total_steps` (at least 1 if any).

    Example:

    >>> cooldown_steps(0.3, 2152)
    646
    """
    if not fraction:
        return 0
    return int(min(total_steps, max(1, round(fraction * total_steps))))  # NumPy's too


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _is_whole(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _check_run_length(total_steps, cooldown_steps):
    # Whole updates: a fraction (as `lr_cooldown` is) was accepted with no ramp, and
    # `get_config` truncated it (0 dropped the cooldown of a restored schedule).
    if not _is_whole(cooldown_steps) or not (total_steps is None or _is_whole(total_steps)):
        raise ValueError(
            "`cooldown_steps` and `total_steps` must be whole numbers of updates (ints). "
            f"Received: cooldown_steps={cooldown_steps!r}, total_steps={total_steps!r}"
        )
    if cooldown_steps < 0 or (
            cooldown_steps and (total_steps is None or cooldown_steps > total_steps)):
        raise ValueError(
            "`cooldown_steps` must be 0, or positive with `total_steps` >= it. Received: "
            f"cooldown_steps={cooldown_steps}, total_steps={total_steps}"
        )

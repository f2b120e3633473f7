"""The learning-rate schedule of Vaswani et al. (2017): linear warmup, then 1/sqrt(step)."""

import keras
from keras import ops


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

    Args:
        d_model: int, the model width; the rate scales with `d_model**-0.5`.
        warmup_steps: int, number of steps of linear warmup. Defaults to `4000`.
        scale: float, a constant multiplier of the whole rate (1.0 is the paper).
            Defaults to `1.0`.

    Call arguments:
        step: int or tensor scalar, the optimizer's `iterations` (0-based).

    Returns:
        A float32 scalar, the learning rate for that update.

    Example:

    >>> schedule = TransformerSchedule(d_model=512, warmup_steps=4000)
    >>> round(float(schedule(3999)), 7)  # the peak, at paper step 4000
    0.0006988

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), section 5.3.
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0):
        if d_model <= 0 or warmup_steps <= 0:
            raise ValueError(
                "`d_model` and `warmup_steps` must be positive. Received: "
                f"d_model={d_model}, warmup_steps={warmup_steps}"
            )
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = scale

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0  # paper steps count from 1
        warmup_steps = ops.cast(self.warmup_steps, "float32")
        decay = ops.rsqrt(step)
        warmup = step * warmup_steps**-1.5
        return (
            ops.cast(self.scale, "float32")
            * ops.cast(self.d_model, "float32") ** -0.5
            * ops.minimum(decay, warmup)
        )

    def get_config(self):
        return {
            "d_model": self.d_model,
            "warmup_steps": self.warmup_steps,
            "scale": self.scale,
        }

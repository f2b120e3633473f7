"""The paper's optimizer: Adam with the warmup / inverse-square-root schedule."""

import keras
import tensorflow as tf

from keras_transformer.training.schedules import TransformerSchedule


@keras.saving.register_keras_serializable(package="keras_transformer")
class FusedAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` whose update of a variable is one fused kernel.

    Keras' Adam updates each variable with about a dozen elementwise ops (each a pass over
    the variable and its two moments); this one calls TensorFlow's `ResourceApplyAdam`,
    which computes the same update, `m += (g - m)(1 - beta_1)`, `v += (g^2 - v)(1 - beta_2)`,
    `var -= lr sqrt(1 - beta_2^t) / (1 - beta_1^t) * m / (sqrt(v) + epsilon)`, in one
    pass. The variables, their names and the checkpoint layout are Keras' own, so a run
    saved with either optimizer resumes with the other. AMSGrad, and variables that are not
    TensorFlow resource variables, take Keras' update.

    Args:
        As `keras.optimizers.Adam`.

    Example:

    >>> import numpy as np
    >>> optimizer = FusedAdam(learning_rate=0.1)
    >>> variable = keras.Variable(np.array([1.0], "float32"))
    >>> optimizer.apply([keras.ops.ones(1)], [variable])
    >>> round(float(variable[0]), 4)
    0.9

    References:
        - [Kingma and Ba, 2015](https://arxiv.org/abs/1412.6980), algorithm 1 with the
          efficient form of section 2.
    """

    def update_step(self, gradient, variable, learning_rate):
        handle = getattr(variable, "handle", None)
        if self.amsgrad or handle is None or keras.backend.backend() != "tensorflow":
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        index = self._get_variable_index(variable)
        step = tf.cast(self.iterations + 1, dtype)
        beta_1 = tf.cast(self.beta_1, dtype)
        beta_2 = tf.cast(self.beta_2, dtype)
        tf.raw_ops.ResourceApplyAdam(
            var=handle,
            m=self._momentums[index].handle,
            v=self._velocities[index].handle,
            beta1_power=tf.pow(beta_1, step),
            beta2_power=tf.pow(beta_2, step),
            lr=tf.cast(learning_rate, dtype),
            beta1=beta_1,
            beta2=beta_2,
            epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(tf.convert_to_tensor(gradient), dtype),  # IndexedSlices -> dense
        )


def make_optimizer(
    d_model,
    warmup_steps,
    scale=1.0,
    total_steps=None,
    cooldown_steps=0,
    cooldown_shape="linear",
    clipnorm=None,
    global_clipnorm=None,
    beta_1=0.9,
    beta_2=0.98,
    epsilon=1e-9,
):
    """Builds `keras.optimizers.Adam` driven by a `TransformerSchedule`.

    Args:
        d_model: int, the model width (sets the schedule's scale `d_model**-0.5`).
        warmup_steps: int, steps of linear learning-rate warmup.
        scale: float > 0, multiplier of the learning rate. Defaults to `1.0`.
        total_steps: int or `None`, updates of the whole run, where the cooldown ends;
            only with `cooldown_steps`. Defaults to `None`.
        cooldown_steps: int, last updates over which the rate falls to zero (see
            `TransformerSchedule`); `0` = none. Defaults to `0`.
        cooldown_shape: string, how the rate falls over the cooldown: `"linear"` or
            `"1-sqrt"` (see `TransformerSchedule`). Defaults to `"linear"`.
        clipnorm: float or `None`, clip each variable's gradient *separately* to this
            norm (Keras' `clipnorm`): the update's direction changes whenever one
            variable's gradient is clipped and another's is not. Defaults to `None`.
        global_clipnorm: float or `None`, rescale *all* gradients by one factor so that
            their global L2 norm is at most this, keeping the update's direction: what
            papers (and `torch.nn.utils.clip_grad_norm_`, tensor2tensor, fairseq's
            `--clip-norm`) mean by gradient clipping. At most one of the two. Defaults
            to `None`.
        beta_1: float, Adam's first-moment decay. Defaults to `0.9` (paper).
        beta_2: float, Adam's second-moment decay. Defaults to `0.98` (paper).
        epsilon: float, Adam's epsilon. Defaults to `1e-9` (paper).

    Returns:
        A `FusedAdam` (a `keras.optimizers.Adam` updating each variable with one fused
        kernel). Under mixed float16 `Model.compile` wraps it in a
        `LossScaleOptimizer` itself.

    Example:

    >>> optimizer = make_optimizer(d_model=256, warmup_steps=1000, global_clipnorm=1.0)
    >>> optimizer.global_clipnorm
    1.0

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), section 5.3.
    """
    return FusedAdam(
        learning_rate=TransformerSchedule(
            d_model, warmup_steps=warmup_steps, scale=scale, total_steps=total_steps,
            cooldown_steps=cooldown_steps, cooldown_shape=cooldown_shape,
        ),
        beta_1=beta_1,
        beta_2=beta_2,
        epsilon=epsilon,
        clipnorm=clipnorm,
        global_clipnorm=global_clipnorm,
    )


def learning_rate_schedule(optimizer):
    """The `LearningRateSchedule` driving `optimizer`, or `None` for a constant rate.

    `optimizer.learning_rate` is the rate's current value, not the schedule; under mixed
    float16 `Model.compile` wraps the optimizer in a `LossScaleOptimizer`, whose own
    rate is a placeholder, so the schedule is the inner optimizer's.

    Example:

    >>> learning_rate_schedule(make_optimizer(d_model=256, warmup_steps=1000)).warmup_steps
    1000
    """
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    schedule = optimizer._learning_rate  # Keras keeps the schedule itself here
    if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
        return schedule
    return None

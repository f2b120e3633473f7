"""Small helpers shared by the layers."""

import math
import numbers
import zlib

import numpy as np

# Derived seeds stay below 2**31, a valid seed for every backend's random ops.
_SEED_MODULUS = 2**31


def check_positive_int(name, value):
    """Returns `value` as a Python int, or raises ValueError naming `name` unless it is an
    integer (NumPy's included, not a bool) of at least 1: a float size had failed deep in a
    Dense or a shape conversion, None or a string with a TypeError naming no argument."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"`{name}` must be a positive integer, got {name}={value!r}.")
    return int(value)


def check_rate(name, value):
    """Returns a dropout rate as a Python float, or raises ValueError naming `name` unless it
    is a number in [0, 1)."""
    if (not isinstance(value, numbers.Real) or isinstance(value, bool)
            or not 0.0 <= value < 1.0):
        raise ValueError(f"`{name}` must be in [0, 1), got {name}={value!r}.")
    return float(value)


def check_bool(name, value):
    """Returns `value` as a Python bool, or raises ValueError naming `name` unless it is a
    bool (NumPy's included): a truthy string (`norm_first="no"`) had built the other model
    and been saved so."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"`{name}` must be True or False, got {name}={value!r}.")
    return bool(value)


def read_saved_flags(config, names):
    """A copy of a saved layer `config` whose flags `names` saved as the ints 0 or 1 are bools.

    Before `check_bool`, `norm_first=1` built the model a Python truth test gives and was
    saved as the int; such files load as they were built. Anything else stays as it is, for
    `check_bool` to refuse.
    """
    config = dict(config)
    for name in names:
        value = config.get(name)
        if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value in (0, 1):
            config[name] = bool(value)
    return config


def check_epsilon(name, value):
    """Returns a layer normalization epsilon as a Python float, or raises ValueError naming
    `name` unless it is a finite number above 0: None built and trained (Keras' default),
    then failed in every decoding path; a negative one gave NaN."""
    if (not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_))
            or not 0.0 < value < math.inf):
        raise ValueError(f"`{name}` must be a finite number above 0, got {name}={value!r}.")
    return float(value)


def derive_seed(seed, name):
    """A seed for the sub-layer `name` of a layer seeded with int `seed`, stable run to run.

    Uses CRC-32, not `hash()`, whose value for a `str` changes from process to process.
    """
    return zlib.crc32(f"{seed}/{name}".encode("utf-8")) % _SEED_MODULUS


def clone_initializer(initializer, name):
    """A fresh copy of `initializer` for the sub-layer `name`.

    Sub-layers never share one instance, and a seeded initializer (an int seed or a
    `keras.random.SeedGenerator`) gets a seed derived from its own and from `name`: a copy
    with the same seed would give every projection of the same shape the same values. An
    unseeded initializer stays unseeded: each copy draws its own values (in Keras 3 one
    unseeded instance repeats its values from call to call).

    Args:
        initializer: a `keras.initializers.Initializer`.
        name: str, the sub-layer's name, unique among its siblings (such as `"query"`).

    Returns:
        A new initializer of the same class and config, with a derived seed if seeded.
    """
    config = initializer.get_config()
    seed = config.get("seed")
    if isinstance(seed, dict):  # a serialized `SeedGenerator`: its initial seed
        seed = seed.get("config", {}).get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool):
        config["seed"] = derive_seed(seed, name)
    return initializer.__class__.from_config(config)


def sublayer_connection(inputs, sublayer, norm, dropout, norm_first, training=None):
    """Residual connection, dropout and layer norm around one sub-layer.

    Post-norm (the paper, `norm_first=False`): `norm(x + dropout(sublayer(x)))`.
    Pre-norm (`norm_first=True`): `x + dropout(sublayer(norm(x)))`.

    Args:
        inputs: `(B, T, d_model)`.
        sublayer: callable on `(B, T, d_model)` returning `outputs` or a tuple whose first
            element is `outputs` (the rest, such as attention scores or a cache, is passed back).
        norm: the `LayerNormalization` of this sub-layer.
        dropout: the `Dropout` layer applied to the sub-layer output.
        norm_first: bool, pre-norm instead of post-norm.
        training: bool, whether dropout is active.

    Returns:
        `(outputs, extras)` where `extras` is the tuple of what the sub-layer returned after
        its outputs (empty for a single output).
    """
    result = sublayer(norm(inputs) if norm_first else inputs)
    outputs, extras = (result[0], tuple(result[1:])) if isinstance(result, tuple) else (result, ())
    outputs = inputs + dropout(outputs, training=training)
    return (outputs if norm_first else norm(outputs)), extras

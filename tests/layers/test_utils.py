import itertools
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_transformer.layers import Decoder
from keras_transformer.layers.utils import clone_initializer
from tests.layer_checks import to_numpy

D, FF, H, SEED = 8, 16, 2, 7

# Prints a fingerprint of a seeded decoder's kernels; run in a fresh process.
_FINGERPRINT_SCRIPT = f"""
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import keras
from keras_transformer.layers import Decoder
decoder = Decoder(num_layers=2, num_heads={H}, ff_dim={FF},
                  kernel_initializer=keras.initializers.GlorotUniform(seed={SEED}))
decoder.build((1, 3, {D}), (1, 4, {D}))
print(repr([float(keras.ops.sum(w * w)) for w in decoder.weights if "kernel" in w.path]))
"""


def _seeded_decoder_kernels():
    decoder = Decoder(num_layers=2, num_heads=H, ff_dim=FF,
                      kernel_initializer=keras.initializers.GlorotUniform(seed=SEED))
    decoder.build((1, 3, D), (1, 4, D))
    # Keyed by the path inside the decoder (the decoder's own name differs per instance).
    return {w.path.split("/", 1)[1]: to_numpy(w) for w in decoder.weights if "kernel" in w.path}


def test_a_seeded_initializer_gives_every_sublayer_its_own_values():
    kernels = _seeded_decoder_kernels()
    # 2 blocks x (2 attentions x 4 projections + 2 feed-forward kernels).
    assert len(kernels) == 2 * (2 * 4 + 2)
    for (path_a, a), (path_b, b) in itertools.combinations(kernels.items(), 2):
        if a.size == b.size:
            assert not np.array_equal(a.ravel(), b.ravel()), (path_a, path_b)


def test_a_seeded_initializer_gives_the_same_values_on_every_build():
    first, second = _seeded_decoder_kernels(), _seeded_decoder_kernels()
    assert first.keys() == second.keys()
    for path in first:
        np.testing.assert_array_equal(first[path], second[path], err_msg=path)


@pytest.mark.slow
def test_a_seeded_initializer_gives_the_same_values_in_another_process():
    """Derived seeds must not depend on anything per process (such as `hash()` of a str)."""
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", _FINGERPRINT_SCRIPT], env=env, check=True,
                         capture_output=True, text=True).stdout
    expected = [float(np.sum(k.astype("float32") ** 2)) for k in _seeded_decoder_kernels().values()]
    np.testing.assert_allclose(eval(out.strip().splitlines()[-1]), expected, rtol=1e-6)


def test_clone_of_an_unseeded_initializer_keeps_it_unseeded():
    clone = clone_initializer(keras.initializers.GlorotUniform(), "query")
    assert clone.get_config()["seed"] is None
    assert isinstance(clone, keras.initializers.GlorotUniform)
    # Each copy draws its own values (sub-layers of one shape are not initialized alike).
    original = keras.initializers.GlorotUniform()
    copies = [clone_initializer(original, name) for name in ("query", "key", "query")]
    values = [to_numpy(initializer((4, 4))) for initializer in [original] + copies]
    assert values[0].shape == (4, 4)
    for i in range(len(values)):
        for j in range(i):
            assert not np.array_equal(values[i], values[j]), (i, j)

"""Importing the package makes TensorFlow's CPU allocator a pooling (BFC) one, unless the user
chose otherwise: with the system allocator, training ran up to 1.8x slower once any Python
code had run inside tf.data (`Dataset.from_generator`, as every file-reading source does),
the time going to page faults on freshly mapped memory (benchmarks/RESULTS.md)."""

import os
import subprocess
import sys

import pytest

# Runs one op, then asks for the CPU allocator's statistics: only a BFC allocator has them.
PROBE = """
import keras_transformer  # noqa: F401  (the package first, as a user's script would)
import tensorflow as tf
tf.ones([256, 256])
try:
    tf.config.experimental.get_memory_info("CPU:0")
except ValueError:
    print("system")
else:
    print("bfc")
"""


def _allocator(env_value):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPU_ALLOCATOR_USE_BFC"}
    if env_value is not None:
        env["TF_CPU_ALLOCATOR_USE_BFC"] = env_value
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    # Where oneDNN is on by default (CPUs with AVX-512 VNNI or BF16), its own BFC allocator
    # serves the CPU device whatever TF_CPU_ALLOCATOR_USE_BFC says: with oneDNN off the
    # variable alone decides, on every CPU (benchmarks/RESULTS.md, "The allocator line").
    env["TF_ENABLE_ONEDNN_OPTS"] = "0"
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                            env=env, check=True, timeout=300)
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("env_value, expected", [
    (None, "bfc"),        # the package's default
    ("false", "system"),  # the user's choice is kept
    ("true", "bfc"),
])
def test_importing_the_package_pools_cpu_memory_unless_the_user_chose(env_value, expected):
    assert _allocator(env_value) == expected

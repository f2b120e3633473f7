"""`keras_transformer.cli_startup`: which process is the CLI, and the stderr filter."""

import os

import pytest

from keras_transformer.cli_startup import filtered_stderr, is_cli_process, quiet_tensorflow_startup


@pytest.mark.parametrize("argv, expected", [
    (["/venv/bin/keras-transformer", "translate"], True),
    (["/usr/bin/python3", "-m", "keras_transformer", "evaluate"], True),
    (["/usr/bin/python3", "-m", "keras_transformer.export.op_check", "export"], True),
    (["/usr/bin/python3", "-m", "pytest", "tests"], False),
    (["/usr/bin/python3", "-m", "keras_transformer_other"], False),
    (["/usr/bin/python3", "script.py", "keras_transformer"], False),
])
def test_is_cli_process(argv, expected):
    assert is_cli_process(argv) is expected


def test_filtered_stderr_drops_startup_lines_at_the_descriptor_and_keeps_the_rest(capfd):
    with filtered_stderr():
        # C++ code writes to descriptor 2 directly, not through sys.stderr.
        os.write(2, b"I0000 00:00:1.0 1 cpu_feature_guard.cc:227] This TensorFlow binary\n")
        os.write(2, b"a real problem\n")
        os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called\n")
    assert capfd.readouterr().err == "a real problem\n"


# In a process that has not imported TensorFlow (in pytest's it always is, and the function
# then returns early whatever `argv` says): the module loaded from its file, without the
# package's __init__ (which imports TensorFlow). The CLI's argv, last, imports it.
STARTUP_PROBE = """
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("cli_startup", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)
results = [module.quiet_tensorflow_startup(argv) for argv in (
    ["/usr/bin/python3", "-m", "pytest"],
    ["keras-transformer", "--verbose", "translate"],
)]
results.append("tensorflow" in sys.modules)
results.append(module.quiet_tensorflow_startup(["keras-transformer", "translate"]))
results.append("tensorflow" in sys.modules)
print(json.dumps(results))
"""


def test_quiet_startup_does_nothing_outside_the_cli_or_with_verbose():
    import json
    import subprocess
    import sys

    import keras_transformer.cli_startup as cli_startup

    result = subprocess.run([sys.executable, "-c", STARTUP_PROBE, cli_startup.__file__],
                            capture_output=True, text=True, timeout=300, check=True)
    outside, verbose, imported, cli, imported_by_cli = json.loads(
        result.stdout.strip().splitlines()[-1])
    assert (outside, verbose, imported) == (False, False, False)  # TensorFlow left alone
    assert (cli, imported_by_cli) == (True, True)  # the probe's process could tell

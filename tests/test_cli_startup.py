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


def test_quiet_startup_does_nothing_outside_the_cli_or_with_verbose():
    assert not quiet_tensorflow_startup(["/usr/bin/python3", "-m", "pytest"])
    assert not quiet_tensorflow_startup(["keras-transformer", "--verbose", "translate"])

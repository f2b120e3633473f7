"""Keeps TensorFlow's C++ start-up lines off the command line's stderr.

Importing TensorFlow 2.21 on a CPU machine writes, twice (two shared libraries each carry a
copy of absl logging), lines such as `WARNING: All log messages before absl::InitializeLog()
...`, `oneDNN custom operations are on ...`, `Could not find cuda drivers ...`, the
`cpu_feature_guard` note, at the first device query `failed call to cuInit`, and at the first
int64 op `oneDNN supports DT_INT64 only on platforms with AVX-512`. The absl ones are
written before absl logging is initialized, so `TF_CPP_MIN_LOG_LEVEL` does not hide them: they
are caught at file descriptor 2 while TensorFlow is imported and its devices listed, and every
other line is passed on. The later ones obey `TF_CPP_MIN_LOG_LEVEL`, set to 3 unless the user
set it.

This runs only in the `keras-transformer` command (or `python -m keras_transformer[.module]`),
from the package's `__init__` before anything imports TensorFlow; a program or notebook that
imports the package keeps TensorFlow's own behaviour. `--verbose` (or `TF_CPP_MIN_LOG_LEVEL=0`
set by the user) lets the lines through.
"""

import contextlib
import os
import re
import sys
import tempfile

VERBOSE_FLAG = "--verbose"
PROGRAM_NAME = "keras-transformer"
PACKAGE_NAME = "keras_transformer"
# TensorFlow's C++ log level, set only when unset: 3 shows FATAL only. Not 2: on CPU its
# ERROR lines are noise too ("oneDNN supports DT_INT64 only on platforms with AVX-512" at
# the first int64 op), and errors that matter reach Python as exceptions.
LOG_LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
QUIET_LOG_LEVEL = "3"
# The start-up lines (TF 2.21, CPU): absl's pre-init banner, oneDNN, CUDA probing, CPU features.
STARTUP_NOISE = re.compile(
    rb"All log messages before absl::InitializeLog"
    rb"|oneDNN custom operations are on"
    rb"|cudart_stub\.cc|Could not find cuda drivers"
    rb"|cpu_feature_guard\.cc|To enable the following instructions:"
    rb"|cuda_platform\.cc.*cuInit|failed call to cuInit"
    rb"|Unable to register cu(DNN|FFT|BLAS) factory"
    rb"|computation placer already registered"
    rb"|TF-TRT Warning"
)


def is_cli_process(argv=None):
    """Whether this process is the `keras-transformer` command (`argv`: `sys.orig_argv`)."""
    argv = list(getattr(sys, "orig_argv", sys.argv) if argv is None else argv)
    if any(os.path.basename(arg) == PROGRAM_NAME for arg in argv[:2]):
        return True
    # `python -m keras_transformer ...` (or one of its script modules, such as
    # `keras_transformer.export.op_check`): the module name follows "-m".
    return any(a == "-m" and (b == PACKAGE_NAME or b.startswith(PACKAGE_NAME + "."))
               for a, b in zip(argv, argv[1:]))


@contextlib.contextmanager
def filtered_stderr(noise=STARTUP_NOISE):
    """Catches file descriptor 2 in the block; afterwards writes back every line but `noise`.

    Works at the descriptor level, so it catches C++ writes too. Lines come out after the
    block, in their order; an exception in the block still lets them out.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = b"".join(line for line in caught if not noise.search(line))
            if kept:
                os.write(2, kept)


def quiet_tensorflow_startup(argv=None):
    """In the CLI process, imports TensorFlow with its start-up lines hidden (see module doc).

    Does nothing outside the CLI, with `--verbose`, when the user set `TF_CPP_MIN_LOG_LEVEL=0`,
    or once TensorFlow is imported. Otherwise sets `TF_CPP_MIN_LOG_LEVEL=3` unless the user set
    it, and imports TensorFlow and lists its devices (the first device query logs the CUDA
    probe) with the start-up noise filtered out.

    Returns:
        bool, whether the start-up lines were hidden.
    """
    argv = list(getattr(sys, "orig_argv", sys.argv) if argv is None else argv)
    if (not is_cli_process(argv) or VERBOSE_FLAG in argv
            or os.environ.get(LOG_LEVEL_VARIABLE) == "0" or "tensorflow" in sys.modules):
        return False
    os.environ.setdefault(LOG_LEVEL_VARIABLE, QUIET_LOG_LEVEL)
    with filtered_stderr():
        import tensorflow as tf

        tf.config.list_physical_devices()
    return True

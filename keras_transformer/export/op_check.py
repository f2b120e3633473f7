"""Checks that stock TensorFlow Serving can run every op of an exported SavedModel.

The stock `tensorflow/serving` model server links in the core TensorFlow ops and kernels and,
since 2.2, the TF Text ops (`tensorflow_text` `ops_lib`, SentencePiece ops included); nothing
else. So an export must use only:

- core ops: those registered in a process that imported `tensorflow` and nothing else (the
  registry of the installed TensorFlow; read with `TF_GetAllOpList`);
- TF Text ops: those `import tensorflow_text` adds to that registry;
- and never `PyFunc`/`EagerPyFunc` (registered in core, but they call back into Python, which
  a model server does not have).

The ops of an export are read from `saved_model.pb` itself: the nodes of every meta graph and
of every function in its function library (the `tf.function`s, `while` bodies and
conditionals live there); a node whose op is a library function's name is a call, not an op.

A model server older than the TensorFlow that exported the model may lack some core ops
(TF 2.21 exports running on TF Serving 2.20, the newest release, fail with errors such as
"Op type not registered ..."). `op_lists.TENSORFLOW_OPS` holds recorded op lists of other
TensorFlow releases to check against (2.20.0, the newest TF Serving's).

Usable from Python (`check_export`), from tests, and as a script:

    python -m keras_transformer.export.op_check EXPORT_DIR [--tensorflow 2.20.0]
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys

from keras_transformer.export.op_lists import TENSORFLOW_OPS

# Ops that exist in core TensorFlow but need the Python interpreter: no model server has them.
PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})
# Names of the tf2xla op family.
XLA_OP_PREFIX = "Xla"
# The newest tensorflow/serving release (its image tag); it embeds TF Text of the same version.
TF_SERVING_VERSION = "2.20.0"

_LIST_OPS = """
import json, sys
import tensorflow
for module in sys.argv[1:]:
    __import__(module)
from tensorflow.core.framework import op_def_pb2
from tensorflow.python.client import pywrap_tf_session as c_api
ops = op_def_pb2.OpList.FromString(c_api.TF_GetBuffer(c_api.TF_GetAllOpList()))
print(json.dumps(sorted(op.name for op in ops.op)))
"""


def registered_ops(modules=(), python=None):
    """The op names registered in a fresh process after `import tensorflow` and `modules`.

    A fresh process, so what this process imported (TF Text, the project) does not leak in.

    Args:
        modules: iterable of module names to import after `tensorflow` (`"tensorflow_text"`).
        python: str, the interpreter. Defaults to this one.

    Returns:
        frozenset of op names.
    """
    completed = subprocess.run(
        [python or sys.executable, "-c", _LIST_OPS, *modules], capture_output=True, text=True,
        check=False, env=_quiet_env(),
    )
    if completed.returncode:
        raise RuntimeError(f"Listing the ops of tensorflow {list(modules)} failed:\n"
                           f"{completed.stderr[-2000:]}")
    return frozenset(json.loads(completed.stdout.strip().splitlines()[-1]))


def _quiet_env():
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def serving_ops():
    """`(core_ops, text_ops)` of the installed TensorFlow and TF Text, as frozensets."""
    core = registered_ops()
    with_text = registered_ops(["tensorflow_text"])
    return core, with_text - core


def recorded_ops(tensorflow_version):
    """The recorded core op names of another TensorFlow release (see `op_lists`).

    Raises:
        KeyError: when no list is recorded for that version.
    """
    if tensorflow_version not in TENSORFLOW_OPS:
        raise KeyError(f"No op list recorded for TensorFlow {tensorflow_version}; recorded: "
                       f"{sorted(TENSORFLOW_OPS)} (keras_transformer/export/op_lists.py).")
    return TENSORFLOW_OPS[tensorflow_version]


def saved_model_ops(path):
    """Every op type in a SavedModel's graphs and function libraries.

    Args:
        path: str or path-like, a SavedModel directory (holding `saved_model.pb`).

    Returns:
        dict `{op name: number of nodes}`; calls of the library's own functions excluded.
    """
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    saved_model.ParseFromString((pathlib.Path(path) / "saved_model.pb").read_bytes())
    counts = {}
    for meta_graph in saved_model.meta_graphs:
        library = meta_graph.graph_def.library
        functions = {function.signature.name for function in library.function}
        node_lists = [meta_graph.graph_def.node] + [f.node_def for f in library.function]
        for nodes in node_lists:
            for node in nodes:
                if node.op not in functions:
                    counts[node.op] = counts.get(node.op, 0) + 1
    return counts


def xla_compiled_functions(path):
    """Names of a SavedModel's library functions marked to compile with XLA
    (`jit_compile=True`: the `_XlaMustCompile` attribute), which a model server runs only
    with `--xla_cpu_compilation_enabled=true`.

    Args:
        path: str or path-like, a SavedModel directory.

    Returns:
        sorted list of function names.
    """
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    saved_model.ParseFromString((pathlib.Path(path) / "saved_model.pb").read_bytes())
    return sorted(
        function.signature.name
        for meta_graph in saved_model.meta_graphs
        for function in meta_graph.graph_def.library.function
        if function.attr["_XlaMustCompile"].b
    )


class OpReport:
    """What `check_export` found: the export's ops and which a server would lack.

    Attributes:
        ops: dict `{op: node count}` of the export.
        python_ops: sorted list, ops that need a Python interpreter.
        unknown_ops: sorted list, ops neither core TensorFlow nor TF Text.
        text_ops: sorted list, the TF Text ops used (the server must link TF Text).
        xla_ops: sorted list, core ops of the tf2xla family (see `summary`).
        missing_in_release: dict `{tensorflow version: sorted list of core ops the export uses
            that that release lacks}`.
        xla_functions: sorted list, functions that compile with XLA (`--jit` exports): the
            server needs `--xla_cpu_compilation_enabled=true`.
    """

    def __init__(self, ops, core, text, releases=None, xla_functions=()):
        self.ops = dict(sorted(ops.items()))
        self.xla_functions = sorted(xla_functions)
        self.python_ops = sorted(set(ops) & PYTHON_OPS)
        self.unknown_ops = sorted(set(ops) - core - text)
        self.text_ops = sorted(set(ops) & text)
        # Core ops of the tf2xla family (`XlaDynamicUpdateSlice`, which Keras' TensorFlow
        # backend uses for `ops.slice_update`): their CPU kernels outside XLA come from
        # tensorflow/compiler/jit/xla_ops_on_regular_devices.cc, so they are worth naming.
        self.xla_ops = sorted(op for op in ops if op.startswith(XLA_OP_PREFIX))
        core_used = set(ops) & core
        self.missing_in_release = {
            version: sorted(core_used - release_ops)
            for version, release_ops in (releases or {}).items()
        }

    @property
    def ok(self):
        """True when stock TF Serving of the installed TensorFlow's version, and of every
        release compared with, has every op of the export."""
        return not (self.python_ops or self.unknown_ops
                    or any(self.missing_in_release.values()))

    def summary(self):
        """A few human-readable lines."""
        lines = [f"{len(self.ops)} op types: {', '.join(self.ops)}",
                 f"TF Text ops: {', '.join(self.text_ops) or 'none'}"]
        if self.xla_ops:
            lines.append(f"tf2xla-family core ops (CPU kernels from xla_ops_on_regular_devices):"
                         f" {', '.join(self.xla_ops)}")
        if self.python_ops:
            lines.append(f"NEEDS PYTHON (no model server has these): {self.python_ops}")
        if self.unknown_ops:
            lines.append(f"NOT IN CORE TENSORFLOW OR TF TEXT: {self.unknown_ops}")
        for version, missing in self.missing_in_release.items():
            lines.append(f"missing in TensorFlow {version}: {', '.join(missing) or 'none'}")
        if not self.ok:
            lines.append("NOT loadable by stock TF Serving")
        elif self.xla_functions:
            lines.append("OK for stock TF Serving started with "
                         "--xla_cpu_compilation_enabled=true "
                         f"({len(self.xla_functions)} function(s) compile with XLA)")
        else:
            lines.append("OK for stock TF Serving")
        return "\n".join(lines)


def check_export(path, releases=(), core_and_text=None):
    """Checks a SavedModel's ops against what stock TF Serving links in.

    Args:
        path: str or path-like, a SavedModel directory.
        releases: iterable of TensorFlow versions with a recorded op list (`op_lists`) to
            compare with, e.g. `["2.20.0"]` for the newest TF Serving.
        core_and_text: `(core_ops, text_ops)` or None to compute `serving_ops()` (slow: two
            fresh TensorFlow processes); pass it when checking several exports.

    Returns:
        An `OpReport`.
    """
    core, text = core_and_text or serving_ops()
    return OpReport(saved_model_ops(path), core, text,
                    {version: recorded_ops(version) for version in releases},
                    xla_compiled_functions(path))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("export", help="SavedModel directory (or base dir: newest version)")
    parser.add_argument("--tensorflow", nargs="*", default=[TF_SERVING_VERSION],
                        help="also compare with these recorded TensorFlow releases "
                        "(default: %(default)s, the newest TF Serving)")
    args = parser.parse_args(argv)
    for version in args.tensorflow:
        try:
            recorded_ops(version)
        except KeyError as error:
            parser.error(error.args[0])
    from keras_transformer.export.saved_model import latest_version_dir

    report = check_export(latest_version_dir(args.export), releases=args.tensorflow)
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""`keras_transformer.export.op_check`: stock TF Serving can run every op of an export."""

import pathlib

import pytest
import tensorflow as tf

from keras_transformer.export import latest_version_dir
from keras_transformer.export.op_check import (
    PYTHON_OPS,
    TF_SERVING_VERSION,
    check_export,
    main,
    saved_model_ops,
    serving_ops,
)
from keras_transformer.export.op_lists import TENSORFLOW_OPS


@pytest.fixture(scope="module")
def core_and_text():
    return serving_ops()


@pytest.mark.slow  # two fresh TensorFlow processes list the op registry
def test_core_and_text_op_sets(core_and_text):
    core, text = core_and_text
    assert {"MatMul", "StatelessWhile", "PyFunc"} <= core
    # TF Text's ops_lib, SentencePiece ops included; none of them is core.
    assert {"SentencepieceOp", "SentencepieceTokenizeOp", "SentencepieceDetokenizeOp"} <= text
    assert not core & text


@pytest.mark.slow
def test_the_export_uses_only_ops_stock_tf_serving_links_in(exported, core_and_text):
    report = check_export(latest_version_dir(exported), releases=[TF_SERVING_VERSION],
                          core_and_text=core_and_text)
    assert report.ok, report.summary()
    assert not report.python_ops and not report.unknown_ops
    # The function library was read: the decoding loop and the tokenizer are in it.
    assert {"While", "StatelessWhile"} & set(report.ops), report.ops
    assert "SentencepieceTokenizeOp" in report.text_ops
    # The newest TF Serving (TensorFlow 2.20) has every core op this TensorFlow exported.
    assert report.missing_in_release[TF_SERVING_VERSION] == [], report.summary()


@pytest.mark.slow  # two fresh TensorFlow processes list the op registry
def test_python_ops_and_foreign_ops_are_refused(tmp_path, core_and_text):
    module = tf.Module()
    module.f = tf.function(
        lambda x: tf.py_function(lambda v: v * 2, [x], tf.float32),
        input_signature=[tf.TensorSpec([None], tf.float32)])
    tf.saved_model.save(module, str(tmp_path), signatures=module.f.get_concrete_function())
    ops = saved_model_ops(tmp_path)
    assert "EagerPyFunc" in ops and "EagerPyFunc" in PYTHON_OPS
    core, text = core_and_text
    report = check_export(tmp_path, core_and_text=(core, text))
    assert not report.ok and report.python_ops == ["EagerPyFunc"]
    # An op that no server links in (core without Identity stands in for a custom op).
    without_identity = check_export(tmp_path, core_and_text=(core - {"Identity"}, text))
    assert without_identity.unknown_ops == ["Identity"]
    assert "NOT IN CORE" in without_identity.summary()


@pytest.mark.slow  # two fresh TensorFlow processes list the op registry
def test_release_comparison_names_the_missing_ops(tmp_path, core_and_text):
    module = tf.Module()
    module.f = tf.function(lambda x: x + 1.0, input_signature=[tf.TensorSpec([], tf.float32)])
    tf.saved_model.save(module, str(tmp_path))
    core, text = core_and_text
    release = TENSORFLOW_OPS[TF_SERVING_VERSION]
    assert len(release) > 1000 and "AddV2" in release and "DisableCopyOnRead" in release
    report = check_export(tmp_path, releases=[TF_SERVING_VERSION], core_and_text=(core, text))
    assert report.missing_in_release == {TF_SERVING_VERSION: []} and report.ok
    # What TF 2.21 added (DecodeJxl) is a difference the comparison must be able to see: an
    # export using it is refused for the 2.20 server, by name.
    assert "DecodeJxl" in core - release
    newer = tf.Module()
    newer.f = tf.function(lambda data: tf.raw_ops.DecodeJxl(contents=data),
                          input_signature=[tf.TensorSpec([], tf.string)])
    tf.saved_model.save(newer, str(tmp_path / "newer"))
    report = check_export(tmp_path / "newer", releases=[TF_SERVING_VERSION],
                          core_and_text=(core, text))
    assert report.missing_in_release == {TF_SERVING_VERSION: ["DecodeJxl"]}
    assert not report.ok and report.unknown_ops == []  # a core op, just not in 2.20


@pytest.mark.slow
def test_command_line_exit_status(exported, capsys):
    assert main([str(exported)]) == 0
    assert "OK for stock TF Serving" in capsys.readouterr().out


@pytest.mark.slow
def test_default_export_has_no_xla_op_and_jit_export_passes_the_check(copy_task, tmp_path,
                                                                      core_and_text):
    """The default export needs no XLA kernel (the growing cache writes no
    `XlaDynamicUpdateSlice`); the `--jit` export is checked the same way and carries the
    XLA ops that need the server's `--xla_cpu_compilation_enabled=true`."""
    from keras_transformer.export import export_translator

    default = export_translator(copy_task.translator(search="greedy"), tmp_path / "default")
    jit = export_translator(copy_task.translator(search="greedy", jit_compile=True),
                            tmp_path / "jit")
    assert not any(op.startswith("Xla") for op in saved_model_ops(default))
    assert "XlaDynamicUpdateSlice" in saved_model_ops(jit)
    report = check_export(jit, releases=[TF_SERVING_VERSION], core_and_text=core_and_text)
    assert report.ok, report.summary()
    # Loadable, but a server without the XLA flag cannot run it: the verdict says so.
    assert report.xla_functions
    assert report.summary().splitlines()[-1] == (
        "OK for stock TF Serving started with --xla_cpu_compilation_enabled=true "
        f"({len(report.xla_functions)} function(s) compile with XLA)")
    plain = check_export(default, releases=[TF_SERVING_VERSION], core_and_text=core_and_text)
    assert not plain.xla_functions
    assert plain.summary().splitlines()[-1] == "OK for stock TF Serving"
    # TF Serving refuses a version whose warm-up request fails, and a `--jit` export's
    # small batches fail on a server without the XLA flag: such an export carries no
    # warm-up file, where the default export carries one.
    warmup = pathlib.Path("assets.extra") / "tf_serving_warmup_requests"
    assert (default / warmup).is_file() and not (jit / warmup).exists()


def test_an_op_missing_in_the_compared_release_fails_the_check():
    # An export using a core op that TF Serving's release lacks does not load there: the
    # check must fail (exit status 1), not list the op and print OK.
    from keras_transformer.export.op_check import OpReport

    report = OpReport({"AddV2": 1, "DisableCopyOnRead": 1}, {"AddV2", "DisableCopyOnRead"},
                      set(), {"2.20.0": {"AddV2"}})
    assert report.missing_in_release == {"2.20.0": ["DisableCopyOnRead"]}
    assert not report.ok
    assert "NOT loadable" in report.summary()
    assert OpReport({"AddV2": 1}, {"AddV2"}, set(), {"2.20.0": {"AddV2"}}).ok


def test_an_unrecorded_release_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as error:
        main(["unused", "--tensorflow", "1.0.0"])
    assert error.value.code == 2 and "No op list recorded for TensorFlow 1.0.0" in (
        capsys.readouterr().err)

"""`setup.py`'s declarations, read without running it."""

import ast
import pathlib

_SETUP = pathlib.Path(__file__).resolve().parent.parent / "setup.py"


def _extras_require():
    """The `extras_require` dict literal of `setup(...)`, as (key, value node) pairs."""
    for node in ast.walk(ast.parse(_SETUP.read_text())):
        if isinstance(node, ast.keyword) and node.arg == "extras_require":
            return [(ast.literal_eval(k), v) for k, v in zip(node.value.keys, node.value.values)]
    raise AssertionError("setup.py has no extras_require")


def test_every_extra_is_declared_once():
    # A dict literal keeps the last of two equal keys: the first one's packages are lost.
    names = [name for name, _ in _extras_require()]
    assert sorted(names) == sorted(set(names)), names


def test_the_bench_extra_installs_both_peers():
    extras = {name: ast.literal_eval(value) for name, value in _extras_require()}
    bench = " ".join(extras["bench"])
    # benchmarks/train_vs_keras_hub.py and benchmarks/decode_vs_ctranslate2.py
    assert "keras-hub" in bench and "ctranslate2" in bench, extras["bench"]


def test_the_extra_the_ctranslate2_hint_names_installs_it():
    import re

    from keras_transformer.export.ctranslate2_translator import INSTALL_HINT

    extras = {name: ast.literal_eval(value) for name, value in _extras_require()}
    named = re.search(r"keras-transformer\[(\w+)\]", INSTALL_HINT)[1]
    assert any(p.startswith("ctranslate2") for p in extras.get(named, [])), (named, extras)


def _package_data():
    """`setup(package_data=...)` as a dict, `{}` without one."""
    for node in ast.walk(ast.parse(_SETUP.read_text())):
        if isinstance(node, ast.keyword) and node.arg == "package_data":
            return ast.literal_eval(node.value)
    return {}


def test_every_data_file_of_the_package_is_installed_with_it():
    # `keras_transformer/data/checksums.tsv` was left out of a (non-editable) `pip install`:
    # every Multi30K download then failed with "No such file or directory".
    import fnmatch

    root = _SETUP.parent
    declared = _package_data()
    data_files = [path for path in (root / "keras_transformer").rglob("*")
                  if path.is_file() and path.suffix not in (".py", ".pyc")
                  and "__pycache__" not in path.parts]
    assert data_files  # checksums.tsv at least
    for path in data_files:
        package = ".".join(path.parent.relative_to(root).parts)
        assert any(fnmatch.fnmatch(path.name, pattern)
                   for pattern in declared.get(package, [])), (package, path.name, declared)

"""Every `Example:` in the package's docstrings runs and prints what it shows (doctest).

Each module runs in its own empty working directory, so examples that write files (a
tokenizer, a run directory) leave nothing behind and find nothing left by another.
"""

import doctest
import importlib
import pkgutil

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer

# Modules whose examples need the real Multi30K files (`../shared/data/multi30k`) or
# train something: they run in CI too, marked slow.
_SLOW_MODULES = {
    "keras_transformer.data.multi30k",
    "keras_transformer.export.inference",
    "keras_transformer.export.translator",
    "keras_transformer.text.tokenizers",
}


def _modules():
    names = [m.name for m in pkgutil.walk_packages(keras_transformer.__path__, "keras_transformer.")]
    return [
        pytest.param(name, marks=pytest.mark.slow) if name in _SLOW_MODULES else name
        for name in sorted(names)
        if not name.endswith("__main__")
    ]


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(name)
    results = doctest.testmod(
        module,
        extraglobs={"tf": tf, "keras": keras, "np": np},
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
        verbose=False,
    )
    assert results.failed == 0, f"{results.failed} of {results.attempted} examples failed"

"""The `Example:` sections of the decoding docstrings run and print what they show."""

import doctest
import importlib

import pytest
import tensorflow as tf


@pytest.mark.parametrize("module", ["utils", "greedy_search", "beam_search", "sampling"])
def test_docstring_examples(module):
    module = importlib.import_module(f"keras_transformer.decoding.{module}")
    results = doctest.testmod(module, extraglobs={"tf": tf}, verbose=False)
    assert results.attempted > 0
    assert results.failed == 0

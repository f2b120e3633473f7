"""The README's Python examples run as written, given the inputs they leave to the reader."""

import pathlib
import re

import numpy as np

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _python_block(after_heading):
    text = README.read_text(encoding="utf-8")
    section = text[text.index(after_heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_layers_example_runs_and_gives_the_shapes_it_shows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    source_ids = rng.integers(1, 8000, size=(2, 7)).astype("int32")
    source_ids[1, 5:] = 0  # padding
    target_in = rng.integers(1, 8000, size=(2, 5)).astype("int32")
    names = {"source_ids": source_ids, "target_in": target_in}
    exec(compile(_python_block("## Using the layers"), "README.md", "exec"), names)
    assert tuple(names["logits"].shape) == (2, 5, 8000)  # (B, T, 8000)
    assert tuple(names["x"].shape) == (2, 7, 256)  # (B, S, 256)
    assert tuple(names["out"].shape) == (2, 7, 256)
    assert tuple(names["scores"].shape) == (2, 4, 7, 7)  # (B, heads, T, S)

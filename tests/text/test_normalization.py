"""Tests of normalize: the documented NFKC + whitespace rule."""

import pytest

from keras_transformer.text import normalize


@pytest.mark.parametrize(
    "text, expected",
    [
        ("A dog runs.", "A dog runs."),
        ("  Two\tdogs \n play  ", "Two dogs play"),
        ("no\u00a0break", "no break"),
        ("ﬁne Ｆｕｌｌ", "fine Full"),
        ("Straße Übung", "Straße Übung"),
        ("\x07bell", "bell"),
        ("", ""),
        (b"bad \xff byte", "bad byte"),
        ("x\ufffdy", "x y"),
    ],
    ids=[
        "plain", "whitespace", "nbsp", "nfkc", "umlaut", "control", "empty", "bytes", "fffd"
    ],
)
def test_normalize(text, expected):
    assert normalize(text) == expected


def test_normalize_list():
    assert normalize(["a  b", " c"]) == ["a b", "c"]

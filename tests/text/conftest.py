"""Fixtures of the text tests: a small vocabulary trained once per session."""

import gzip
import pathlib

import pytest

MULTI30K_DIR = pathlib.Path(__file__).resolve().parents[3] / "shared" / "data" / "multi30k"
# Big enough to learn real subwords of both languages, small enough to train in ~1 s.
SMALL_VOCAB_SIZE = 2000
# Every 4th training pair: the vocabulary trains in about a second on 2 cores.
TRAIN_STRIDE = 4


def read_lines(stem, lang):
    path = MULTI30K_DIR / f"{stem}.{lang}.gz"
    if not path.is_file():
        pytest.skip(f"Multi30K raw files not found at {MULTI30K_DIR}")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


@pytest.fixture(scope="session")
def train_sentences():
    """Every TRAIN_STRIDE-th English and German training sentence."""
    return read_lines("train", "en")[::TRAIN_STRIDE] + read_lines("train", "de")[::TRAIN_STRIDE]


@pytest.fixture(scope="session")
def small_model_path(tmp_path_factory, train_sentences):
    from keras_transformer.text import train_sentencepiece

    path = tmp_path_factory.mktemp("vocab") / "tokenizer.model"
    return train_sentencepiece(train_sentences, path, vocab_size=SMALL_VOCAB_SIZE)


@pytest.fixture(scope="session")
def tokenizer(small_model_path):
    from keras_transformer.text import SubwordTokenizer

    return SubwordTokenizer(small_model_path)

"""Fixtures of the data tests: a toy French->English corpus written to files by the tests.

The toy language maps each French word to one English word and reverses nothing, so a
tiny model learns something in a few steps; what matters here is that every source feeds
the real pipeline, not the quality.
"""

import gzip
import pathlib
import random

import pytest

# French -> English word table of the toy corpus.
WORDS = {"le": "the", "chat": "cat", "chien": "dog", "noir": "black", "petit": "small",
         "mange": "eats", "dort": "sleeps", "court": "runs", "ici": "here", "vite": "fast"}
# Pairs per split of the toy corpus.
SPLIT_SIZES = {"train": 96, "val": 16, "test": 12}


def toy_pairs(count, seed):
    """`count` (French, English) pairs of 2-6 words."""
    rng = random.Random(seed)
    french = list(WORDS)
    pairs = []
    for _ in range(count):
        words = [rng.choice(french) for _ in range(rng.randint(2, 6))]
        pairs.append((" ".join(words), " ".join(WORDS[w] for w in words)))
    return pairs


def write_lines(path, lines, compress=None):
    """Writes lines (str) to `path`, gzipped when the name ends with `.gz`."""
    path = pathlib.Path(path)
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    if path.name.endswith(".gz") or compress:
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def write_bytes(path, data):
    """Writes raw bytes (gzipped for `.gz`), for the bad-data cases."""
    path = pathlib.Path(path)
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


@pytest.fixture(scope="session")
def toy_corpus(tmp_path_factory):
    """Toy fr->en splits as plain files, `.gz` files, TSV files and Multi30K-named files.

    Returns:
        dict with `splits` ({split: [(fr, en)]}), `files` ({split: [fr_path, en_path]}),
        `gz` (same, gzipped), `tsv` ({split: path}), `multi30k` (a directory of
        `{train,val,test_2016_flickr,test_2017_flickr,test_2017_mscoco,test_2018_flickr}.
        {fr,en,cs}.gz`, the Czech side a copy of the English one).
    """
    root = tmp_path_factory.mktemp("toy")
    splits = {name: toy_pairs(size, seed) for seed, (name, size) in enumerate(SPLIT_SIZES.items())}
    corpus = {"splits": splits, "files": {}, "gz": {}, "tsv": {}, "multi30k": root / "multi30k"}
    corpus["multi30k"].mkdir()
    for name, pairs in splits.items():
        french, english = [p[0] for p in pairs], [p[1] for p in pairs]
        corpus["files"][name] = [str(write_lines(root / f"{name}.fr", french)),
                                 str(write_lines(root / f"{name}.en", english))]
        corpus["gz"][name] = [str(write_lines(root / f"{name}.fr.gz", french)),
                              str(write_lines(root / f"{name}.en.gz", english))]
        corpus["tsv"][name] = str(write_lines(
            root / f"{name}.tsv", [f"{f}\t{e}" for f, e in pairs]))
    stems = {"train": ["train"], "val": ["val"],
             "test": ["test_2016_flickr", "test_2017_flickr", "test_2017_mscoco",
                      "test_2018_flickr"]}
    for name, pairs in splits.items():
        for stem in stems[name]:
            for lang, side in (("fr", 0), ("en", 1), ("cs", 1)):
                if lang == "cs" and stem.startswith("test_2017"):
                    continue  # never published in Czech
                write_lines(corpus["multi30k"] / f"{stem}.{lang}.gz", [p[side] for p in pairs])
    return corpus

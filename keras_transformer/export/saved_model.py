"""Writes a `Translator` as a versioned SavedModel, the layout TF Serving watches."""

import json
import os
import pathlib
import re
import shutil
import time

import tensorflow as tf

from keras_transformer.export.ctranslate2_translator import (
    METADATA_NAME as CTRANSLATE2_METADATA_NAME,
)
from keras_transformer.export.warmup import (
    WARMUP_FILENAME,
    text_signatures,
    write_warmup_requests,
)
from keras_transformer.textfiles import is_url, remove_stale_partials

# `.tmp-VERSION-PID`: where process PID writes a version before renaming it into place.
_STAGING = re.compile(r"\.tmp-\d+-(?P<pid>\d+)$")


# TF Serving reads a version directory's name as an int64.
MAX_VERSION = 2**63 - 1


def next_version(base_dir):
    """The next free integer version under `base_dir` (1 when there is none)."""
    base_dir = pathlib.Path(base_dir)
    versions = [int(p.name) for p in base_dir.iterdir() if p.is_dir() and p.name.isdigit()] \
        if base_dir.is_dir() else []
    return max(versions, default=0) + 1


def check_base_dir(base_dir, version=None):
    """Refuses a `base_dir` that is itself a SavedModel (a version directory): a new
    version would go to `base_dir/<n>/`, which nothing reading `base_dir` would find,
    since a reader takes `base_dir` itself for the model (`latest_version_dir`); and a
    `version` below 1 or already written (before a model is loaded for nothing).

    A version must also fit TF Serving's int64 version numbers (a larger one would be taken
    for the latest by `latest_version_dir`, never by a server).

    Raises:
        ValueError: when `base_dir` is a file, `base_dir/saved_model.pb` exists, or
            `version` (or the next free one) is below 1 or past int64.
        FileExistsError: when `base_dir/<version>` exists.
    """
    if is_url(base_dir):
        raise ValueError(
            f"{os.fspath(base_dir)} is a URL: the export writes a local directory (its version "
            "is staged and renamed into place whole, which object stores do not do). Export "
            "to a local --out, then copy the version directory to the bucket (`gsutil cp "
            "-r`, `aws s3 cp --recursive`).")
    base_dir = pathlib.Path(base_dir)
    if base_dir.exists() and not base_dir.is_dir():
        raise ValueError(f"{base_dir} is a file, not a model's base directory (--out): give a "
                         "directory, which gets a version subdirectory.")
    if (base_dir / "saved_model.pb").is_file():
        raise ValueError(
            f"{base_dir} is an exported version, not a model's base directory: export to "
            f"its parent ({base_dir.parent}), which gets the next version (--out)."
        )
    if version is not None:
        if int(version) < 1:
            raise ValueError(f"version must be a positive integer, got version={version}.")
        if int(version) > MAX_VERSION:
            raise ValueError(f"version {version} is past int64 ({MAX_VERSION}), the largest "
                             "version TF Serving reads.")
        final = base_dir / str(int(version))
        if final.exists():
            raise FileExistsError(f"{final} exists; pass another --version or remove it.")
    elif next_version(base_dir) > MAX_VERSION:
        raise ValueError(f"The next version under {base_dir} would be {next_version(base_dir)}, "
                         f"past int64 ({MAX_VERSION}), the largest version TF Serving reads: "
                         "remove the directory numbered past it, or pass --version.")


def export_translator(translator, base_dir, version=None, metadata=None):
    """Saves `translator` to `base_dir/<version>/` for TF Serving's `--model_base_path`.

    The SavedModel is written to a hidden temporary directory beside its final place and
    renamed when complete, so a model server polling `base_dir` never loads a half-written
    version. Signatures: `serving_default` and `translate` (the export-time search),
    `translate_greedy` (unless that search is greedy), `metadata` (the direction), and for a
    sampling export `translate_seeded(text, seed)` (see `Translator`). The tokenizer models
    are SavedModel assets; `assets.extra/translator.json` records the decoding settings and
    `metadata`, and `assets.extra/tf_serving_warmup_requests` holds requests TF Serving
    replays when it loads the version (`keras_transformer.export.warmup`; none for the
    signatures XLA compiles, `Translator.compiled_signatures`).

    Args:
        translator: a `Translator`.
        base_dir: str or path-like, the model's base directory (created if missing).
        version: int or None, the version to write. Defaults to the next free one.
        metadata: dict or None, JSON-serializable facts to record (training run, BLEU...).

    Returns:
        `pathlib.Path` of the written version directory.

    Raises:
        FileExistsError: when `base_dir/<version>` exists already.
        ValueError: when `base_dir` is itself an exported version (`check_base_dir`).
    """
    base_dir = pathlib.Path(base_dir)
    check_base_dir(base_dir, version)
    base_dir.mkdir(parents=True, exist_ok=True)
    version = next_version(base_dir) if version is None else int(version)
    final = base_dir / str(version)
    staging = base_dir / f".tmp-{version}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    remove_stale_partials(base_dir, pattern=_STAGING)  # of exports killed before
    try:
        tf.saved_model.save(translator, str(staging), signatures=translator.signatures())
        extra = staging / "assets.extra"
        extra.mkdir(exist_ok=True)
        record = {
            "decoding": vars(translator.config),
            "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "tensorflow": tf.__version__,
            # The `metadata` signature's facts (the direction), which a server batching its
            # requests cannot call: the record is where a client reads them then.
            **{key: value for key, value in getattr(translator, "metadata_values", {}).items()
               if value not in ("", None)},
            **(metadata or {}),
        }
        (extra / "translator.json").write_text(json.dumps(record, indent=2, default=str))
        # A signature XLA compiles gets no warm-up request (see
        # `keras_transformer.export.warmup`): the rest of a `--jit` export gets them.
        compiled = translator.compiled_signatures()
        signatures = {name: function for name, function in translator.signatures().items()
                      if name not in compiled}
        if text_signatures(signatures):
            write_warmup_requests(extra / WARMUP_FILENAME, signatures)
        try:
            os.replace(staging, final)
        except OSError as error:
            if not final.is_dir():
                raise
            raise FileExistsError(
                f"While this export saved, another export wrote {final}; nothing was "
                "overwritten. Export again for the next version, or pass another --version."
            ) from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def latest_version_dir(path):
    """`path` itself if it is a SavedModel, else its highest integer version subdirectory."""
    path = pathlib.Path(path)
    if (path / "saved_model.pb").is_file():
        return path
    if not path.exists():
        raise FileNotFoundError(
            f"{path} does not exist; export a run with `keras-transformer export --model "
            "RUN_DIR --out DIR` (or `export-ctranslate2`).")
    if (path / "model.bin").is_file():
        if (path / CTRANSLATE2_METADATA_NAME).is_file():  # `inference.is_ctranslate2_model`
            raise FileNotFoundError(
                f"{path} is a CTranslate2 model (export-ctranslate2), not a SavedModel: "
                "`translate`/`evaluate --export` and `CTranslate2Translator` take it.")
        raise FileNotFoundError(
            f"{path} holds a CTranslate2 model.bin without {CTRANSLATE2_METADATA_NAME}: convert "
            "runs with `keras-transformer export-ctranslate2 --model RUN_DIR --out DIR`, "
            "which writes both.")
    versions = sorted(
        (p for p in path.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)
    ) if path.is_dir() else []
    if not versions:
        raise FileNotFoundError(
            f"{path} is neither a SavedModel nor a base directory with integer versions; "
            "export one with `keras-transformer export --model RUN_DIR --out DIR`."
        )
    return versions[-1]

"""Reads a training run directory: the contract between training and export.

A run directory (written by `keras-transformer train`) holds:
- `config.json`: the `TrainingConfig` of the run, as a dict;
- `tokenizer/`: `tokenizer.model` (shared vocabulary) or `source.model` and `target.model`;
- `model.keras`: the final model; `checkpoints/best.keras`: the best by validation BLEU
  (by validation loss in a run without validation BLEU, by training loss without validation),
  with `checkpoints/best.keras.json`, its score and epoch;
- `checkpoints/last.keras`, `logs/` (TensorBoard), `backup/` (BackupAndRestore, while
  training), `history.json` (every epoch's logs and time);
- `checkpoints/epoch-NNN.weights.npz` (with `keep_checkpoints`) and
  `checkpoints/averaged.keras` (their mean, written by `keras-transformer average`, with
  `checkpoints/averaged.keras.json`, the record of the checkpoints it averages).
"""

import json
import pathlib
import sys

import keras

from keras_transformer.checkpoint_files import check_average_is_current, check_run_directory
from keras_transformer.text import load_tokenizers

CHECKPOINTS = ("best", "final", "last", "averaged")


def model_path(run_dir, checkpoint="best"):
    """The `.keras` file of `checkpoint` ("best" falls back to the final model)."""
    run_dir = pathlib.Path(run_dir)
    if checkpoint not in CHECKPOINTS:
        raise ValueError(f"checkpoint must be one of {CHECKPOINTS}, got {checkpoint!r}.")
    candidates = {
        "best": [run_dir / "checkpoints" / "best.keras", run_dir / "model.keras"],
        "final": [run_dir / "model.keras"],
        "last": [run_dir / "checkpoints" / "last.keras"],
        "averaged": [run_dir / "checkpoints" / "averaged.keras"],
    }[checkpoint]
    check_run_directory(run_dir)
    for path in candidates:
        if path.is_file():
            if checkpoint == "averaged":
                check_average_is_current(path)
            return path
    hint = (
        "write it with `keras-transformer average --model RUN --last N`"
        if checkpoint == "averaged" else "train one with `keras-transformer train`"
    )
    raise FileNotFoundError(
        f"No {checkpoint} model in {run_dir} (looked for "
        f"{', '.join(str(p) for p in candidates)}); {hint}."
    )


def resolve_checkpoint(run_dir, checkpoint="best"):
    """`(name, path)`: the checkpoint `model_path` really picks for `checkpoint`.

    `name` is the checkpoint used, which differs from the one asked for when "best" falls
    back to the final model (`"final"`, `model.keras`): exports record and print it.
    """
    path = model_path(run_dir, checkpoint)
    return ("final" if path.name == "model.keras" else path.stem), path


def load_run(run_dir, checkpoint="best", dtype_policy="float32"):
    """Loads `(model, source_tokenizer, target_tokenizer, config_dict)` from a run directory.

    The model loads with `safe_mode=True`: it holds no lambdas or custom code beyond the
    registered `keras_transformer` layers. It computes under `dtype_policy`, whatever the
    run trained with: a run trained under `mixed_bfloat16` saves that policy with its layers,
    and would otherwise decode in bfloat16, slowly on CPUs without bfloat16 instructions.

    Args:
        run_dir: the run directory.
        checkpoint: `"best"`, `"final"`, `"averaged"` or `"last"` (see `model_path`).
        dtype_policy: Keras dtype policy name the model computes under (`with_dtype_policy`),
            or None for the policy it was saved with. Defaults to `"float32"`.
    """
    run_dir = pathlib.Path(run_dir)
    import keras_transformer.layers  # noqa: F401  (registers the layer classes)
    from keras_transformer.model import with_dtype_policy

    model = keras.saving.load_model(model_path(run_dir, checkpoint), compile=False, safe_mode=True)
    if dtype_policy is not None:
        model = with_dtype_policy(model, dtype_policy)
    source_tokenizer, target_tokenizer = load_tokenizers(run_dir / "tokenizer")
    config_path = run_dir / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    return model, source_tokenizer, target_tokenizer, config


def data_spec(record):
    """The data source and direction in a run's config or an export's metadata record:
    `{"data", "data_files", "source_lang", "target_lang"}`.

    Exports from before the direction was recorded hold only the training config; their
    data is Multi30K in the config's languages.
    """
    config = record.get("training_config") or record
    return {key: record.get(key, config.get(key, default)) for key, default in (
        ("data", "multi30k"), ("data_files", None), ("source_lang", "en"),
        ("target_lang", "de"))}


def read_split(spec, split="test", local_dir=None, tfds_dir=None, limit=None):
    """A split of a run's data as `keras-transformer evaluate --split` reads it.

    Every pair is kept (`keep_all`): a sentence too long to train on is still translated
    and scored. The benchmarks and `choose_on_validation.py` read a run's own test or
    validation set with it, in the run's direction.

    Args:
        spec: dict, `data_spec` of a run's config or an export's record.
        split: str, `"test"` (the source's first test set), `"validation"` or a split's
            name. Defaults to `"test"`.
        local_dir: Multi30K's raw-file directory, or None to find it.
        tfds_dir: TFDS data directory, or None for TFDS' own.
        limit: int or None, only the first `limit` pairs.

    Returns:
        `(sources, references, description, target_lang)`: lists of str, a description
        such as `"files fr->en [news]"`, and the language BLEU is tokenized for.

    Raises:
        ValueError: the source has no such split, its files are named the other way round
            or do not pair up, or `limit` is negative.
        OSError: a split's file cannot be read (FileNotFoundError when it has moved).
    """
    from keras_transformer.data import open_source

    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 (or None: every pair), got limit={limit}.")
    source = open_source(**spec, local_dir=local_dir, tfds_dir=tfds_dir)
    if split == "test" and not source.test_sets():
        raise ValueError(
            f"{source.describe()} has no test set (a run trained without --test): give "
            "--split validation, or --src/--ref files to score.")
    split = source.resolve(split)
    source.check_directions([split])
    pairs = list(source.pairs(split, keep_all=True, limit=limit or None))
    return ([s for s, _ in pairs], [t for _, t in pairs],
            f"{source.describe()} [{split}]", source.target_lang)


def export_run(run_dir, out, checkpoint="best", decoding=None, version=None,
               dtype_policy="float32"):
    """Exports a training run as `keras-transformer export` does.

    The SavedModel answers its `metadata` signature with the run's languages, and its
    record (`assets.extra/translator.json`) holds the run's data source, direction and
    configuration and the checkpoint exported, which `evaluate --split` and `translate`
    read.

    Args:
        run_dir: the run directory.
        out: the base directory; the next version (or `version`) is written under it.
        checkpoint: `"best"`, `"final"`, `"last"` or `"averaged"` (see `model_path`; the
            record names the one used). Defaults to `"best"`.
        decoding: a `DecodingConfig`, or None for `DecodingConfig.for_export()` (the
            command's defaults). Defaults to None.
        version: int or None, the version number (None: the next one). Defaults to None.
        dtype_policy: the policy the exported model computes under (`"float32"` or
            `"bfloat16"`). Defaults to `"float32"`.

    Returns:
        `pathlib.Path` of the written version directory.
    """
    from keras_transformer.export.saved_model import check_base_dir, export_translator
    from keras_transformer.export.translator import DecodingConfig, Translator

    check_base_dir(out, version)  # before the model loads
    decoding = DecodingConfig.for_export() if decoding is None else decoding
    used, path = resolve_checkpoint(run_dir, checkpoint)
    model, source_tokenizer, target_tokenizer, config = load_run(run_dir, checkpoint,
                                                                 dtype_policy=dtype_policy)
    if config:
        direction = data_spec(config)
    else:  # its direction and data are unknown: recorded as such, not as data_spec's
        direction = {"data": "", "data_files": None, "source_lang": "", "target_lang": ""}
        print(f"Warning: {run_dir} has no config.json: the export records no languages and "
              "no data (its metadata signature gives empty ones, and `evaluate --split` "
              "cannot find its data; score it with --src/--ref). Keep config.json with the "
              "run to record them.", file=sys.stderr, flush=True)
    translator = Translator(
        model, source_tokenizer, target_tokenizer, decoding,
        metadata={"source_lang": direction["source_lang"] or "",
                  "target_lang": direction["target_lang"] or "", "data": direction["data"]},
    )
    return export_translator(
        translator, out, version=version,
        # Absolute: the record is read from other directories (and other shells).
        metadata={"run_dir": str(pathlib.Path(run_dir).resolve()), "checkpoint": used,
                  "checkpoint_requested": checkpoint,
                  "checkpoint_path": str(pathlib.Path(path).resolve()),
                  "dtype": dtype_policy, "training_config": config, **direction},
    )

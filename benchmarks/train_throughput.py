"""Training throughput: real (non-padding) tokens per second of `model.fit` steps.

Measures one preset's model on the Multi30K training pipeline (bucketed, token-based
batches) under float32 and under `mixed_bfloat16`, each in a fresh subprocess so the dtype
policy is clean. Prints a Markdown table for benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/train_throughput.py --preset multi30k --steps 40

`--set` changes the model and its batching, not the data (always Multi30K's English-German
training pairs), the precision (`--precisions`) or subword sampling (not drawn here).
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Fields `--set` may not change: the data measured on is Multi30K's, the precision
# `--precisions`'s, and `preset_model` draws no subword samples.
DATA_FIELDS = ("data", "data_files", "source_lang", "target_lang")
UNMEASURED_FIELDS = ("subword_nbest", "subword_alpha")


@contextlib.contextmanager
def preset_model(preset, precision, total_steps, overrides=(), jit_compile="auto"):
    """Yields `(model, train_ds, precision, overrides)`: a preset's compiled model and its
    Multi30K training pipeline, as a run builds them (also used by profile_train_step.py).

    `precision` may be `"auto"` (this machine's choice; the resolved one is yielded, `None`
    for float32), `overrides` are `--set` items `FIELD=VALUE` (yielded as a dict) and
    `total_steps` the updates the caller takes: the run a cooldown (`lr_cooldown`) would end.
    """
    import keras

    from keras_transformer.data import load_multi30k
    from keras_transformer.training import get_preset, parse_overrides
    from keras_transformer.training.presets import resolve_precision
    from keras_transformer.training.trainer import (
        build_model, compile_model, make_datasets, prepare_tokenizers,
    )

    overrides = parse_overrides(overrides)
    config = get_preset(preset).replace(precision=precision, **overrides)
    keras.utils.set_random_seed(config.seed)
    precision = resolve_precision(precision)  # "auto" -> this machine's choice
    if precision:
        keras.config.set_dtype_policy(precision)
    splits = {s: load_multi30k(s) for s in ("train", "validation")}
    with tempfile.TemporaryDirectory() as tmp:
        source, target = prepare_tokenizers(config, splits["train"], tmp)
        _, train_ds, _ = make_datasets(config, splits, source, target)
        jit = {"auto": "auto", "true": True, "false": False}[jit_compile]
        model = compile_model(build_model(config, source, target), config, jit_compile=jit,
                              total_steps=total_steps)
        yield model, train_ds, precision, overrides


def measure(preset, precision, steps, warmup, overrides=(), jit_compile="auto"):
    from keras_transformer.training.trainer import training_tokens_per_second

    with preset_model(preset, precision, warmup + steps, overrides, jit_compile) as (
            model, train_ds, precision, overrides):
        rate = training_tokens_per_second(model, train_ds, steps=steps, warmup_steps=warmup)
    return {"preset": preset, "precision": precision or "float32", "tokens_per_second": rate,
            "parameters": model.count_params(), "steps": steps,
            "jit_compile": model.jit_compile, "overrides": overrides}


def _check_overrides(preset, items):
    """Refuses (SystemExit) an unknown preset and `--set` items the children would fail on
    or ignore, before any child starts."""
    from keras_transformer.training import get_preset, parse_overrides

    try:
        config = get_preset(preset)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    try:
        overrides = parse_overrides(items)
    except ValueError as error:
        raise SystemExit(f"--set: {error}") from None
    data = sorted(set(overrides) & set(DATA_FIELDS))
    if data:
        raise SystemExit(f"--set {', '.join(data)}: this benchmark measures the model on "
                         "Multi30K's English-German training batches, whatever the data.")
    if "precision" in overrides:
        raise SystemExit("--set precision: the precisions measured are --precisions'.")
    unmeasured = sorted(set(overrides) & set(UNMEASURED_FIELDS))
    if unmeasured:
        raise SystemExit(f"--set {', '.join(unmeasured)}: this benchmark draws no subword "
                         "samples (each batch is the best segmentation).")
    try:
        config.replace(**overrides)
    except ValueError as error:
        raise SystemExit(f"--set: {error}") from None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="multi30k")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--precisions", default="float32,mixed_bfloat16",
                        help="comma-separated precisions to measure, each in a fresh process")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a TrainingConfig field of the preset (repeatable)")
    parser.add_argument("--jit-compile", choices=("auto", "true", "false"), default="auto",
                        help="model.compile(jit_compile=...): Keras' 'auto' means no XLA on a "
                        "CPU-only machine")
    parser.add_argument("--precision", help="internal: measure one precision in this process")
    args = parser.parse_args(argv)
    if args.precision:
        precision = None if args.precision == "float32" else args.precision
        print("RESULT " + json.dumps(measure(args.preset, precision, args.steps, args.warmup,
                                             args.set, args.jit_compile)))
        return
    _check_overrides(args.preset, args.set)
    rows = []
    for precision in args.precisions.split(","):
        command = [sys.executable, __file__, "--preset", args.preset, "--steps",
                   str(args.steps), "--warmup", str(args.warmup), "--precision", precision,
                   "--jit-compile", args.jit_compile]
        for item in args.set:
            command += ["--set", item]
        child = subprocess.run(command, capture_output=True, text=True)
        if child.returncode or "RESULT " not in child.stdout:
            sys.stderr.write(child.stderr[-4000:])
            raise SystemExit(f"Measuring {precision} failed (exit status {child.returncode}; "
                             "its error is above).")
        rows.append(json.loads(child.stdout.split("RESULT ", 1)[1]))
    print("| preset | overrides | precision | XLA | parameters | steps | real tokens/s (src+tgt) |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        overrides = " ".join(f"{k}={v}" for k, v in row["overrides"].items()) or "-"
        print(f"| {row['preset']} | {overrides} | {row['precision']} | {row['jit_compile']} "
              f"| {row['parameters']:,} | {row['steps']} | {row['tokens_per_second']:,.0f} |")


if __name__ == "__main__":
    main()

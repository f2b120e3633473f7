"""Training throughput: real (non-padding) tokens per second of `model.fit` steps.

Measures one preset's model on the Multi30K training pipeline (bucketed, token-based
batches) under float32 and under `mixed_bfloat16`, each in a fresh subprocess so the dtype
policy is clean. Prints a Markdown table for benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/train_throughput.py --preset multi30k --steps 40
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def measure(preset, precision, steps, warmup):
    import keras

    from keras_transformer.data import load_multi30k
    from keras_transformer.training import get_preset
    from keras_transformer.training.trainer import (
        build_model, compile_model, make_datasets, prepare_tokenizers, training_tokens_per_second,
    )

    config = get_preset(preset).replace(precision=precision)
    keras.utils.set_random_seed(config.seed)
    if precision:
        keras.config.set_dtype_policy(precision)
    splits = {s: load_multi30k(s) for s in ("train", "validation")}
    with tempfile.TemporaryDirectory() as tmp:
        source, target = prepare_tokenizers(config, splits["train"], tmp)
        _, train_ds, _ = make_datasets(config, splits, source, target)
        model = compile_model(build_model(config, source, target), config)
        rate = training_tokens_per_second(model, train_ds, steps=steps, warmup_steps=warmup)
    return {"preset": preset, "precision": precision or "float32", "tokens_per_second": rate,
            "parameters": model.count_params(), "steps": steps}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="multi30k")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--precision", help="internal: measure one precision in this process")
    args = parser.parse_args()
    if args.precision:
        precision = None if args.precision == "float32" else args.precision
        print("RESULT " + json.dumps(measure(args.preset, precision, args.steps, args.warmup)))
        return
    rows = []
    for precision in ("float32", "mixed_bfloat16"):
        out = subprocess.run(
            [sys.executable, __file__, "--preset", args.preset, "--steps", str(args.steps),
             "--warmup", str(args.warmup), "--precision", precision],
            capture_output=True, text=True, check=True,
        ).stdout
        rows.append(json.loads(out.split("RESULT ", 1)[1]))
    print(f"| preset | precision | parameters | steps | real tokens/s (src+tgt) |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['preset']} | {row['precision']} | {row['parameters']:,} | {row['steps']} "
              f"| {row['tokens_per_second']:,.0f} |")


if __name__ == "__main__":
    main()

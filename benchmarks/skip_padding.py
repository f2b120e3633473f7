"""Training steps with and without `skip_padding`, side by side on the same batches.

Builds a preset's model twice with the same weights, once with `skip_padding=True` (the
stacks and the tied projection compute the real tokens only), and times alternating
`train_on_batch` steps (the order flips every step) on one of two kinds of batches:

- `padded`: one fixed length (`--length`), rows of random lengths from 2 to it, drawn by
  `train_vs_keras_hub.make_batches` (about half of the positions are padding);
- `bucketed`: the preset's own Multi30K training batches (length buckets, a token budget),
  as `keras-transformer train` makes them.

Prints real (non-padding) source + target tokens per second of each model, the padding of
the batches and the ratio.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/skip_padding.py --batches padded
    PYTHONPATH=$PWD .venv/bin/python benchmarks/skip_padding.py --batches bucketed
"""

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # train_vs_keras_hub


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="multi30k")
    parser.add_argument("--batches", choices=("padded", "bucketed"), default="padded")
    parser.add_argument("--precision", default="auto",
                        help="float32, mixed_bfloat16 or auto (this machine's choice)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per model")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per model first")
    parser.add_argument("--batch-size", type=int, default=64, help="padded batches only")
    parser.add_argument("--length", type=int, default=32, help="padded batches only")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a TrainingConfig field of the preset (repeatable)")
    args = parser.parse_args(argv)

    import keras
    import numpy as np

    from keras_transformer.data import load_multi30k
    from keras_transformer.training import get_preset, parse_overrides
    from keras_transformer.training.presets import resolve_precision
    from keras_transformer.training.trainer import (
        build_model, compile_model, make_datasets, prepare_tokenizers,
    )

    try:
        config = get_preset(args.preset).replace(**parse_overrides(args.set))
    except ValueError as error:
        parser.error(str(error))
    precision = resolve_precision(args.precision)
    if precision:
        keras.config.set_dtype_policy(precision)
    keras.utils.set_random_seed(config.seed)
    count = args.warmup + args.steps
    splits = {"train": load_multi30k("train"), "validation": None}
    with tempfile.TemporaryDirectory() as tmp:
        source, target = prepare_tokenizers(config, splits["train"], tmp)
        if args.batches == "bucketed":
            _, train_ds, _ = make_datasets(config, splits, source, target)
            batches = [({k: v.numpy() for k, v in x.items()}, y.numpy())
                       for x, y in train_ds.take(count)]
        else:
            from train_vs_keras_hub import make_batches

            batches = make_batches(argparse.Namespace(
                seed=config.seed, batch_size=args.batch_size, length=args.length,
                vocab_size=source.vocab_size), count)
        models = {}
        for skip in (False, True):
            model = build_model(config.replace(skip_padding=skip), source, target)
            # No XLA for either (a model skipping padding cannot have it).
            models[skip] = compile_model(model, config, jit_compile=False, total_steps=count)
        models[True].set_weights(models[False].get_weights())
    seconds = dict.fromkeys(models, 0.0)
    tokens = positions = 0
    for step, (inputs, labels) in enumerate(batches):
        for skip in (False, True) if step % 2 == 0 else (True, False):
            started = time.perf_counter()
            models[skip].train_on_batch(inputs, labels)
            if step >= args.warmup:
                seconds[skip] += time.perf_counter() - started
        if step >= args.warmup:
            real = np.count_nonzero(inputs["encoder_tokens"]) + np.count_nonzero(labels)
            tokens += int(real)
            positions += inputs["encoder_tokens"].size + labels.size
    if args.batches == "padded":
        shape = f"{args.batch_size}x{args.length}"
    elif config.tokens_per_batch:
        shape = f"length buckets of {config.tokens_per_batch} tokens"
    else:
        shape = f"length buckets of {config.batch_size} rows"
    print(f"{args.preset}, {precision or 'float32'}, {args.batches} batches ({shape}, "
          f"{1 - tokens / positions:.0%} padding), {args.steps} timed steps after "
          f"{args.warmup} warm-up steps")
    print("| skip_padding | real tokens/s (src+tgt) |")
    print("|---|---|")
    for skip in (False, True):
        print(f"| {skip} | {tokens / seconds[skip]:,.0f} |")
    print(f"ratio skip_padding / every position: {seconds[False] / seconds[True]:.2f}x")


if __name__ == "__main__":
    main()

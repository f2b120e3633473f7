"""Padding of a preset's training batches for several bucket spacings, over a whole epoch.

The work of a training step grows with its padded positions, not with its real tokens, so
the padding is what a finer set of length buckets can save: this script builds the
preset's training pipeline on Multi30K's training split (its vocabulary, token budget and
seed; over-long pairs truncated, where a run with `drop_long_pairs` drops them) once per geometric
growth factor of the bucket edges (`default_bucket_boundaries(max_length, growth=g)`),
reads one full epoch and prints, per spacing, the number of buckets and batches, the
padding fraction (encoder and decoder positions) and the padded positions per real token
relative to the first spacing. No timing: these figures are exact for the data and seed.

    .venv/bin/python benchmarks/bucket_padding.py --preset multi30k --growths 1.25,1.1
"""

import argparse
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="multi30k")
    parser.add_argument("--growths", default="1.25,1.15,1.1,1.05",
                        help="comma-separated growth factors of the bucket edges; the first "
                        "is the reference of the last column")
    parser.add_argument("--limit", type=int, default=None,
                        help="the first N training pairs only (default: all)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a TrainingConfig field of the preset (repeatable; "
                        "values read as JSON)")
    args = parser.parse_args(argv)
    growths = [float(g) for g in args.growths.split(",")]
    if not growths or any(g <= 1.0 for g in growths):
        parser.error("--growths: factors above 1, e.g. 1.25,1.1")

    from keras_transformer.data import (
        default_bucket_boundaries, load_multi30k, padding_fraction,
    )
    from keras_transformer.training import get_preset, parse_overrides
    from keras_transformer.training.trainer import make_datasets, prepare_tokenizers

    try:
        config = get_preset(args.preset).replace(**parse_overrides(args.set))
    except ValueError as error:
        parser.error(str(error))
    if config.tokens_per_batch is None:
        parser.error(f"the {args.preset!r} preset batches by a fixed batch size: its batch "
                     "sizes do not follow the bucket edges")
    splits = {"train": load_multi30k("train"), "validation": None}
    if args.limit:
        splits["train"] = splits["train"].take(args.limit)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        source, target = prepare_tokenizers(config, splits["train"], tmp)
        for growth in growths:
            edges = default_bucket_boundaries(config.max_length, growth=growth)
            _, train_ds, _ = make_datasets(
                config.replace(bucket_boundaries=edges), splits, source, target)
            batches = int(train_ds.reduce(0, lambda count, _: count + 1))
            rows.append((growth, edges, batches, padding_fraction(train_ds)))
    print(f"{args.preset}: {config.tokens_per_batch} tokens per batch, max_length "
          f"{config.max_length}, seed {config.seed}, one epoch")
    print("| growth | buckets | batches per epoch | padding | padded positions per real token, "
          "relative |")
    print("|---|---|---|---|---|")
    # Padded positions per real token are 1 / (1 - padding).
    reference = 1 - rows[0][3]
    for growth, edges, batches, padding in rows:
        print(f"| {growth:g} | {len(edges) + 1} | {batches} | {padding:.1%} | "
              f"{reference / (1 - padding):.3f} |")
    for growth, edges, *_ in rows:
        print(f"growth {growth:g}: --set bucket_boundaries=[{','.join(map(str, edges))}]")


if __name__ == "__main__":
    main()

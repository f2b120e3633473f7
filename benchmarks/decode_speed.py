"""Decoding speed and BLEU of the exported SavedModel on a run's own test set.

Exports one trained run three ways (uncached greedy, cached greedy, cached beam 4), loads each
SavedModel with `tf.saved_model.load` (as a server would), and measures on the run's first
test set (`--split`; test_2016 for the `multi30k` presets, read as `keras-transformer
evaluate` reads it, BLEU tokenized for the run's target language): throughput in sentences/second (batches of --batch-size), per-sentence latency (batch of one,
median over --latency-sentences) and cased sacreBLEU. Prints a Markdown table.

    .venv/bin/python benchmarks/decode_speed.py --run runs/multi30k
"""

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Time the export under the CPU allocator TF Serving runs by default (TensorFlow's), not the
# BFC allocator that importing keras_transformer selects for training (README, "Training");
# TF_CPU_ALLOCATOR_USE_BFC=true in the environment times BFC instead.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "false")

VARIANTS = (
    ("uncached greedy", dict(search="greedy_uncached")),
    ("cached greedy", dict(search="greedy")),
    ("cached beam 4", dict(search="beam", beam_size=4)),
)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", required=True, help="training run directory")
    parser.add_argument("--checkpoint", default="best",
                        choices=("best", "final", "last", "averaged"))
    parser.add_argument("--split", default="test",
                        help="the run's split to translate (default: its first test set)")
    parser.add_argument("--data-dir", help="raw Multi30K directory (as for `keras-transformer "
                        "evaluate`)")
    parser.add_argument("--tfds-dir", help="TFDS data directory of a tfds:NAME run")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--limit", type=int, default=None, help="first N test sentences")
    parser.add_argument("--latency-sentences", type=int, default=50)
    parser.add_argument("--max-output-length", type=int, default=128)
    args = parser.parse_args(argv)

    import tensorflow as tf

    from keras_transformer.export import (
        DecodingConfig, Translator, evaluate_translations, export_translator, load_run,
    )
    from keras_transformer.export.run import data_spec, read_split

    try:
        model, source_tokenizer, target_tokenizer, run_config = load_run(args.run,
                                                                         args.checkpoint)
        sources, references, description, target_lang = read_split(
            data_spec(run_config), args.split, local_dir=args.data_dir,
            tfds_dir=args.tfds_dir, limit=args.limit)
    except (OSError, ValueError) as error:
        raise SystemExit(str(error)) from None
    print(f"{len(sources)} sentences of {description}", flush=True)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, settings in VARIANTS:
            config = DecodingConfig.for_export(max_output_length=args.max_output_length,
                                               **settings)
            path = export_translator(
                Translator(model, source_tokenizer, target_tokenizer, config),
                os.path.join(tmp, settings["search"] + str(settings.get("beam_size", ""))),
            )
            translate = tf.saved_model.load(str(path)).signatures["translate"]
            translate(text=tf.constant(sources[:2]))  # first call: graph warm-up
            started = time.perf_counter()
            hypotheses = []
            for start in range(0, len(sources), args.batch_size):
                batch = tf.constant(sources[start:start + args.batch_size])
                hypotheses += [t.decode() for t in translate(text=batch)["translation"].numpy()]
            seconds = time.perf_counter() - started
            latencies = []
            for sentence in sources[: args.latency_sentences]:
                one = time.perf_counter()
                translate(text=tf.constant([sentence]))
                latencies.append(time.perf_counter() - one)
            bleu = evaluate_translations(hypotheses, references, target_lang)["bleu"]
            rows.append((name, len(sources) / seconds, 1000 * statistics.median(latencies), bleu))
            print(f"{name}: {rows[-1][1]:.1f} sent/s, {rows[-1][2]:.0f} ms/sentence, "
                  f"BLEU {bleu:.2f}", flush=True)

    baseline = rows[0][1]
    print(f"\n| decoding | sentences/s (batch {args.batch_size}) | speed-up vs uncached greedy "
          f"| median latency, batch 1 (ms) | BLEU ({description}) |")
    print("|---|---|---|---|---|")
    for name, rate, latency, bleu in rows:
        print(f"| {name} | {rate:.1f} | {rate / baseline:.1f}x | {latency:.0f} | {bleu:.2f} |")


if __name__ == "__main__":
    main()

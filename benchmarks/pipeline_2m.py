"""Input pipeline at scale: a synthetic corpus of 2,000,000 pairs, streamed.

Writes `train.en.gz`/`train.de.gz` of `--pairs` pairs (Multi30K training pairs recombined:
each synthetic pair is one Multi30K pair or two joined, drawn at random), then measures,
in this one process and with no model attached:

1. the line-count check of both files (streaming);
2. vocabulary training: the reservoir sample of `--sample-pairs` pairs (one pass over the
   corpus) plus SentencePiece training on it;
3. the data report's counting pass (pairs read/kept/dropped, exact batches per epoch);
4. the training input pipeline (`make_translation_dataset` as the trainer builds it for a
   corpus this size: streamed from the files, parallel tokenization, shuffle buffer,
   length buckets, no cache) over one full epoch or `--max-batches`: real (non-padding)
   encoder + label tokens per second, the unit of `training_tokens_per_second`;
5. peak resident memory of the process (`resource.getrusage`).

Check it runs with a small corpus (the full 2M-pair run is meant for a quiet machine):

    .venv/bin/python benchmarks/pipeline_2m.py --pairs 20000 --vocab-size 2000
    .venv/bin/python benchmarks/pipeline_2m.py            # 2,000,000 pairs
"""

import argparse
import gzip
import os
import pathlib
import random
import resource
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

# Pairs of the synthetic corpus (the target size).
DEFAULT_PAIRS = 2_000_000
# Probability that a synthetic pair joins two Multi30K pairs (longer sentences).
JOIN_PROBABILITY = 0.3


def multi30k_pairs():
    """The Multi30K En-De training pairs, or a toy word corpus when no copy is found."""
    from keras_transformer.data import find_local_multi30k

    directory = find_local_multi30k()
    if directory is None:
        print("No local Multi30K: recombining a toy word corpus instead.", flush=True)
        rng = random.Random(0)
        words = [f"w{i}" for i in range(3000)]
        return [(" ".join(rng.choices(words, k=12)), " ".join(rng.choices(words, k=13)))
                for _ in range(29000)]
    with gzip.open(directory / "train.en.gz", "rt", encoding="utf-8") as en, \
            gzip.open(directory / "train.de.gz", "rt", encoding="utf-8") as de:
        return [(e.rstrip("\n"), d.rstrip("\n")) for e, d in zip(en, de)]


def write_corpus(directory, pairs, count, seed=0):
    """Writes `count` recombined pairs to `train.{en,de}.gz`; returns the two paths."""
    rng = random.Random(seed)
    paths = directory / "train.en.gz", directory / "train.de.gz"
    # compresslevel 1: writing is setup, not what is measured.
    with gzip.open(paths[0], "wt", encoding="utf-8", compresslevel=1) as en, \
            gzip.open(paths[1], "wt", encoding="utf-8", compresslevel=1) as de:
        for _ in range(count):
            source, target = rng.choice(pairs)
            if rng.random() < JOIN_PROBABILITY:
                extra = rng.choice(pairs)
                source, target = f"{source} {extra[0]}", f"{target} {extra[1]}"
            en.write(source + "\n")
            de.write(target + "\n")
    return paths


def peak_rss_mib():
    """Peak resident set size of this process in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=DEFAULT_PAIRS)
    parser.add_argument("--preset", default="multi30k", help="batching and max_length of it")
    parser.add_argument("--vocab-size", type=int, help="default: the preset's")
    parser.add_argument("--sample-pairs", type=int, help="vocabulary sample (default: the "
                        "preset's tokenizer_sample_pairs)")
    parser.add_argument("--max-batches", type=int, help="stop the throughput pass early")
    parser.add_argument("--workdir", help="where the corpus is written (default: a temp dir)")
    args = parser.parse_args()

    import numpy as np

    from keras_transformer.data import make_translation_dataset, open_source
    from keras_transformer.data.preparation import CACHE_MAX_PAIRS, prepare_data_report
    from keras_transformer.training import get_preset
    from keras_transformer.training.trainer import prepare_tokenizers

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        tmp = pathlib.Path(tmp)
        started = time.time()
        source_path, target_path = write_corpus(tmp, multi30k_pairs(), args.pairs)
        print(f"Wrote {args.pairs:,} pairs ({(source_path.stat().st_size + target_path.stat().st_size) / 2**20:.0f} MiB gz) "
              f"in {time.time() - started:.0f}s", flush=True)
        overrides = {k: v for k, v in (("vocab_size", args.vocab_size),
                                       ("tokenizer_sample_pairs", args.sample_pairs)) if v}
        config = get_preset(args.preset).replace(
            data="files", data_files={"train": [str(source_path), str(target_path)]},
            source_lang="en", target_lang="de", train_subset=None, **overrides)
        source = open_source("files", config.data_files, "en", "de")

        started = time.time()
        source.check(["train"])
        check_seconds = time.time() - started

        started = time.time()
        tokenizer, _ = prepare_tokenizers(config, source.pairs("train"), tmp / "run")
        vocab_seconds = time.time() - started
        vocab_rss = peak_rss_mib()

        started = time.time()
        report = prepare_data_report(source, config, tokenizer, tokenizer, tmp / "run",
                                     splits=("train",))
        count_seconds = time.time() - started
        count_rss = peak_rss_mib()
        print(report, flush=True)

        dataset = make_translation_dataset(
            source.dataset("train"), tokenizer, tokenizer, "en", "de",
            max_length=config.max_length, batch_size=config.batch_size or 64,
            tokens_per_batch=config.tokens_per_batch, seed=config.seed, drop_long=True,
            cache=report.kept("train") <= CACHE_MAX_PAIRS,
            num_batches=report.batches["train"])
        if args.max_batches:
            dataset = dataset.take(args.max_batches)
        tokens = batches = 0
        started = time.time()
        for inputs, labels in dataset:
            tokens += int(np.count_nonzero(labels.numpy())) + int(
                np.count_nonzero(inputs["encoder_tokens"].numpy()))
            batches += 1
        pipeline_seconds = time.time() - started

    print(f"pairs: {args.pairs:,}; line-count check {check_seconds:.1f}s")
    print(f"vocabulary ({config.vocab_size} pieces, sample of "
          f"{min(config.tokenizer_sample_pairs, report.kept('train')):,} pairs): "
          f"{vocab_seconds:.1f}s incl. the sampling pass")
    print(f"data report counting pass: {count_seconds:.1f}s")
    print(f"input pipeline: {batches:,} batches, {tokens:,} real tokens in "
          f"{pipeline_seconds:.1f}s = {tokens / pipeline_seconds:,.0f} real tokens/s")
    print(f"peak RSS: {peak_rss_mib():,.0f} MiB (after the vocabulary {vocab_rss:,.0f} MiB, "
          f"after the counting pass {count_rss:,.0f} MiB)")


if __name__ == "__main__":
    main()

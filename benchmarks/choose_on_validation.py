"""Choose a run's checkpoint and beam length penalty on the validation set alone.

    .venv/bin/python benchmarks/choose_on_validation.py runs/multi30k \
        --checkpoints best,averaged --alphas 0.6,1.0 --beam-size 4

For every checkpoint (`best`, `averaged`, `last`, `final`: see `keras-transformer export
--checkpoint`) and every length penalty alpha, translates the run's whole validation split
with the in-graph `Translator` (beam search, the same code the export runs) and prints cased
detokenized sacreBLEU, then the best setting. The test sets are never read: report test
BLEU once, for the setting chosen here (`keras-transformer export --checkpoint C --alpha A`
then `keras-transformer evaluate --split test`).
"""

import argparse
import itertools
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--checkpoints", default="best,averaged",
                        help="comma-separated checkpoints to compare")
    parser.add_argument("--alphas", default="0.6,1.0", help="comma-separated length penalties")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--limit", type=int, help="only the first N validation sentences")
    return parser.parse_args(argv)


def _validation_pairs(config, limit):
    from keras_transformer.data.sources import open_source

    source = open_source(config.get("data", "multi30k"), config.get("data_files"),
                         config.get("source_lang"), config.get("target_lang"))
    if "validation" not in source.splits():
        raise SystemExit(f"The run's data source has no validation split: {source.splits()}")
    pairs = list(itertools.islice(source.pairs("validation"), limit or None))
    return [s for s, _ in pairs], [t for _, t in pairs]


def main(argv=None):
    args = _parse_args(argv)
    import sacrebleu

    from keras_transformer.export import DecodingConfig, Translator, translate_by_length
    from keras_transformer.export.run import load_run

    rows = []
    sources = references = None
    for checkpoint in args.checkpoints.split(","):
        model, source_tokenizer, target_tokenizer, config = load_run(args.run_dir, checkpoint)
        if sources is None:
            sources, references = _validation_pairs(config, args.limit)
        for alpha in (float(a) for a in args.alphas.split(",")):
            translator = Translator(model, source_tokenizer, target_tokenizer, DecodingConfig(
                search="beam" if args.beam_size > 1 else "greedy", beam_size=args.beam_size,
                alpha=alpha))
            started = time.time()
            hypotheses = translate_by_length(sources, args.batch_size, translator)
            bleu = sacrebleu.corpus_bleu(hypotheses, [references]).score
            rows.append((checkpoint, alpha, bleu, time.time() - started))
            print(f"{checkpoint} alpha {alpha}: validation BLEU {bleu:.2f} "
                  f"({len(sources)} sentences, {rows[-1][3]:.0f}s)", flush=True)
    print(f"\n| checkpoint | beam | alpha | validation BLEU ({len(sources)} sentences) |")
    print("|---|---|---|---|")
    for checkpoint, alpha, bleu, _ in rows:
        print(f"| {checkpoint} | {args.beam_size} | {alpha} | {bleu:.2f} |")
    checkpoint, alpha, bleu, _ = max(rows, key=lambda row: row[2])
    print(f"\nchosen on validation: --checkpoint {checkpoint} --alpha {alpha} ({bleu:.2f})")


if __name__ == "__main__":
    main()

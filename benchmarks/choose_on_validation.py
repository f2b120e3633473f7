"""Choose a run's checkpoint and beam length penalty on the validation set alone.

    .venv/bin/python benchmarks/choose_on_validation.py runs/multi30k \
        --checkpoints best,averaged --alphas 0.6,1.0,1.4 --beam-size 4

For every checkpoint (`best`, `averaged`, `last`, `final`: see `keras-transformer export
--checkpoint`; `averaged-K`: the mean of the run's last K epoch checkpoints, computed here
without touching the run's own `averaged.keras`) and every length penalty alpha, translates
the run's whole validation split with the in-graph `Translator` (beam search, the same code
the export runs) and prints cased detokenized sacreBLEU, then the best setting. The test sets
are never read: report test BLEU once, for the setting chosen here (`keras-transformer
export --checkpoint C --alpha A` then `keras-transformer evaluate --split test`). How many
epochs to average is worth choosing here too: a time budget trains a different number of
epochs on a faster or slower machine, and averaging in the early epochs of a short run can
cost BLEU (one 9-epoch run: 36.11 validation BLEU for the last 3, 35.90 for the last 5).
`--checkpoints best,averaged-3,averaged-5` compares them; `keras-transformer average --last
K` then writes the chosen one. Every checkpoint is checked before the first translation (a
missing one, an average older than the run's epochs, too few epochs kept for `averaged-K`).
`--beam-size 1` scores greedy search, once per checkpoint. BLEU is tokenized for the run's
target language, as `evaluate` does (`zh`, `ja-mecab`, `char` or `13a`:
`keras_transformer.languages.bleu_tokenizer`).
"""

import argparse
import itertools
import os
import pathlib
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--checkpoints", default="best,last",
                        help="comma-separated checkpoints to compare (averaged-K: the mean "
                        "of the last K epochs)")
    parser.add_argument("--alphas", default="0.6,1.0,1.4",
                        help="comma-separated length penalties")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--beam-stopping", default="early",
                        help="comma-separated beam stopping rules: exact (stop when no alive "
                        "hypothesis can win) and/or early (stop once beam-size hypotheses "
                        "have finished): export --beam-stopping RULE")
    parser.add_argument("--length-penalty-forms", default="gnmt",
                        help="comma-separated length penalty forms: gnmt (the default) and/or "
                        "power (CTranslate2's): export --length-penalty-form FORM")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--limit", type=int, help="only the first N validation sentences")
    parser.add_argument("--data-dir", help="raw Multi30K directory (as for `keras-transformer "
                        "evaluate`)")
    parser.add_argument("--tfds-dir", help="TFDS data directory of a tfds:NAME run")
    return parser.parse_args(argv)


def _validation_pairs(config, limit, data_dir=None, tfds_dir=None):
    """`(sources, references, description, target_lang)` of the run's validation split, as
    `keras-transformer evaluate --split validation` reads it."""
    from keras_transformer.export.run import data_spec, read_split

    try:
        return read_split(data_spec(config), "validation", local_dir=data_dir,
                          tfds_dir=tfds_dir, limit=limit)
    except (OSError, ValueError) as error:
        raise SystemExit(f"The run's validation split cannot be read: {error}") from None


def main(argv=None):
    args = _parse_args(argv)
    from keras_transformer import export
    from keras_transformer.decoding import LENGTH_PENALTY_FORMS
    from keras_transformer.export import DecodingConfig, Translator, evaluate_translations
    from keras_transformer.export.translator import BEAM_STOPPING

    rules = args.beam_stopping.split(",")
    unknown = sorted(set(rules) - set(BEAM_STOPPING))
    if unknown:
        raise SystemExit(f"--beam-stopping takes exact and/or early, got {unknown}.")
    forms = args.length_penalty_forms.split(",")
    unknown = sorted(set(forms) - set(LENGTH_PENALTY_FORMS))
    if unknown:
        raise SystemExit(f"--length-penalty-forms takes gnmt and/or power, got {unknown}.")
    checkpoints = args.checkpoints.split(",")
    for checkpoint in checkpoints:  # all of them before the first translation
        _check(args.run_dir, checkpoint)
    greedy = args.beam_size <= 1
    settings = ([("gnmt", None, "early")] if greedy else list(itertools.product(
        forms, (float(a) for a in args.alphas.split(",")), rules)))
    rows = []
    sources = references = None
    for checkpoint in checkpoints:
        model, source_tokenizer, target_tokenizer, config = _load(args.run_dir, checkpoint)
        if sources is None:
            sources, references, description, target_lang = _validation_pairs(
                config, args.limit, args.data_dir, args.tfds_dir)
            print(f"{len(sources)} sentences of {description}", flush=True)
        for form, alpha, rule in settings:
            search = (dict(search="greedy") if greedy else
                      dict(search="beam", beam_size=args.beam_size, alpha=alpha,
                           early_stopping=rule == "early", length_penalty_form=form))
            translator = Translator(model, source_tokenizer, target_tokenizer,
                                    DecodingConfig(**search))
            started = time.time()
            hypotheses = export.translate_by_length(sources, args.batch_size, translator)
            bleu = evaluate_translations(hypotheses, references, target_lang)["bleu"]
            rows.append((checkpoint, form, alpha, rule, bleu, time.time() - started))
            what = "greedy" if greedy else f"{form} alpha {alpha} {rule} stopping"
            print(f"{checkpoint} {what}: validation BLEU {bleu:.2f} ({len(sources)} "
                  f"sentences, {rows[-1][5]:.0f}s)", flush=True)
    if greedy:
        print(f"\n| checkpoint | search | validation BLEU ({len(sources)} sentences) | "
              "seconds |")
        print("|---|---|---|---|")
    else:
        print(f"\n| checkpoint | beam | penalty | alpha | stopping | validation BLEU "
              f"({len(sources)} sentences) | seconds |")
        print("|---|---|---|---|---|---|---|")
    for checkpoint, form, alpha, rule, bleu, seconds in rows:
        if greedy:
            print(f"| {checkpoint} | greedy | {bleu:.2f} | {seconds:.0f} |")
        else:
            print(f"| {checkpoint} | {args.beam_size} | {form} | {alpha} | {rule} | "
                  f"{bleu:.2f} | {seconds:.0f} |")
    checkpoint, form, alpha, rule, bleu, _ = max(rows, key=lambda row: row[4])
    if greedy:
        flags = "--search greedy"
    else:
        flags = f"--alpha {alpha} --beam-stopping {rule}"
        if args.beam_size != 4:
            flags += f" --beam-size {args.beam_size}"
        if form != "gnmt":
            flags += f" --length-penalty-form {form}"
    name, _, last = checkpoint.partition("-")
    if last:
        print(f"\nchosen on validation: --checkpoint {name} {flags} ({bleu:.2f}), "
              f"after `keras-transformer average --model {args.run_dir} --last {last}`")
    else:
        print(f"\nchosen on validation: --checkpoint {checkpoint} {flags} ({bleu:.2f})")


def _check(run_dir, checkpoint):
    """Refuses, in one line, a checkpoint `_load` would not load (SystemExit)."""
    from keras_transformer.export.run import model_path
    from keras_transformer.training.averaging import averaging_base
    from keras_transformer.training.callbacks import epoch_checkpoints

    name, _, last = checkpoint.partition("-")
    try:
        if name != "averaged" or not last:
            model_path(run_dir, checkpoint)
            return
        count = int(last) if last.isdigit() else 0
        if count < 1:
            raise SystemExit(f"averaged-K needs a positive integer K, got {checkpoint!r}.")
        found = epoch_checkpoints(pathlib.Path(run_dir) / "checkpoints")
        if len(found) < count:
            raise SystemExit(f"{checkpoint}: the run kept {len(found)} epoch checkpoint(s) "
                             f"(train with --set keep_checkpoints=N for more).")
        averaging_base(run_dir)
    except (OSError, ValueError) as error:
        raise SystemExit(f"{checkpoint}: {error}") from None


def _load(run_dir, checkpoint):
    """`load_run`, plus "averaged-K": the final model (or the last epoch's) with the mean of
    the last K epochs (`_check`ed first)."""
    from keras_transformer.export.run import load_run

    _check(run_dir, checkpoint)
    name, _, last = checkpoint.partition("-")
    if name != "averaged" or not last:
        return load_run(run_dir, checkpoint)
    from keras_transformer.training.averaging import average_checkpoints, averaging_base
    from keras_transformer.training.callbacks import epoch_checkpoints

    used = epoch_checkpoints(pathlib.Path(run_dir) / "checkpoints")[-int(last):]
    print(f"{checkpoint}: {', '.join(pathlib.Path(p).name for p in used)}", flush=True)
    model, source_tokenizer, target_tokenizer, config = load_run(
        run_dir, "final" if averaging_base(run_dir).name == "model.keras" else "last")
    model.set_weights(average_checkpoints(used))
    return model, source_tokenizer, target_tokenizer, config


if __name__ == "__main__":
    main()

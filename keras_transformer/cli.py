"""Command line: `keras-transformer train | export | translate | evaluate`.

Also `python -m keras_transformer ...`. Each subcommand prints `--help`.
"""

import argparse
import json
import os
import pathlib
import shutil
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

PRECISIONS = {"none": None, "float32": None, "bf16": "mixed_bfloat16",
              "mixed_bfloat16": "mixed_bfloat16", "fp16": "mixed_float16",
              "mixed_float16": "mixed_float16"}


def _parse_overrides(pairs):
    """`["epochs=2", "d_model=64"]` -> `{"epochs": 2, "d_model": 64}` (values read as JSON)."""
    overrides = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise SystemExit(f"--set expects KEY=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides


def _make_translate_fn(search, beam_size, alpha, max_output_length):
    """A factory for the trainer's validation BLEU: translates with the in-graph Translator."""

    def make(model, source_tokenizer, target_tokenizer):
        from keras_transformer.export import DecodingConfig, Translator

        translator = Translator(
            model, source_tokenizer, target_tokenizer,
            DecodingConfig(search=search, beam_size=beam_size, alpha=alpha,
                           max_output_length=max_output_length),
        )
        return translator

    return make


def _split_files(paths, flag):
    """`[SRC, TGT]` -> two absolute paths (parallel files); `[TSV]` -> one (TSV)."""
    if len(paths) not in (1, 2):
        raise SystemExit(f"{flag} takes SRC TGT (parallel files) or one TSV file, got {paths}.")
    return [str(pathlib.Path(p).resolve()) for p in paths]


def _data_overrides(args):
    """Config overrides of train's data flags: `data`, `data_files`, languages."""
    overrides = {}
    if args.source_lang:
        overrides["source_lang"] = args.source_lang
    if args.target_lang:
        overrides["target_lang"] = args.target_lang
    data = args.data
    if args.train:
        files = {"train": _split_files(args.train, "--train")}
        if args.valid:
            files["validation"] = _split_files(args.valid, "--valid")
        for test in args.test or []:
            name, equals, paths = test.partition("=")
            if not equals or not name:
                raise SystemExit(f"--test expects NAME=SRC,TGT or NAME=TSV, got {test!r}.")
            files[name] = _split_files(paths.split(","), "--test")
        shapes = {len(paths) for paths in files.values()}
        if len(shapes) != 1:
            raise SystemExit("Give every split as SRC TGT files, or every split as one TSV.")
        data = data or ("files" if shapes == {2} else "tsv")
        if data not in ("files", "tsv"):
            raise SystemExit(f"--train/--valid/--test go with --data files or tsv, not {data}.")
        overrides["data_files"] = {k: v if data == "files" else v[0] for k, v in files.items()}
        if data == "files":  # languages from the file names (train.fr) unless given
            from keras_transformer.data.sources import language_from_path

            for key, path in (("source_lang", files["train"][0]),
                              ("target_lang", files["train"][1])):
                overrides.setdefault(key, language_from_path(path))
            if not (overrides["source_lang"] and overrides["target_lang"]):
                raise SystemExit("Could not tell the languages from the file names: pass "
                                 "--source-lang and --target-lang.")
        elif not (args.source_lang and args.target_lang):
            raise SystemExit("A TSV file does not say its languages: pass --source-lang and "
                             "--target-lang.")
    elif data in ("files", "tsv"):
        raise SystemExit(f"--data {data} needs --train (and --valid) files.")
    if data:
        overrides["data"] = data
        if data.startswith("tfds:"):  # languages from the dataset unless given
            overrides.setdefault("source_lang", None)
            overrides.setdefault("target_lang", None)
    return overrides


def _load_config(args):
    from keras_transformer.training import TrainingConfig, get_preset

    config = TrainingConfig.from_file(args.config) if args.config else get_preset(args.preset)
    overrides = _parse_overrides(args.set)
    overrides.update(_data_overrides(args))
    if args.epochs is not None:
        overrides["epochs"] = args.epochs
    if args.mixed_precision is not None:
        overrides["precision"] = PRECISIONS[args.mixed_precision]
    return config.replace(**overrides) if overrides else config


def cmd_train(args):
    config = _load_config(args)
    output = pathlib.Path(args.output)
    if output.exists() and args.overwrite:
        shutil.rmtree(output)
    elif (output / "model.keras").exists():
        raise SystemExit(f"{output} holds a finished run; pass --overwrite to train again.")
    elif (output / "backup").exists():
        print(f"Resuming the interrupted run in {output}", flush=True)
    from keras_transformer.training.trainer import train

    search = "beam" if config.beam_size > 1 else "greedy"
    run = train(
        config,
        output,
        data_dir=args.tfds_dir,
        local_dir=args.data_dir,
        strategy=args.strategy,
        make_translate_fn=_make_translate_fn(search, config.beam_size, config.length_penalty,
                                             config.max_length + 16),
    )
    print(f"Trained {config.epochs} epoch(s) in {run.train_seconds / 60:.1f} min; run directory "
          f"{output} (model.keras, checkpoints/, tokenizer/, logs/)", flush=True)


def cmd_export(args):
    from keras_transformer.export import DecodingConfig, Translator, export_translator, load_run

    model, source_tokenizer, target_tokenizer, config = load_run(args.model, args.checkpoint)
    decoding = DecodingConfig(
        search=args.search,
        beam_size=args.beam_size,
        alpha=args.alpha,
        max_input_length=args.max_input_length,
        extra_length=args.extra_length,
        max_output_length=args.max_output_length,
    )
    direction = _data_spec(config)
    translator = Translator(
        model, source_tokenizer, target_tokenizer, decoding,
        metadata={"source_lang": direction["source_lang"] or "",
                  "target_lang": direction["target_lang"] or "", "data": direction["data"]},
    )
    path = export_translator(
        translator, args.out, version=args.version,
        metadata={"run_dir": str(args.model), "checkpoint": args.checkpoint,
                  "training_config": config, **direction},
    )
    print(f"Exported {args.search} (beam {args.beam_size}) translator to {path}")


def _read_lines(path):
    from keras_transformer.export.inference import read_lines

    return read_lines(path)


def cmd_translate(args):
    from keras_transformer.export.inference import ExportedTranslator

    sentences = _read_lines(args.input)
    translator = ExportedTranslator(args.export, signature=args.signature)
    translations = translator(sentences, batch_size=args.batch_size)
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    try:
        for line in translations:
            out.write(line + "\n")
    finally:
        if args.output:
            out.close()


def _data_spec(record):
    """The data source and direction in a run's config or an export's metadata record.

    Exports from before the direction was recorded hold only the training config; their
    data is Multi30K in the config's languages.
    """
    config = record.get("training_config") or record
    return {key: record.get(key, config.get(key, default)) for key, default in (
        ("data", "multi30k"), ("data_files", None), ("source_lang", "en"),
        ("target_lang", "de"))}


def _evaluation_pairs(args, metadata):
    """`(sources, references, description)` that `evaluate` scores.

    `--src/--ref` files, or the split `--split` of the data source the export was trained
    on (any of its test sets, or `validation`), in the export's direction unless
    `--source-lang/--target-lang` say otherwise.
    """
    if args.src or args.ref:
        if not (args.src and args.ref):
            raise SystemExit("--src and --ref go together.")
        return _read_lines(args.src), _read_lines(args.ref), f"{args.src} -> {args.ref}"
    from keras_transformer.data import open_source

    spec = _data_spec(metadata)
    spec["source_lang"] = args.source_lang or spec["source_lang"]
    spec["target_lang"] = args.target_lang or spec["target_lang"]
    source = open_source(**spec, local_dir=args.data_dir, tfds_dir=args.tfds_dir)
    try:
        split = source.resolve(args.split)
    except ValueError as error:
        raise SystemExit(str(error)) from error
    pairs = list(source.pairs(split, keep_all=True))
    return ([s for s, _ in pairs], [t for _, t in pairs],
            f"{source.describe()} [{split}]")


def cmd_evaluate(args):
    from keras_transformer.export.inference import ExportedTranslator, evaluate_translations

    translator = ExportedTranslator(args.export, signature=args.signature)
    sources, references, description = _evaluation_pairs(args, translator.metadata)
    print(f"Evaluating on {description}", flush=True)
    if args.limit:
        sources, references = sources[: args.limit], references[: args.limit]
    started = time.time()
    results = translator.translate(sources, args.batch_size)
    seconds = time.time() - started
    hypotheses = [r["translation"] for r in results]
    scores = evaluate_translations(hypotheses, references)
    scores["sentences_per_second"] = len(sources) / seconds if seconds else float("inf")
    for source, hypothesis, reference in list(zip(sources, hypotheses, references))[: args.show]:
        print(f"SRC: {source}\nOUT: {hypothesis}\nREF: {reference}\n")
    print(f"{len(sources)} sentences in {seconds:.1f}s ({scores['sentences_per_second']:.1f}/s)")
    print(f"BLEU (cased, detokenized): {scores['bleu']:.2f}   {scores.get('bleu_signature', '')}")
    print(f"BLEU (lowercased):         {scores['bleu_lowercase']:.2f}")
    print(f"chrF:                      {scores['chrf']:.2f}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(scores, indent=2))


def build_parser():
    from keras_transformer.export.translator import SEARCHES

    parser = argparse.ArgumentParser(prog="keras-transformer", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser(
        "train", help="train with model.fit on Multi30K, your parallel files, a TSV file or a "
        "TFDS dataset", epilog="Data: --train SRC TGT --valid SRC TGT [--test NAME=SRC,TGT] "
        "(plain or .gz, one sentence a line; languages from the names: train.fr train.en), or "
        "--train TSV --valid TSV with --source-lang/--target-lang, or --data "
        "tfds:ted_hrlr_translate/pt_to_en, or Multi30K (default) with --source-lang/"
        "--target-lang among en, de, fr, cs.")
    train.add_argument("--preset", default="quick", help="tiny | quick | multi30k (default quick)")
    train.add_argument("--config", help="a JSON or YAML TrainingConfig file (overrides --preset)")
    train.add_argument("--set", nargs="*", metavar="KEY=VALUE", help="override config fields")
    train.add_argument("--epochs", type=int)
    train.add_argument("--output", required=True, help="run directory")
    train.add_argument("--overwrite", action="store_true", help="delete an existing run first")
    train.add_argument("--data", help="data source: multi30k (default) | files | tsv | "
                       "tfds:NAME (e.g. tfds:ted_hrlr_translate/pt_to_en); files/tsv are "
                       "implied by --train")
    train.add_argument("--train", nargs="+", metavar="FILE",
                       help="training data: SRC TGT parallel files or one TSV file (.gz ok)")
    train.add_argument("--valid", nargs="+", metavar="FILE",
                       help="validation data, as --train")
    train.add_argument("--test", action="append", metavar="NAME=SRC,TGT",
                       help="a named test set for `evaluate --split NAME` (NAME=TSV for TSV);"
                       " repeatable")
    train.add_argument("--source-lang", help="source language code (default: from the file "
                       "names, the TFDS dataset's supervised keys, or en for Multi30K)")
    train.add_argument("--target-lang", help="target language code (as --source-lang; "
                       "Multi30K default de)")
    train.add_argument("--data-dir", help="directory with the raw Multi30K files "
                       "(default: $KERAS_TRANSFORMER_MULTI30K_DIR or ../shared/data/multi30k)")
    train.add_argument("--tfds-dir", help="TFDS data_dir (for --data tfds:NAME)")
    train.add_argument("--mixed-precision", choices=sorted(PRECISIONS))
    train.add_argument("--strategy", default="auto",
                       choices=["auto", "default", "mirrored", "multi_worker"])
    train.set_defaults(func=cmd_train)

    export = sub.add_parser("export", help="write a versioned SavedModel for TF Serving")
    export.add_argument("--model", required=True, help="run directory from `train`")
    export.add_argument("--out", required=True, help="model base directory (gets <version>/)")
    export.add_argument("--version", type=int, help="default: the next free integer")
    export.add_argument("--checkpoint", default="best", choices=["best", "final", "last"])
    export.add_argument("--search", default="beam", choices=SEARCHES)
    export.add_argument("--beam-size", type=int, default=4)
    export.add_argument("--alpha", type=float, default=0.6)
    export.add_argument("--max-input-length", type=int, default=128)
    export.add_argument("--extra-length", type=int, default=50)
    export.add_argument("--max-output-length", type=int, default=128)
    export.set_defaults(func=cmd_export)

    translate = sub.add_parser(
        "translate", help="translate lines with an exported SavedModel (for a running TF "
        "Serving server use export/client.py)")
    translate.add_argument("--export", required=True, help="SavedModel version dir or base dir")
    translate.add_argument("--input", default="-", help="file of sentences (default stdin)")
    translate.add_argument("--output", help="file for translations (default stdout)")
    translate.add_argument("--signature", default="translate")
    translate.add_argument("--batch-size", type=int, default=64)
    translate.set_defaults(func=cmd_translate)

    evaluate = sub.add_parser("evaluate", help="BLEU and chrF of an export")
    evaluate.add_argument("--export", required=True)
    evaluate.add_argument("--split", default="test", help="a test set of the data source the "
                          "export was trained on (e.g. test_2017_flickr, a --test NAME), "
                          "validation, or test (its first test set)")
    evaluate.add_argument("--src", help="source file (with --ref instead of --split)")
    evaluate.add_argument("--ref", help="reference file")
    evaluate.add_argument("--source-lang", help="default: the export's source language")
    evaluate.add_argument("--target-lang", help="default: the export's target language")
    evaluate.add_argument("--data-dir", help="directory with the raw Multi30K files")
    evaluate.add_argument("--tfds-dir", help="TFDS data_dir of a tfds:NAME source")
    evaluate.add_argument("--signature", default="translate")
    evaluate.add_argument("--batch-size", type=int, default=64)
    evaluate.add_argument("--limit", type=int, help="only the first N sentences")
    evaluate.add_argument("--show", type=int, default=0, help="print N examples")
    evaluate.add_argument("--json", help="write the scores to this file")
    evaluate.set_defaults(func=cmd_evaluate)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    args.func(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Command line: `keras-transformer train | export | export-ctranslate2 | translate | evaluate |
average | launch`.

Also `python -m keras_transformer ...`. Each subcommand prints `--help`.
"""

import argparse
import contextlib
import json
import math
import os
import pathlib
import re
import shlex
import signal
import shutil
import stat
import sys
import time

# TensorFlow's start-up lines are hidden before TensorFlow is imported, by the package's
# __init__ (keras_transformer/cli_startup.py); `--verbose` shows them.

DEFAULT_PRESET = "quick"  # `train` without --preset, --config or an existing run
PRECISIONS = {"none": None, "float32": None, "bf16": "mixed_bfloat16",
              "mixed_bfloat16": "mixed_bfloat16", "fp16": "mixed_float16",
              "mixed_float16": "mixed_float16", "auto": "auto"}


def _integer_at_least(minimum):
    """An argparse type: an integer >= `minimum`."""

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


_count = _integer_at_least(1)  # a batch size, a number of sentences or workers
_count_or_zero = _integer_at_least(0)  # a number of examples to show


def _minutes(text):
    """argparse type: a number of minutes >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < 1e6:  # NaN and infinity too
        raise argparse.ArgumentTypeError(f"must be a number of minutes in [0, 1e6), got {text}")
    return value


def _parse_overrides(pairs):
    """`["epochs=2", "d_model=64"]` -> `{"epochs": 2, "d_model": 64}` (values read as JSON)."""
    from keras_transformer.training.presets import parse_overrides

    try:
        return parse_overrides(pairs)
    except ValueError as error:
        raise SystemExit(str(error)) from None


def _split_files(paths, flag):
    """`[SRC, TGT]` -> two absolute paths (parallel files); `[TSV]` -> one (TSV)."""
    if len(paths) not in (1, 2):
        raise SystemExit(f"{flag} takes SRC TGT (parallel files) or one TSV file, got {paths}.")
    from keras_transformer.textfiles import absolute_path

    resolved = [absolute_path(p) for p in paths]
    if len(resolved) == 2 and resolved[0] == resolved[1]:
        raise SystemExit(f"{flag} names {paths[0]} for both sides: give the source file, then "
                         "its translation.")
    return resolved


def _data_overrides(args, set_languages=(None, None), config_languages=(None, None)):
    """Config overrides of train's data flags: `data`, `data_files`, languages.

    The languages of `--source-lang/--target-lang`, else of `--set` (`set_languages`), are
    the run's; then the file names' (`train.fr`); the configuration's (`--config`, a run's
    own `config.json`: `config_languages`) only fill in what neither gives (a TSV file), so
    that a config reused for other files does not relabel them. Every split's files must not
    be named the other way round.
    """
    overrides = {}
    if args.source_lang:
        overrides["source_lang"] = args.source_lang
    if args.target_lang:
        overrides["target_lang"] = args.target_lang
    source_lang = args.source_lang or set_languages[0]
    target_lang = args.target_lang or set_languages[1]
    data = args.data
    if args.train:
        files = {"train": _split_files(args.train, "--train")}
        if args.valid:
            files["validation"] = _split_files(args.valid, "--valid")
        from keras_transformer.data.sources import VALIDATION_NAMES, check_file_directions

        for words in args.test or []:
            if len(words) != 1:  # `--test NAME=SRC TGT`, as --train takes its files
                if sum("=" in word for word in words) > 1:
                    raise SystemExit(
                        f"--test takes one test set: give each its own --test (--test "
                        f"{' --test '.join(words)}).")
                raise SystemExit(
                    f"--test takes one value, its files joined by a comma: --test "
                    f"{','.join(words)} (got {len(words)} words: {' '.join(words)}).")
            test = words[0]
            name, equals, paths = test.partition("=")
            if not equals or not name:
                raise SystemExit(f"--test expects NAME=SRC,TGT or NAME=TSV, got {test!r}.")
            if name == "train" or name in VALIDATION_NAMES:
                raise SystemExit(f"--test {name}=... would replace the {name} split: "
                                 f"'{name}' is reserved (--train, --valid); name the test set "
                                 "otherwise (--test news=SRC,TGT).")
            if name in files:
                raise SystemExit(f"--test names the test set '{name}' twice.")
            files[name] = _split_files(paths.split(","), "--test")
        shapes = {len(paths) for paths in files.values()}
        if len(shapes) != 1:
            raise SystemExit("Give every split as SRC TGT files, or every split as one TSV.")
        data = data or ("files" if shapes == {2} else "tsv")
        if data not in ("files", "tsv"):
            raise SystemExit(f"--train/--valid/--test go with --data files or tsv, not {data}.")
        if shapes != {2 if data == "files" else 1}:
            raise SystemExit(
                "--data files takes SRC TGT files for every split (--train SRC TGT, --test "
                "NAME=SRC,TGT)" if data == "files" else
                "--data tsv takes one file for every split (--train TSV, --test NAME=TSV)")
        overrides["data_files"] = {k: v if data == "files" else v[0] for k, v in files.items()}
        if data == "files":  # languages from the file names (train.fr) unless given
            from keras_transformer.languages import languages_from_paths

            try:
                named = ([None, None] if source_lang and target_lang
                         else languages_from_paths(*files["train"]))
                check_file_directions({"train": files["train"]}, source_lang, target_lang)
                source_lang = source_lang or named[0] or config_languages[0]
                target_lang = target_lang or named[1] or config_languages[1]
                if not (source_lang and target_lang):
                    raise SystemExit("Could not tell the languages from the file names: pass "
                                     "--source-lang and --target-lang.")
                check_file_directions(files, source_lang, target_lang)
            except ValueError as error:
                raise SystemExit(str(error)) from None
            overrides.update(source_lang=source_lang, target_lang=target_lang)
        else:
            source_lang = source_lang or config_languages[0]
            target_lang = target_lang or config_languages[1]
            if not (source_lang and target_lang):
                raise SystemExit("A TSV file does not say its languages: pass --source-lang "
                                 "and --target-lang.")
            overrides.update(source_lang=source_lang, target_lang=target_lang)
    elif args.valid or args.test:
        raise SystemExit(
            "--valid and --test go with --train (a run's data files are fixed when it starts); "
            "to score a trained model on other sentences: keras-transformer evaluate --export "
            "DIR --src SRC --ref REF.")
    elif data in ("files", "tsv"):
        raise SystemExit(f"--data {data} needs --train (and --valid) files.")
    if data:
        overrides["data"] = data
        if data.startswith("tfds:"):  # languages from the dataset unless given
            overrides.setdefault("source_lang", source_lang)  # flags' or --set's, else None
            overrides.setdefault("target_lang", target_lang)
    return overrides


def _own_config_path(args):
    """The run's `config.json` when `train` was given neither `--preset` nor `--config`:
    the run continues, or with `--overwrite` starts over, with its own recipe.

    Several workers never get here (`_load_config` refuses them without either first):
    their machines may not share the run directory, and a worker without the file would
    otherwise build another model than the chief.
    """
    path = pathlib.Path(args.output) / "config.json"
    return path if path.is_file() else None


def _load_config(args):
    from keras_transformer.training import TrainingConfig, get_preset

    if not (args.config or args.preset):
        from keras_transformer.training.strategy import num_workers_from_tf_config

        if num_workers_from_tf_config() > 1:
            # Each worker builds its model from what it is given; the run's config.json is
            # not read on a cluster (a worker's disk may not hold it).
            raise ValueError(
                "several workers (TF_CONFIG) need --preset or --config, the same on every "
                "worker: without either a new run would train the default preset "
                f"{DEFAULT_PRESET!r}. To continue a run, give every worker the run's own "
                f"configuration: --config {pathlib.Path(args.output) / 'config.json'}.")
    own_config = None if args.config or args.preset else _own_config_path(args)
    if args.config:
        config = TrainingConfig.from_file(args.config)
    elif args.preset:
        config = get_preset(args.preset)
    elif own_config is not None:
        try:
            config = TrainingConfig.from_file(own_config)
        except (OSError, ValueError) as error:
            raise SystemExit(
                f"{own_config}, the run's own configuration, cannot be read ({error}): pass "
                "--preset or --config to train another.") from None
        if args.overwrite:
            print(f"Starting {args.output} over with its own configuration ({own_config}); "
                  "--preset or --config trains another", flush=True)
        else:
            print(f"Continuing {args.output} with its own configuration ({own_config})",
                  flush=True)
    else:
        config = get_preset(DEFAULT_PRESET)
        if pathlib.Path(args.output).is_dir():
            # A directory there but no recipe (one made by hand, or an --overwrite that
            # could not write the new config.json): say what trains.
            print(f"No --preset or --config, and {args.output} holds no config.json: training "
                  f"the default preset {DEFAULT_PRESET!r}", flush=True)
    overrides = _parse_overrides(args.set)
    keys = ("source_lang", "target_lang")
    overrides.update(_data_overrides(
        args, set_languages=[overrides.get(key) for key in keys],
        config_languages=[getattr(config, key) for key in keys]))
    if overrides.get("data", config.data) != config.data and "data_files" not in overrides:
        overrides["data_files"] = None  # the configuration's files belong to its own source
    if args.epochs is not None:
        overrides["epochs"] = args.epochs
    if args.mixed_precision is not None:
        overrides["precision"] = PRECISIONS[args.mixed_precision]
    return config.replace(**overrides) if overrides else config


def _set_worker_tf_config(args):
    """`--worker-index i --workers h:p,...` -> `TF_CONFIG` (before TensorFlow starts)."""
    if (args.worker_index is None) != (args.workers is None):
        raise SystemExit("--worker-index and --workers go together.")
    if args.workers is None:
        return None
    from keras_transformer.training.strategy import make_tf_config

    workers = args.workers.split(",")
    if not 0 <= args.worker_index < len(workers):
        positions = " or ".join(map(str, range(len(workers)))) if len(workers) <= 2 else (
            f"0 to {len(workers) - 1}")
        raise SystemExit(f"--worker-index {args.worker_index} is outside the {len(workers)} "
                         f"addresses of --workers: give this machine's position in that "
                         f"list, counted from 0 ({positions}).")
    try:
        os.environ["TF_CONFIG"] = make_tf_config(workers, args.worker_index)
    except ValueError as error:
        raise SystemExit(str(error))
    return args.worker_index


def _overwrite(output, worker_index, config=None):
    """Deletes a previous run for `--overwrite`, refusing anything that is not a run.

    The chief (`worker_index` None) deletes the run directory's contents but the other
    workers' private directories, which each worker deletes itself (`worker_index`, its task
    id): workers start at the same time, and the chief must not delete what another has
    begun to write. With `config` (the `TrainingConfig` about to train), the chief replaces
    the old `config.json` with it instead of deleting it: an interruption before training
    writes it leaves a start that the same command, or `--overwrite` alone, runs again with
    that recipe.
    """
    from keras_transformer.textfiles import is_partial
    from keras_transformer.training.strategy import WORKER_TEMP_PREFIX
    from keras_transformer.training.trainer import is_run_directory

    if worker_index is not None:
        # Its contents: the directory itself is what this worker holds (`hold_run_directory`).
        own = output / f"{WORKER_TEMP_PREFIX}{worker_index}"
        for entry in own.iterdir() if own.is_dir() else []:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        return
    if not output.exists():
        return
    # A partial file of an atomic write alone: a new run killed in its first config.json.
    # Other workers' directories alone: a first start of a cluster that failed or was
    # interrupted before the chief wrote anything.
    if not output.is_dir() or (any(not is_partial(entry.name)
                                   and not entry.name.startswith(WORKER_TEMP_PREFIX)
                                   for entry in output.iterdir())
                               and not is_run_directory(output)):
        raise SystemExit(
            f"Refusing to delete {output}: it is not a run directory (no config.json and "
            "checkpoints from `keras-transformer train`). Choose another --output."
        )
    exports = sorted(str(model.parent.relative_to(output))
                     for pattern in ("*/saved_model.pb", "*/*/saved_model.pb")
                     for model in output.glob(pattern)
                     if not model.relative_to(output).parts[0].startswith(WORKER_TEMP_PREFIX))
    if exports:  # the README exports into the run: a server may be pointed there
        print(f"--overwrite deletes the previous run in {output} with the SavedModel "
              f"export(s) made into it: {', '.join(exports)}.", flush=True)
    # What marks the directory as a run last, config.json at the very end: an --overwrite
    # interrupted (Ctrl-C, an OSError) is one that --overwrite can run again.
    try:
        _delete_run(output, config)
    except KeyboardInterrupt:
        raise _OverwriteInterrupted from None


class _OverwriteInterrupted(KeyboardInterrupt):
    """Ctrl-C while `--overwrite` deleted a run: what is left is to start over, not to
    resume (its backup may have outlived its checkpoints)."""


def _delete_run(output, config):
    from keras_transformer.data.readers import write_json_atomically
    from keras_transformer.training.strategy import WORKER_TEMP_PREFIX
    from keras_transformer.training.trainer import RUN_MARKERS

    for entry in sorted(output.iterdir(), key=lambda entry: (
            entry.name == "config.json", entry.name in RUN_MARKERS)):
        if entry.name.startswith(WORKER_TEMP_PREFIX):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        elif entry.name == "config.json" and config is not None:
            # In one step, as `train` writes it: the directory is never without a recipe.
            try:
                write_json_atomically(entry, config.to_dict(), indent=2)
            except OSError:  # a full disk: not the old recipe alone, to be started over
                entry.unlink(missing_ok=True)
                raise
        else:
            entry.unlink()


def _overwrite_and_train(args, config, output, worker_index):
    if args.overwrite:
        _overwrite(output, worker_index, config)
    elif (output / "backup").exists():
        print(f"Resuming the interrupted run in {output}", flush=True)
    from keras_transformer.training.strategy import num_workers_from_tf_config
    from keras_transformer.training.trainer import ConfigMismatchError, check_resumable, train

    # One machine: refused before anything loads. In a cluster `train` refuses it inside
    # the workers' agreement, on every worker at once: refused here, before the cluster
    # forms, the chief left the others waiting until their --cluster-timeout.
    try:
        if worker_index is None and num_workers_from_tf_config() <= 1:
            check_resumable(config, output)
    except ConfigMismatchError as error:
        raise SystemExit(str(error))

    return train(  # validation BLEU: `validation_translator(config)`, train's default
        config,
        output,
        data_dir=args.tfds_dir,
        local_dir=args.data_dir,
        strategy=args.strategy,
        cluster_timeout_minutes=args.cluster_timeout,
    )


def cmd_train(args):
    _set_worker_tf_config(args)
    config = _load_config(args)
    output = pathlib.Path(args.output)
    from keras_transformer.training.strategy import (
        WORKER_TEMP_PREFIX, check_strategy, task_from_tf_config)
    from keras_transformer.training.trainer import hold_run_directory

    # Before anything is written: the strategy against the cluster, this worker's port.
    check_strategy(args.strategy, cluster_timeout_minutes=args.cluster_timeout)
    # The task as TF_CONFIG names it (set by --worker-index or by a cluster manager).
    chief, task_id = task_from_tf_config()

    # Each process holds the directory it writes (the chief the run directory, another
    # worker its own) from before `--overwrite` deletes anything in it; `train` takes it
    # again.
    held = output if chief else output / f"{WORKER_TEMP_PREFIX}{task_id}"
    with hold_run_directory(held):
        run = _overwrite_and_train(args, config, output, None if chief else task_id)
    if not run.epochs_trained:
        print(f"Reusing the finished run in {output} (--overwrite starts over; `make run "
              "FRESH=1` for make's run)", flush=True)
        return
    # The history and the training time cover every attempt of a resumed run.
    epochs = len(run.history.get("loss", [])) or run.epochs_trained
    minutes = run.train_seconds / 60
    done = (f"Trained {run.epochs_trained} epoch(s) (epochs {epochs - run.epochs_trained + 1}-"
            f"{epochs} of the run, which took {minutes:.1f} min in all)"
            if run.epochs_trained < epochs else
            f"Trained {run.epochs_trained} epoch(s) in {minutes:.1f} min")
    print(f"{done}; run directory {output} (model.keras, checkpoints/, tokenizer/, logs/)",
          flush=True)


def cmd_average(args):
    from keras_transformer.checkpoint_files import AVERAGED_NAME
    from keras_transformer.training.averaging import average_run

    try:
        path, used = average_run(args.model, last=args.last, output=args.out)
    except (FileNotFoundError, ValueError) as error:
        raise SystemExit(str(error))
    names = ", ".join(pathlib.Path(p).name for p in used)
    default = pathlib.Path(args.model) / "checkpoints" / AVERAGED_NAME
    if pathlib.Path(path).resolve() == default.resolve():
        use = (f"export it with `keras-transformer export --model {shlex.quote(args.model)} "
               f"--checkpoint averaged --out "
               f"{shlex.quote(str(pathlib.Path(args.model) / 'export'))}`")
    else:  # export reads the run's own file only
        use = ("a Keras model file (`keras.saving.load_model`); `export --checkpoint averaged` "
               f"exports {default} instead")
    kept = (f" (the run kept {len(used)} of the {args.last} asked for)"
            if len(used) < args.last else "")
    print(f"Averaged {len(used)} checkpoint(s){kept} ({names}) -> {path}; {use}", flush=True)


def cmd_launch(args):
    from keras_transformer.training.launcher import launch_local_workers

    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    code = launch_local_workers(
        train_args, args.local_workers, threads_per_worker=args.threads_per_worker,
        log_dir=args.log_dir, timeout=args.timeout,
    )
    if code:
        raise SystemExit(f"keras-transformer launch: the workers were stopped (exit code "
                         f"{code}; see above).")


def cmd_export(args):
    from keras_transformer.export import DecodingConfig, export_run
    from keras_transformer.export.saved_model import check_base_dir

    # Flags not given (None) keep DecodingConfig's defaults; these four set beam search.
    stopping = None if args.beam_stopping is None else args.beam_stopping == "early"
    beam = {"--beam-size": ("beam_size", args.beam_size), "--alpha": ("alpha", args.alpha),
            "--beam-stopping": ("early_stopping", stopping),
            "--length-penalty-form": ("length_penalty_form", args.length_penalty_form)}
    given = {field: value for field, value in beam.values() if value is not None}
    if given and args.search != "beam":
        flags = ", ".join(flag for flag, (_, value) in beam.items() if value is not None)
        raise SystemExit(f"keras-transformer export: {flags} set(s) beam search, which --search "
                         f"{args.search} does not run: leave it out, or export --search beam.")
    if args.jit_max_rows is not None:
        if not args.jit:
            raise SystemExit("keras-transformer export: --jit-max-rows goes with --jit.")
        given["jit_max_rows"] = args.jit_max_rows or None  # 0: XLA at every batch size
    # Flags that change a search this export never runs wrote the same SavedModel.
    if args.growing_cache and args.search != "beam":
        raise SystemExit(f"keras-transformer export: --growing-cache changes beam search's "
                         f"cache, which --search {args.search} does not run: leave it out, or "
                         "export --search beam.")
    if args.jit and args.jit_max_rows == 0:
        for flag, set_ in (("--growing-cache", args.growing_cache),
                           ("--keep-finished", args.keep_finished)):
            if set_:
                raise SystemExit(f"keras-transformer export: {flag} changes the regular "
                                 "search, which --jit --jit-max-rows 0 never runs (XLA at "
                                 "every batch size): leave one of them out.")
    check_base_dir(args.out, args.version)  # before the model loads

    # The settings are checked before the model is loaded, so a bad flag fails at once.
    try:
        decoding = DecodingConfig.for_export(
            search=args.search,
            **given,
            max_input_length=args.max_input_length,
            extra_length=args.extra_length,
            max_output_length=args.max_output_length,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            disable_unk=not args.allow_unk,
            jit_compile=args.jit,
            drop_finished=not args.keep_finished,
            in_place_cache="none" if args.growing_cache else "beam",
            # Otherwise DecodingConfig.EXPORT_SETTINGS decides (stored).
            **({"stored_projection": False} if args.no_stored_projection else {}),
        )
    except ValueError as error:
        raise SystemExit(f"keras-transformer export: {error}") from None
    checkpoint = _checkpoint_record(args.model, args.checkpoint)
    try:  # e.g. output lengths past a learned position table
        path = export_run(args.model, args.out, args.checkpoint, decoding,
                          version=args.version, dtype_policy=args.dtype)
    except ValueError as error:
        raise SystemExit(f"keras-transformer export: {error}") from None
    search = f"beam {decoding.beam_size}" if args.search == "beam" else args.search
    print(f"Exported a {search} translator to {path}")
    print(f"  from checkpoint {checkpoint['checkpoint']} ({checkpoint['checkpoint_path']})")


def cmd_export_ctranslate2(args):
    from keras_transformer.export import ctranslate2_converter as converter

    command = "keras-transformer export-ctranslate2"
    try:  # the quick refusals before the model loads
        converter.import_ctranslate2()
        out = converter.check_output_dir(args.out)
    except (ImportError, FileExistsError, ValueError) as error:
        raise SystemExit(f"{command}: {error}") from None
    if not (math.isfinite(args.alpha) and args.alpha >= 0):
        raise SystemExit(f"{command}: --alpha must be a number >= 0, got {args.alpha}.")
    if args.max_input_length < 2:
        raise SystemExit(f"{command}: --max-input-length must be >= 2 (END and a token), got "
                         f"{args.max_input_length}.")
    checkpoint = _checkpoint_record(args.model, args.checkpoint)
    sentences = None
    if args.check_sentences:
        from keras_transformer.export.run import data_spec, read_split

        config = json.loads((pathlib.Path(args.model) / "config.json").read_text())
        try:
            sentences = read_split(data_spec(config), "validation", local_dir=args.data_dir,
                                   tfds_dir=args.tfds_dir, limit=args.check_sentences)[0]
        except (OSError, ValueError) as error:
            raise SystemExit(
                f"{command}: the run's validation sentences, which the conversion is checked "
                f"on, cannot be read ({error}). Say where they are (--data-dir, --tfds-dir), "
                "or convert unchecked with --check-sentences 0.") from None
    settings = {"decoding": {"beam_size": args.beam_size, "length_penalty": args.alpha,
                             "max_input_length": args.max_input_length,
                             "max_output_length": args.max_output_length}, **checkpoint,
                # Absolute: the record is read from other directories.
                "checkpoint_path": str(pathlib.Path(checkpoint["checkpoint_path"]).resolve())}
    try:
        path, check = converter.convert_run(args.model, out, args.checkpoint,
                                            check_sentences=sentences, metadata=settings)
    except (OSError, ValueError) as error:
        raise SystemExit(f"{command}: {error}") from None
    print(f"Converted checkpoint {checkpoint['checkpoint']} ({checkpoint['checkpoint_path']}) "
          f"into a CTranslate2 model: {path}")
    print(f"  greedy check on {len(sentences)} validation sentences: {check['same']} of "
          f"{check['compared']} translations the same in both engines" if check is not None
          else "  not checked against our model (--check-sentences 0)")
    quoted = shlex.quote(str(path))
    print(f"  translate: keras-transformer translate --export {quoted} [--compute-type int8] "
          f"(beam {args.beam_size}, length penalty {args.alpha}); score: keras-transformer "
          f"evaluate --export {quoted}; in Python: keras_transformer.export."
          "ctranslate2_translator.CTranslate2Translator")


def _checkpoint_record(run_dir, requested):
    """The export metadata saying which checkpoint is exported; warns when not `requested`."""
    from keras_transformer.export.run import resolve_checkpoint

    used, path = resolve_checkpoint(run_dir, requested)
    if used != requested:
        print(f"Note: {run_dir} has no {requested} checkpoint; exporting the {used} model "
              f"{path} instead.", file=sys.stderr, flush=True)
    return {"checkpoint": used, "checkpoint_requested": requested, "checkpoint_path": str(path)}


def _read_lines(path):
    """A file's lines for `evaluate`, refused unless UTF-8: a reference file in another
    encoding would lower BLEU silently."""
    from keras_transformer.export.inference import read_lines

    return read_lines(path, strict=True)


def _progress_bar(args, total, streams_output=True):
    """A progress bar on stderr when it helps and does not pollute (`--progress` forces it).

    Shown by default when the total is known (a file, not a pipe), stderr is a terminal and,
    for a command that streams its output (`streams_output`), the output does not go to that
    same terminal; asked for without a total, it counts.
    """
    from keras_transformer.export.inference import ProgressBar

    show = args.progress
    if show is None:
        output_to_terminal = (streams_output and not getattr(args, "output", None)
                              and sys.stdout.isatty())
        show = total is not None and sys.stderr.isatty() and not output_to_terminal
    return ProgressBar(total) if show else None


def _is_standard_input(path):
    """Whether `path` is the regular file the standard input reads (`< path`; not a
    terminal that is both stdin and `--output /dev/stdout`)."""
    try:
        output = os.stat(path)
        return stat.S_ISREG(output.st_mode) and os.path.samestat(
            os.fstat(sys.stdin.fileno()), output)
    except (AttributeError, OSError, ValueError):  # no file behind stdin (a test's, closed)
        return False


class _TranslationOutput:
    """Where `translate --output` writes, decided before anything slow runs.

    A new file, or a regular file (a symbolic link's target included), is written beside it
    and put in place once whole (renamed over it; with other hard links, copied into it):
    until then it stays as it was. A device or a FIFO is written as the lines come
    (`streaming`). Compressed when the name given ends in `.gz`, as inputs are read.
    """

    def __init__(self, output):
        from keras_transformer.textfiles import partial_path

        self.output = output
        self.compress = output.endswith(".gz")
        self.target = os.path.realpath(output)
        if os.path.isdir(self.target):
            raise SystemExit(f"--output {output} is a directory: give a file name.")
        directory = os.path.dirname(self.target)
        if not os.path.isdir(directory):
            raise SystemExit(f"--output {output}: the directory {directory} does not exist.")
        try:
            status = os.stat(self.target)
        except FileNotFoundError:
            status = None
        self.streaming = status is not None and not stat.S_ISREG(status.st_mode)
        self.linked = status is not None and not self.streaming and status.st_nlink > 1
        self.partial = None if self.streaming else str(partial_path(self.target))
        if self.partial and not os.access(directory, os.W_OK):
            if status is None:
                raise SystemExit(f"--output {output}: no file can be created in {directory}.")
            self.partial = None  # written in place, as a shell's `>` would
        self.file = None

    def open(self):
        from keras_transformer import textfiles

        self.file = textfiles.open_text_output(self.partial or self.target, self.compress,
                                               name=self.target)
        return self.file

    def finish(self):
        """Closes the file (a full disk may say so only now) and puts it in place."""
        self.file.close()
        if self.partial is None:
            return
        if self.linked:  # its other names must see the translation too
            with open(self.partial, "rb") as source, open(self.target, "wb") as target:
                shutil.copyfileobj(source, target)
            os.remove(self.partial)
            return
        with contextlib.suppress(OSError):  # the mode of the file it replaces
            shutil.copymode(self.target, self.partial)
        os.replace(self.partial, self.target)

    def stopped(self, lines, total, error):
        """Keeps the lines a stopped translation wrote (or removes its empty file), and says
        what is where."""
        if self.file is not None:
            with contextlib.suppress(OSError, ValueError):
                self.file.close()
        of = f" of {total}" if total is not None else ""
        # A gzip stream a write error stopped may end before its last lines.
        held = (f"at most the translations of the first {lines}{of} lines (its end may be "
                "cut)" if self.compress and isinstance(error, OSError)
                else f"the translations of the first {lines}{of} lines only")
        if self.partial is None:
            if lines and not self.streaming:  # a FIFO or a device holds nothing to name
                print(f"\n{self.output} holds {held}.", file=sys.stderr, flush=True)
            return
        if not os.path.exists(self.partial):
            return  # put in place: the translation is whole
        if not lines:
            with contextlib.suppress(OSError):
                os.remove(self.partial)
            return
        kept = (f"{self.target[:-3]}.partial.gz" if self.compress
                else f"{self.target}.partial")
        try:
            os.replace(self.partial, kept)
        except OSError:
            kept = self.partial
        print(f"\n{kept} holds {held}; {self.output} is left as it was (it is written once "
              "the translation is whole).", file=sys.stderr, flush=True)


def _exit_on(signum, frame):
    raise SystemExit(128 + signum)  # as a shell reports a process the signal ended


def _check_compute_type(args):
    """Refuses `--compute-type` for an export that is not a CTranslate2 model, before any
    input is read."""
    from keras_transformer.export.inference import is_ctranslate2_model
    from keras_transformer.export.saved_model import latest_version_dir

    if args.compute_type is not None and not is_ctranslate2_model(args.export):
        try:  # a missing or half-written export, named as such
            latest_version_dir(args.export)
        except FileNotFoundError as error:
            raise SystemExit(f"keras-transformer {args.command}: {error}") from None
        raise SystemExit(f"keras-transformer {args.command}: --compute-type is a setting of "
                         f"CTranslate2 models (export-ctranslate2 writes them); {args.export} "
                         "is not one.")


def cmd_translate(args):
    from keras_transformer.export.inference import (
        IDLE_SECONDS,
        count_lines,
        iter_lines,
        open_translator,
    )

    _check_compute_type(args)
    if args.output == "-":  # as `--input -` is the standard input
        args.output = None
    if args.output and os.path.exists(args.output):
        if args.input != "-" and os.path.samefile(args.input, args.output):
            raise SystemExit(f"--output {args.output} is the --input file: translating it "
                             "would write over it. Write to another file.")
        if args.input == "-" and _is_standard_input(args.output):
            raise SystemExit(f"--output {args.output} is the standard input (`< "
                             f"{args.output}`): translating it would write over it. Write to "
                             "another file.")
    destination = _TranslationOutput(args.output) if args.output else None
    total = None  # a missing file fails now; a pipe (`<(zcat f.gz)`) is read once, uncounted
    if args.input != "-" and stat.S_ISREG(os.stat(args.input).st_mode):
        total = count_lines(args.input)
    try:
        translator = open_translator(args.export, signature=args.signature,
                                     compute_type=args.compute_type)
    except (ImportError, ValueError) as error:
        raise SystemExit(f"keras-transformer translate: {error}") from None
    progress = _progress_bar(args, total)
    handlers = {}
    if destination:
        out = destination.open()
        # `kill`, `timeout` and schedulers send SIGTERM, a closed terminal SIGHUP: end as
        # Ctrl-C does (the output closed whole, and a word on what it holds). Not a signal
        # the caller ignores (`nohup`).
        for signum in (signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError):  # not the main thread
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    handlers[signum] = signal.signal(signum, _exit_on)
    else:
        out = sys.stdout
        if hasattr(out, "reconfigure"):
            out.reconfigure(encoding="utf-8")  # a C locale would fail on the first umlaut
    lines, cut, unfinished = 0, [], []
    not_utf8 = {"count": 0, "first": []}  # a 10-million-line file: a count, 20 numbers

    def replaced(number):
        not_utf8["count"] += 1
        if len(not_utf8["first"]) < 20:
            not_utf8["first"].append(number)

    try:
        # Batches are sorted by length within a read-ahead buffer; lines come out in input
        # order as each buffer finishes.
        for result in translator.translate_stream(
                # (a regular file, named or as standard input, is read ahead whatever
                # `idle_seconds` says: `iter_lines` tells a pipe from a file)
                iter_lines(args.input, on_replaced=replaced, idle_seconds=IDLE_SECONDS),
                batch_size=args.batch_size,
                on_batch=progress.update if progress else None):
            # One line per input line: a line break the model emitted (SentencePiece's
            # byte pieces <0x0A>, <0x0D>) would move every later line.
            text = " ".join(filter(None, re.split(r"[\r\n]+", result["translation"])))
            try:
                out.write(text + "\n")
                if not args.output or not args.output.endswith(".gz"):
                    out.flush()  # (a gzip stream would compress each line on its own)
            except BrokenPipeError:
                if destination and not destination.streaming:
                    raise
                # The reader went away (`| head`): nothing more to say, no error at exit.
                if not destination:
                    with contextlib.suppress(OSError, ValueError):
                        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                raise SystemExit(141) from None  # 128 + SIGPIPE, as a shell reports it
            lines += 1
            if result["truncated"]:
                cut.append(lines)
            if result["unfinished"]:
                unfinished.append(lines)
        if destination:
            destination.finish()
    except BaseException as error:
        if destination:
            destination.stopped(lines, total, error)
        if isinstance(error, OSError):  # a full disk, a write refused: one line, not a trace
            raise SystemExit(f"keras-transformer translate: {error}") from None
        raise
    finally:
        if progress:
            progress.close()
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    _report_cut_lines(translator.path, cut, lines, unfinished)  # the version translating
    if not_utf8["count"]:
        print(f"{not_utf8['count']} of {lines} input lines held bytes that are not UTF-8, "
              "translated with U+FFFD in their place: "
              f"{_shown_lines(not_utf8['first'], not_utf8['count'])}. If the file is in another "
              "encoding, convert it first (`file -i FILE`, then `iconv -f ENCODING -t utf-8`).",
              file=sys.stderr, flush=True)


def _shown_lines(first, count=None):
    """Line numbers for a message: the first 20 of `first`, and "..." when there are more
    (`count`, the total, where `first` holds only the first ones)."""
    count = len(first) if count is None else count
    return ", ".join(map(str, first[:20])) + (", ..." if count > 20 else "")


def _report_cut_lines(export, cut, lines, unfinished=()):
    """Says on stderr which input lines (1-based numbers, of `lines`) were cut (`cut`) and
    which translations reached their length limit before their end (`unfinished`)."""
    if not (cut or unfinished):
        return
    from keras_transformer.export.inference import is_ctranslate2_model, read_export_metadata

    try:
        decoding = read_export_metadata(export).get("decoding", {})
    except OSError:  # the version deleted while it translated: the report without figures
        decoding = {}
    ctranslate2 = is_ctranslate2_model(export)
    if cut:
        print(f"{len(cut)} of {lines} lines were longer than the export's max_input_length "
              f"({decoding.get('max_input_length') or 'its'} tokens) and were cut before "
              f"translating: lines {_shown_lines(cut)}. Split them into sentences, or "
              + ("convert with a larger export-ctranslate2" if ctranslate2 else "export with a "
                 "larger") + " --max-input-length.", file=sys.stderr, flush=True)
    if unfinished:
        if ctranslate2:  # its bound is max_output_length alone
            limit = decoding.get("max_output_length", "its")
            fix = "Convert with a larger export-ctranslate2 --max-output-length"
        else:
            limit = (f"min(source tokens + {decoding['extra_length']}, "
                     f"{decoding['max_output_length']})"
                     if {"extra_length", "max_output_length"} <= set(decoding) else "its")
            fix = "Export with a larger --max-output-length or --extra-length"
        print(f"{len(unfinished)} of {lines} translations reached the export's length limit "
              f"({limit} tokens) before their end and are cut short: lines "
              f"{_shown_lines(list(unfinished))}. {fix} (or look for a translation that "
              "repeats itself).", file=sys.stderr, flush=True)


def _read_parallel(source_path, reference_path):
    """Reads a source and a reference file; refuses them unless they pair up line by line."""
    sources, references = _read_lines(source_path), _read_lines(reference_path)
    # Blank lines at the end of the longer file are no sentences (as in training).
    longer = sources if len(sources) > len(references) else references
    while len(longer) > min(len(sources), len(references)) and not longer[-1].strip():
        longer.pop()
    if len(sources) != len(references):
        raise SystemExit(
            f"{source_path} has {len(sources)} lines but {reference_path} has "
            f"{len(references)}: a source and its reference must pair up line by line."
        )
    return sources, references


def _data_spec(record):
    """`export.run.data_spec`, imported when a command needs it."""
    from keras_transformer.export.run import data_spec

    return data_spec(record)


def _recorded_direction(metadata):
    """`(source_lang, target_lang)` an export's metadata record names (itself or its
    training config), or None when it names neither language."""
    config = metadata.get("training_config") or {}
    direction = tuple(metadata.get(key) or config.get(key)
                      for key in ("source_lang", "target_lang"))
    return direction if all(direction) else None


def _check_languages(args, direction):
    """Refuses `evaluate --source-lang/--target-lang` other than the export's `direction`
    (`(source, target)`, or None when it records none): they would score it on another
    direction, or tokenize BLEU for another language."""
    for flag, given, recorded in zip(("--source-lang", "--target-lang"),
                                     (args.source_lang, args.target_lang), direction or ()):
        if given and given != recorded:
            raise SystemExit(
                f"{args.export} translates {direction[0]}->{direction[1]}: {flag} {given} "
                "would score it on another direction. Leave out --source-lang/--target-lang "
                "(the export's languages are used).")


def _evaluation_pairs(args, metadata):
    """`(sources, references, description, target language or None)` that `evaluate`
    scores.

    `--src/--ref` files, or the split `--split` of the data source the export was trained
    on (any of its test sets, or `validation`), in the export's direction
    (`--source-lang/--target-lang` name languages of an export that records none).
    """
    if args.src or args.ref:
        if not (args.src and args.ref):
            raise SystemExit("--src and --ref go together.")
        unused = [flag for flag, value in (
            ("--split", args.split), ("--data-dir", args.data_dir),
            ("--tfds-dir", args.tfds_dir)) if value is not None]
        if unused:
            raise SystemExit(f"{', '.join(unused)}: these pick a split of the export's data "
                             "source, which --src/--ref replace: give one or the other.")
        from keras_transformer.languages import language_from_path

        from keras_transformer.export.inference import read_export_metadata

        sources, references = _read_parallel(args.src, args.ref)
        texts = [line for line in sources if line.strip()]
        if len(texts) >= 2 and all(line.count("\t") == 1 for line in texts):
            raise SystemExit(
                f"Every line of --src {args.src} holds one tab: a TSV file (source<TAB>target)"
                ", which would be translated with its reference inside. Give the two columns "
                f"as two files: cut -f1 {args.src} > src.txt; cut -f2 {args.src} > ref.txt, "
                "then --src src.txt --ref ref.txt.")
        metadata = read_export_metadata(args.export)
        direction = _recorded_direction(metadata)
        _check_languages(args, direction)
        if direction is None and args.source_lang:
            raise SystemExit(f"--source-lang has no use with --src/--ref on {args.export}, "
                             "which records no languages: --target-lang names the language "
                             "BLEU is tokenized for.")
        named = (language_from_path(args.src), language_from_path(args.ref))
        if direction and direction[0] != direction[1] and named == direction[::-1]:
            raise SystemExit(
                f"{args.export} translates {direction[0]}->{direction[1]}, but --src {args.src} "
                f"({named[0]}) and --ref {args.ref} ({named[1]}) are named the other way "
                f"round: give the {direction[0]} file as --src.")
        # The language BLEU is tokenized for: said, the export's, or the --ref file's name.
        target_lang = (args.target_lang or metadata.get("target_lang")
                       or language_from_path(args.ref))
        return sources, references, f"{args.src} -> {args.ref}", target_lang
    from keras_transformer.export.run import read_split

    # Languages alone (a `Translator(metadata=...)`) name no data source: read as Multi30K's
    # they scored a model of one's own data on Multi30K.
    recorded = {"data", "training_config"} & set(metadata)
    if not recorded and not (args.source_lang and args.target_lang):
        raise SystemExit(
            f"{args.export} records no data source (an export written from Python without a "
            "`data` entry in its metadata): evaluate it with --src FILE --ref FILE, or name "
            "Multi30K's languages with --source-lang and --target-lang."
        )
    _check_languages(args, _recorded_direction(metadata))
    spec = _data_spec(metadata)
    spec["source_lang"] = args.source_lang or spec["source_lang"]
    spec["target_lang"] = args.target_lang or spec["target_lang"]
    # Its errors (no such split, unreadable files) reach `main`'s handler: one line.
    return read_split(spec, args.split or "test", local_dir=args.data_dir,
                      tfds_dir=args.tfds_dir)


def cmd_evaluate(args):
    from keras_transformer.export.inference import read_export_metadata

    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        raise SystemExit(f"--json {args.json}: its directory does not exist (the scores would "
                         "be lost after the translation).")
    _check_compute_type(args)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(encoding="utf-8")  # --show's examples in a C locale
    # The metadata file, not the SavedModel: bad input is refused before the model loads.
    files_given = args.src or args.ref
    sources, references, description, target_lang = _evaluation_pairs(
        args, {} if files_given else read_export_metadata(args.export))
    print(f"Evaluating on {description}", flush=True)
    if args.limit:
        sources, references = sources[: args.limit], references[: args.limit]
    _translate_and_report(args, sources, references, target_lang)


def _translate_and_report(args, sources, references, target_lang=None):
    """`evaluate`'s second half: translate (first call untimed), score, print, write JSON."""
    from keras_transformer.export.inference import evaluate_export

    progress = _progress_bar(args, len(sources), streams_output=False)
    try:
        scores = evaluate_export(args.export, sources, references, batch_size=args.batch_size,
                                 signature=args.signature,
                                 on_batch=progress.update if progress else None,
                                 target_lang=target_lang, compute_type=args.compute_type)
    except (ImportError, ValueError) as error:  # a signature or compute type it lacks, ...
        raise SystemExit(f"keras-transformer evaluate: {error}") from None
    finally:
        if progress:
            progress.close()
    hypotheses = scores.pop("translations")
    for source, hypothesis, reference in list(zip(sources, hypotheses, references))[: args.show]:
        print(f"SRC: {source}\nOUT: {hypothesis}\nREF: {reference}\n")
    engine = ("" if scores["compute_type"] is None
              else f", CTranslate2 compute type {scores['compute_type']}")
    print(f"{len(sources)} sentences in {scores['seconds']:.1f}s "
          f"({scores['sentences_per_second']:.1f}/s, batch {args.batch_size}{engine}, first "
          "call not timed)")
    print(f"BLEU (cased, detokenized): {scores['bleu']:.2f}")
    print(f"BLEU (lowercased):         {scores['bleu_lowercase']:.2f}")
    print(f"chrF:                      {scores['chrf']:.2f}")
    print(f"sacreBLEU signatures: BLEU {scores['bleu_signature']}\n"
          f"                      chrF {scores['chrf_signature']}")
    changed = scores["references_changed_by_normalization"]
    if changed:
        rule = scores["normalization"]
        print(f"{changed} of {len(references)} references hold characters the vocabulary "
              f"normalizes ({rule}: "
              + ("full-width punctuation, ligatures, zero-width and bidi marks, ..."
                 if rule == "nmt_nfkc" else "full-width punctuation, ligatures, ...")
              + "), which the model cannot write: the BLEU above is understated; against the "
              f"normalized references it is {scores['bleu_normalized_references']:.2f}. A "
              "run trained with --set normalization=nfkc keeps zero-width characters and bidi "
              "marks, with identity every character as given.")
    _report_cut_lines(scores["model_path"], scores["truncated_lines"], len(sources),
                      scores["unfinished_lines"])
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(scores, indent=2))


COMPUTE_TYPE_HELP = ("an --export written by export-ctranslate2: CTranslate2's computation "
                     "type (int8 is faster on CPU; default: as saved, float32)")


def build_parser():
    from keras_transformer.decoding import LENGTH_PENALTY_FORMS
    from keras_transformer.export.translator import BEAM_STOPPING, SEARCHES

    parser = argparse.ArgumentParser(prog="keras-transformer",
                                     description=" ".join(__doc__.split("\n\n")[0].split()))
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser(
        "train", help="train with model.fit on Multi30K, your parallel files, a TSV file or a "
        "TFDS dataset", epilog="Data: --train SRC TGT --valid SRC TGT [--test NAME=SRC,TGT] "
        "(plain or .gz, one sentence a line; languages from the names: train.fr train.en), or "
        "--train TSV --valid TSV with --source-lang/--target-lang, or --data "
        "tfds:ted_hrlr_translate/pt_to_en, or Multi30K (default) with --source-lang/"
        "--target-lang among en, de, fr, cs.")
    train.add_argument(
        "--preset",
        help=f"tiny | quick | multi30k (default: an existing run's own configuration, else "
             f"{DEFAULT_PRESET})")
    train.add_argument("--config", help="a JSON or YAML TrainingConfig file (overrides --preset)")
    train.add_argument("--set", nargs="*", action="extend", metavar="FIELD=VALUE",
                       help="override config fields (several --set add up)")
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
    train.add_argument("--test", action="append", nargs="+", metavar="NAME=SRC,TGT",
                       help="a named test set for `evaluate --split NAME` (NAME=TSV for TSV);"
                       " repeatable")
    train.add_argument("--source-lang", help="source language code (default: from the file "
                       "names, the TFDS dataset's supervised keys, or en for Multi30K)")
    train.add_argument("--target-lang", help="target language code (as --source-lang; "
                       "Multi30K default de)")
    train.add_argument("--data-dir", help="directory with the raw Multi30K files "
                       "(default: $KERAS_TRANSFORMER_MULTI30K_DIR or ../shared/data/multi30k)")
    train.add_argument("--tfds-dir", help="TFDS data_dir (for --data tfds:NAME)")
    train.add_argument("--mixed-precision", choices=sorted(PRECISIONS),
                       help="auto: bf16 where the CPU computes bfloat16 natively (AVX-512 "
                       "BF16, AMX) and no GPU is visible, float32 elsewhere")
    train.add_argument("--strategy", default="auto",
                       choices=["auto", "default", "mirrored", "multi_worker"])
    train.add_argument("--workers", metavar="HOST:PORT,...",
                       help="every worker of a multi-worker cluster, the same list on each "
                       "machine (sets TF_CONFIG; worker 0 is the chief and writes --output)")
    train.add_argument("--worker-index", type=int, metavar="I",
                       help="this machine's position in --workers")
    # 30.0 = strategy.CLUSTER_TIMEOUT_MINUTES (not imported here: it loads TensorFlow).
    train.add_argument("--cluster-timeout", type=_minutes, default=30.0, metavar="MINUTES",
                       help="a multi-worker worker exits (status 1) when the others have not "
                       "all connected after this many minutes (default 30; 0: no limit)")
    train.set_defaults(func=cmd_train)

    average = sub.add_parser(
        "average", help="average a run's last N epoch checkpoints (train with "
        "--set keep_checkpoints=N) into checkpoints/averaged.keras")
    average.add_argument("--model", required=True, help="run directory from `train`")
    average.add_argument("--last", type=int, default=5, help="checkpoints to average "
                         "(default 5, as the paper)")
    average.add_argument("--out", help="output .keras file (default "
                         "RUN/checkpoints/averaged.keras, what --checkpoint averaged exports)")
    average.set_defaults(func=cmd_average)

    launch = sub.add_parser(
        "launch", help="try multi-worker training on this machine: start N `train` workers "
        "on loopback (usage: launch --local-workers 2 -- train --preset tiny --output DIR)")
    launch.add_argument("--local-workers", type=_count, required=True, metavar="N")
    launch.add_argument("--threads-per-worker", type=int, metavar="T",
                        help="TensorFlow threads of each worker (e.g. 1: one core each)")
    launch.add_argument("--log-dir", help="where workers 1.. log (default: a temp dir, "
                        "removed when every worker succeeded)")
    launch.add_argument("--timeout", type=float, help="stop all workers after this many s")
    launch.add_argument("train_args", nargs=argparse.REMAINDER,
                        help="-- train ARGS... (the command every worker runs)")
    launch.set_defaults(func=cmd_launch)

    export = sub.add_parser("export", help="write a versioned SavedModel for TF Serving")
    export.add_argument("--model", required=True, help="run directory from `train`")
    export.add_argument("--out", required=True, help="model base directory (gets <version>/)")
    export.add_argument("--version", type=int, help="default: the next free integer")
    export.add_argument("--checkpoint", default="best",
                        choices=["best", "final", "last", "averaged"])
    export.add_argument("--search", default="beam", choices=SEARCHES,
                        help="the translate signature's search (default beam); sample also "
                        "exports translate_seeded(text, seed), one int64 seed per sentence")
    export.add_argument("--beam-size", type=int, help="beam search's hypotheses (default 4)")
    export.add_argument("--alpha", type=float,
                        help="beam search's length penalty strength (default 0.6)")
    export.add_argument("--beam-stopping", choices=BEAM_STOPPING,
                        help="beam search: a sentence is done once --beam-size hypotheses "
                        "have finished (early, as fairseq and CTranslate2; default) or once no "
                        "alive hypothesis can beat them (exact: about 2x slower with a length "
                        "penalty of 1.4, occasionally better)")
    export.add_argument("--length-penalty-form", choices=LENGTH_PENALTY_FORMS,
                        help="beam search ranks by log_prob / ((5 + length) / 6) ** alpha "
                        "(gnmt, the default) or by log_prob / length ** alpha (power: "
                        "CTranslate2's length_penalty); END counts in the length")
    export.add_argument("--max-input-length", type=int, default=128,
                        help="source tokens (END included) the model reads; a longer source "
                        "is cut to them and flagged in the output `truncated` "
                        "(default %(default)s)")
    export.add_argument("--extra-length", type=int, default=50,
                        help="a translation ends by source tokens + this (default %(default)s)")
    export.add_argument("--max-output-length", type=int, default=128,
                        help="target tokens at most, END included (default %(default)s); "
                        "beam search's buffers have this length: larger is slower")
    export.add_argument("--temperature", type=float, default=1.0,
                        help="--search sample: softmax temperature, > 0 (default 1.0)")
    export.add_argument("--top-k", type=int, default=0,
                        help="--search sample: sample among the k most likely tokens (0 = off)")
    export.add_argument("--top-p", type=float, default=1.0,
                        help="--search sample: nucleus mass in (0, 1] (1.0 = off)")
    export.add_argument("--jit", action="store_true",
                        help="compile the encoder and the search loop with XLA (faster; the "
                        "model server must run with --xla_cpu_compilation_enabled=true); "
                        "greedy and beam search only: with --search sample or "
                        "greedy_uncached, only translate_greedy is compiled")
    export.add_argument("--jit-max-rows", type=int, metavar="N",
                        help="with --jit: a batch of more than N rows (sentences x beam "
                        "size) takes the regular search, faster on large batches (default 8; "
                        "0 = XLA at every size)")
    export.add_argument("--allow-unk", action="store_true",
                        help="let the searches produce the UNK piece (never produced by default)")
    export.add_argument("--keep-finished", action="store_true",
                        help="greedy and beam search keep decoding finished sentences (fed "
                        "padding) instead of dropping them from the batch; same results, "
                        "slower: for comparisons")
    export.add_argument("--growing-cache", action="store_true",
                        help="beam search grows the decoder's key/value cache by "
                        "concatenation (as greedy search does) instead of writing time-major "
                        "buffers in place; same results: for comparisons")
    export.add_argument("--no-stored-projection", action="store_true",
                        help="transpose a tied model's embedding table into the pre-softmax "
                        "kernel at every call instead of saving the transposed table (an "
                        "export smaller by the table's size, each call slower by the "
                        "transpose); same results")
    export.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="what the exported model computes in, whatever the run trained "
                        "with (default float32); bfloat16 weights and matmuls are fast only "
                        "on CPUs with AVX-512 BF16 or AMX and oneDNN (benchmarks/RESULTS.md)")
    export.set_defaults(func=cmd_export)

    ct2 = sub.add_parser(
        "export-ctranslate2", help="convert a run's checkpoint into a CTranslate2 model "
        "(needs pip install keras-transformer[ctranslate2])",
        description="Writes CTranslate2's model files with the SentencePiece models and the "
        "settings beside them, for keras_transformer.export.ctranslate2_translator."
        "CTranslate2Translator (and translate/evaluate --export): the same weights decoded "
        "by CTranslate2's C++ engine, faster than the SavedModel on CPU "
        "(benchmarks/RESULTS.md). Written only after the two engines' greedy translations of "
        "the run's validation sentences agree (unless --check-sentences 0).")
    ct2.add_argument("--model", required=True, help="run directory from `train`")
    ct2.add_argument("--out", required=True, help="directory to create (absent or empty)")
    ct2.add_argument("--checkpoint", default="best",
                     choices=["best", "final", "last", "averaged"])
    ct2.add_argument("--beam-size", type=_count, default=4,
                     help="the translator's default beam (default %(default)s; 1 = greedy)")
    ct2.add_argument("--alpha", type=float, default=1.0,
                     help="the translator's default length penalty, CTranslate2's form: "
                     "log_prob / length ** alpha (default %(default)s; choose it on "
                     "validation with benchmarks/choose_on_validation.py "
                     "--length-penalty-forms power)")
    ct2.add_argument("--max-input-length", type=int, default=128,
                     help="source tokens (END included) kept (default %(default)s)")
    ct2.add_argument("--max-output-length", type=_count, default=128,
                     help="target tokens at most (default %(default)s)")
    ct2.add_argument("--check-sentences", type=_count_or_zero, default=100,
                     help="validation sentences whose greedy translations must agree in both "
                     "engines before anything is written (default %(default)s; 0: no check)")
    ct2.add_argument("--data-dir", help="directory with the raw Multi30K files")
    ct2.add_argument("--tfds-dir", help="TFDS data_dir of a tfds:NAME source")
    ct2.set_defaults(func=cmd_export_ctranslate2)

    translate = sub.add_parser(
        "translate", help="translate lines with an exported SavedModel (for a running TF "
        "Serving server use export/client.py) or a CTranslate2 model")
    translate.add_argument("--export", required=True, help="SavedModel version dir or base "
                           "dir, or a directory export-ctranslate2 wrote")
    translate.add_argument("--input", default="-", help="file of sentences (default stdin)")
    translate.add_argument("--output", help="file for translations, gzip-compressed when it "
                           "ends in .gz, written once whole (default, or -: stdout)")
    translate.add_argument("--signature", default="translate",
                           help="translate (the export's search) or translate_greedy")
    translate.add_argument("--compute-type", help=COMPUTE_TYPE_HELP)
    translate.add_argument("--batch-size", type=_count, default=64)
    translate.add_argument("--progress", action=argparse.BooleanOptionalAction,
                           help="progress bar on stderr (default: when --input is a file, "
                           "stderr a terminal and the output not that terminal; --progress "
                           "with a pipe or stdin: a count of the sentences done)")
    translate.set_defaults(func=cmd_translate)

    evaluate = sub.add_parser("evaluate", help="BLEU and chrF of an export (a SavedModel or a "
                              "CTranslate2 model)")
    evaluate.add_argument("--export", required=True, help="SavedModel version dir or base dir, "
                          "or a directory export-ctranslate2 wrote")
    evaluate.add_argument("--split", help="a test set of the data source the export was "
                          "trained on (e.g. test_2017_flickr, a --test NAME), validation, or "
                          "test (its first test set; the default)")
    evaluate.add_argument("--src", help="source file (with --ref instead of --split)")
    evaluate.add_argument("--ref", help="reference file")
    evaluate.add_argument("--source-lang", help="default: the export's source language")
    evaluate.add_argument("--target-lang", help="default: the export's target language")
    evaluate.add_argument("--data-dir", help="directory with the raw Multi30K files")
    evaluate.add_argument("--tfds-dir", help="TFDS data_dir of a tfds:NAME source")
    evaluate.add_argument("--signature", default="translate",
                          help="translate (the export's search) or translate_greedy")
    evaluate.add_argument("--compute-type", help=COMPUTE_TYPE_HELP)
    evaluate.add_argument("--batch-size", type=_count, default=64)
    evaluate.add_argument("--limit", type=_count, help="only the first N sentences")
    evaluate.add_argument("--show", type=_count_or_zero, default=0, help="print N examples")
    evaluate.add_argument("--json", help="write the scores to this file")
    evaluate.add_argument("--progress", action=argparse.BooleanOptionalAction,
                          help="progress bar on stderr (default: when stderr is a terminal)")
    evaluate.set_defaults(func=cmd_evaluate)
    _add_verbose_flag(parser, sub)
    return parser


def _add_verbose_flag(parser, subparsers):
    """`--verbose` before or after the command (read before argparse runs, see cli_startup)."""
    help_text = "show TensorFlow's C++ start-up and log lines (hidden by default)"
    parser.add_argument("--verbose", action="store_true", help=help_text)
    for command in subparsers.choices.values():
        # SUPPRESS: a command's own default must not overwrite a --verbose given before it.
        command.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                             help=help_text)


# Set to show the traceback of an error the command reports in one line.
TRACEBACK_ENV = "KERAS_TRANSFORMER_TRACEBACK"


# TensorFlow's errors of a cluster that lost a worker or cannot form.
_CLUSTER_ERRORS = ("UnavailableError", "AbortedError", "DeadlineExceededError",
                   "CancelledError", "UnknownError", "InternalError")


def _is_tensorflow_error(error):
    """Whether `error` is a TensorFlow runtime error (`tf.errors.OpError`), checked without
    importing TensorFlow."""
    return any(cls.__name__ == "OpError" and cls.__module__.startswith("tensorflow")
               for cls in type(error).__mro__)


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, OSError) as error:
        # A user's mistake (a missing file, a bad setting, data that does not pair up)
        # says what is wrong in one line; the traceback only on request.
        if os.environ.get(TRACEBACK_ENV):
            raise
        raise SystemExit(f"keras-transformer {args.command}: {error}\n(set {TRACEBACK_ENV}=1 "
                         "to see where)") from None
    except Exception as error:  # noqa: BLE001  (TensorFlow's runtime errors, below)
        if os.environ.get(TRACEBACK_ENV) or not _is_tensorflow_error(error):
            raise
        # A cluster's failure (a worker died, a port in use) in one line: its first line.
        first = (str(getattr(error, "message", "")) or str(error)).strip().splitlines()
        hint = ""
        if (args.command == "train" and type(error).__name__ in _CLUSTER_ERRORS
                and os.environ.get("TF_CONFIG")):
            hint = (f"; if another worker stopped, start every worker again with the same "
                    f"command to resume {args.output}")
        raise SystemExit(f"keras-transformer {args.command}: {type(error).__name__}: "
                         f"{first[0] if first else ''}{hint}\n(set {TRACEBACK_ENV}=1 to see "
                         "the rest)") from None
    except KeyboardInterrupt as interrupt:
        if os.environ.get(TRACEBACK_ENV):
            raise
        again = "the same command" + (" without --overwrite" if getattr(
            args, "overwrite", False) else "")
        resume = (f"; run {again} again to resume {args.output} from its last completed "
                  "epoch" if args.command == "train" else "")
        if isinstance(interrupt, _OverwriteInterrupted):
            resume = (f" while --overwrite deleted the previous run in {args.output}; run "
                      "the same command again to start over")
        print(f"\nkeras-transformer {args.command}: Interrupted{resume}.", file=sys.stderr,
              flush=True)
        raise SystemExit(130) from None
    return 0


if __name__ == "__main__":
    sys.exit(main())

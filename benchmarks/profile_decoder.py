"""Profile of the exported decoder: ops per decoding step, time per op class, ms per step.

Builds the reference-shaped model (random weights; decoding cost per step does not depend
on the weights) or loads a run with --run, exports a beam-4 `Translator` (its SavedModel
also has `translate_greedy`) and prints:

(a) the ops of one decoding step: the op types in the body function of the search's
    `tf.while_loop`, counted in the traced graph's function library (nested functions
    included); deterministic, unlike timings;
(b) time per op class from per-op step stats (`RunMetadata` of a TF1 session with
    `FULL_TRACE`, the way TF Serving runs the SavedModel), and the time the step spends
    outside ops (wall time minus the union of all op intervals);
(c) milliseconds per decoding step, beam 4 and greedy, batch 32 and batch 1, measured on
    the SavedModel loaded with `tf.saved_model.load`.

With random weights END rarely comes, so every sentence runs to --max-output-length steps
(`extra_length` is set as large): ms per step = call time / steps run.

Comparing code versions: every run keeps its export under --work-dir/--name; pass earlier
exports with --compare and they are timed in the same process, alternating (A B A B ...),
medians and ratios printed. The machine may be shared: read ratios, not absolute figures.

`--executor-type SINGLE_THREADED_EXECUTOR` traces the export's signatures under
`tf.experimental.function_executor_type`: its function calls name that executor and its
loops stay functional `While` ops (that executor cannot run the lowered form), to compare
against an export of the default executor (RESULTS.md, session 54: slower, not adopted).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/profile_decoder.py --name before
    PYTHONPATH=$PWD .venv/bin/python benchmarks/profile_decoder.py --name after \
        --compare /tmp/profile_decoder/before
"""

import argparse
import collections
import itertools
import os
import pathlib
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# The reference shape of issue 10 (the `multi30k` preset's decoder).
REFERENCE_MODEL = dict(
    vocab_size=8000, d_model=256, num_heads=4, ff_dim=1024, num_layers=3, dropout=0.1,
    norm_first=False, tie_embeddings=True,
)
# Lines per language for the throw-away tokenizer (enough for 8000 pieces).
TOKENIZER_LINES = 10000
SIGNATURES = ("translate", "translate_greedy")  # beam 4, greedy
# Op types that only move control in a v1-lowered while loop (not work).
CONTROL_OPS = {"Enter", "Exit", "Merge", "Switch", "NextIteration", "LoopCond", "_Recv",
               "_Send", "NoOp", "Identity", "Const", "_Retval", "_Arg"}


def reference_parts(args, work_dir):
    """`(model, source_tokenizer, target_tokenizer)` of --run, or random weights."""
    import keras

    from keras_transformer import build_transformer
    from keras_transformer.data import multi30k_lines
    from keras_transformer.text import load_tokenizers, train_tokenizers

    if args.run:
        from keras_transformer.export import load_run

        model, source_tokenizer, target_tokenizer, _ = load_run(args.run, args.checkpoint)
        return model, source_tokenizer, target_tokenizer
    tokenizer_dir = work_dir / "tokenizer"
    if not (tokenizer_dir / "tokenizer.model").is_file():
        english, german = (multi30k_lines("train", lang, TOKENIZER_LINES)
                           for lang in ("en", "de"))
        train_tokenizers(
            {"en": english, "de": german}, vocab_size=REFERENCE_MODEL["vocab_size"],
            output_dir=tokenizer_dir, hard_vocab_limit=False,
        )
    source_tokenizer, target_tokenizer = load_tokenizers(tokenizer_dir)
    keras.utils.set_random_seed(args.seed)
    model = build_transformer(**REFERENCE_MODEL)
    return model, source_tokenizer, target_tokenizer


def function_library(concrete_function):
    graph_def = concrete_function.graph.as_graph_def()
    return graph_def, {f.signature.name: f for f in graph_def.library.function}


def called_functions(node):
    """Names of the functions a node calls (While body/cond, If branches, calls)."""
    names = []
    for value in node.attr.values():
        if value.HasField("func"):
            names.append(value.func.name)
        names += [f.name for f in value.list.func]
    return names


def count_ops(function, library, skip=()):
    """Op types in `function` and, recursively, in the functions its nodes call."""
    counts = collections.Counter()
    for node in function.node_def:
        callees = [name for name in called_functions(node) if name not in skip]
        if callees and node.op not in ("While", "StatelessWhile"):
            for name in callees:
                counts += count_ops(library[name], library, skip)
        else:
            counts[node.op] += 1
    return counts


def step_ops(concrete_function):
    """The op-type counts of the search loop's body (the largest `While` body)."""
    graph_def, library = function_library(concrete_function)
    bodies = []
    for function in [graph_def.node] + [f.node_def for f in library.values()]:
        for node in function:
            if node.op in ("While", "StatelessWhile"):
                bodies.append(library[node.attr["body"].func.name])
    counts = [count_ops(body, library) for body in bodies]
    return max(counts, key=lambda c: sum(c.values()))


def print_op_counts(title, counts):
    total = sum(counts.values())
    work = sum(n for op, n in counts.items() if op not in CONTROL_OPS)
    print(f"\n## (a) ops per decoding step, {title}: {total} nodes ({work} excluding "
          f"Identity/Const/NoOp)")
    for op, n in counts.most_common():
        print(f"  {op:32s} {n:4d}")


def session_profile(export_path, signature, sentences, repeats):
    """Per-op step stats of one signature run in a TF1 session (as TF Serving runs it)."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 (registers the SentencePiece ops)

    graph = tf.Graph()
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=tf.config.threading.get_intra_op_parallelism_threads(),
        inter_op_parallelism_threads=tf.config.threading.get_inter_op_parallelism_threads(),
    )
    with graph.as_default(), tf.compat.v1.Session(graph=graph, config=config) as session:
        meta = tf.compat.v1.saved_model.load(session, ["serve"], str(export_path))
        signature_def = meta.signature_def[signature]
        feed = {signature_def.inputs["text"].name: sentences}
        fetch = {key: value.name for key, value in signature_def.outputs.items()}
        session.run(fetch, feed)  # warm-up
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        best = None
        for _ in range(repeats):
            metadata = tf.compat.v1.RunMetadata()
            started = time.perf_counter()
            outputs = session.run(fetch, feed, options=options, run_metadata=metadata)
            wall = time.perf_counter() - started
            if best is None or wall < best[0]:
                best = (wall, metadata, outputs)
    return best


def print_session_profile(title, export_path, signature, sentences, repeats):
    wall, metadata, outputs = session_profile(export_path, signature, sentences, repeats)
    steps = int(max(outputs["length"]))
    per_type = collections.defaultdict(float)
    executions = collections.Counter()
    intervals = []
    for device in metadata.step_stats.dev_stats:
        if "/device:CPU" not in device.device or "stream" in device.device:
            continue
        for node in device.node_stats:
            start = node.all_start_micros
            duration = node.all_end_rel_micros
            op = node.timeline_label.split("=")[-1].split("(")[0].strip() or node.node_name
            op = node.node_name.split(":")[-1] if not op else op
            per_type[op] += duration
            executions[op] += 1
            intervals.append((start, start + duration))
    intervals.sort()
    busy, current_start, current_end = 0, None, None
    for start, end in intervals:
        if current_end is None or start > current_end:
            if current_end is not None:
                busy += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        busy += current_end - current_start
    op_total = sum(per_type.values())
    span = (intervals[-1][1] - intervals[0][0]) if intervals else 0
    print(f"\n## (b) step stats, {title}: {steps} steps, wall {1000 * wall:.0f} ms "
          f"({1000 * wall / steps:.2f} ms/step, traced)")
    print(f"  sum of op times {op_total / 1000:.0f} ms ({op_total / 1000 / steps:.2f} ms/step); "
          f"op intervals cover {busy / 1000:.0f} ms of the {span / 1000:.0f} ms traced span; "
          f"outside ops {(span - busy) / 1000:.0f} ms "
          f"({100 * (span - busy) / max(span, 1):.0f}%)")
    print(f"  {'op type':28s} {'ms':>8s} {'%':>5s} {'runs/step':>9s} {'us/run':>7s}")
    for op, micros in sorted(per_type.items(), key=lambda item: -item[1])[:25]:
        print(f"  {op:28s} {micros / 1000:8.1f} {100 * micros / op_total:5.1f} "
              f"{executions[op] / steps:9.1f} {micros / executions[op]:7.1f}")


def export(args, work_dir, model, source_tokenizer, target_tokenizer):
    """Exports the beam-4 Translator (and greedy_uncached with --uncached)."""
    import contextlib
    import shutil

    import tensorflow as tf

    from keras_transformer.export import DecodingConfig, Translator, export_translator

    paths, translators = {}, {}
    searches = [("beam", dict(search="beam", beam_size=args.beam_size))]
    if args.uncached:
        searches.append(("greedy_uncached", dict(search="greedy_uncached")))
    for name, settings in searches:
        if args.jit:  # XLA for one sentence's beam at least
            settings = dict(settings, jit_compile=True,
                            jit_max_rows=max(DecodingConfig().jit_max_rows, args.beam_size))
        config = DecodingConfig.for_export(
            max_output_length=args.max_output_length,
            extra_length=args.max_output_length,
            **settings,
        )
        translator = Translator(model, source_tokenizer, target_tokenizer, config)
        base = work_dir / args.name / name
        shutil.rmtree(base, ignore_errors=True)
        with (tf.experimental.function_executor_type(args.executor_type)
              if args.executor_type else contextlib.nullcontext()):
            paths[name] = export_translator(translator, base, version=1)
        translators[name] = translator
    return paths, translators


def time_exports(exports, batches, repeats):
    """Median ms per step of every (export, signature, batch), alternating exports."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    loaded = {name: tf.saved_model.load(str(path)) for name, path in exports.items()}
    times = collections.defaultdict(list)
    for signature, (batch_name, batch) in itertools.product(SIGNATURES, batches.items()):
        text = tf.constant(batch)
        for name, model in loaded.items():
            model.signatures[signature](text=text)  # warm-up
        for _ in range(repeats):
            for name, model in loaded.items():
                started = time.perf_counter()
                outputs = model.signatures[signature](text=text)
                seconds = time.perf_counter() - started
                steps = int(tf.reduce_max(outputs["length"]))
                times[(signature, batch_name, name)].append(1000 * seconds / steps)
    return times


def print_times(times, names, batches):
    print("\n## (c) ms per decoding step (SavedModel, median of alternating repetitions; "
          "spread = (max - min) / median)")
    header = "".join(f"{name:>22s}" for name in names)
    ratios = "".join(f"{name[:6] + '/' + names[0][:6]:>14s}" for name in names[1:])
    print(f"  {'signature':18s}{'batch':>7s}{header}{ratios}")
    for signature, batch_name in itertools.product(SIGNATURES, batches):
        cells, medians = "", []
        for name in names:
            values = times[(signature, batch_name, name)]
            median = statistics.median(values)
            medians.append(median)
            spread = (max(values) - min(values)) / median
            cells += f"{median:12.2f} ±{100 * spread:5.0f}%  "
        ratio_cells = "".join(f"{m / medians[0]:14.3f}" for m in medians[1:])
        print(f"  {signature:18s}{batch_name:>7s}{cells}{ratio_cells}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", help="a training run directory (default: random weights)")
    parser.add_argument("--checkpoint", default="best")
    parser.add_argument("--work-dir", default="/tmp/profile_decoder",
                        help="tokenizer cache and exports")
    parser.add_argument("--name", default="current", help="this code's export name")
    parser.add_argument("--compare", nargs="*", default=[],
                        help="earlier exports (--work-dir/NAME) to time side by side")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--max-output-length", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per variant")
    parser.add_argument("--trace-repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jit", action="store_true", help="export with jit_compile (XLA)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="what the export computes in (`export --dtype`)")
    parser.add_argument("--uncached", action="store_true",
                        help="also time uncached greedy against cached greedy")
    parser.add_argument("--skip-profile", action="store_true", help="no step stats")
    parser.add_argument("--intra-op-threads", type=int, default=0,
                        help="TensorFlow intra-op threads (0 = TensorFlow's default)")
    parser.add_argument("--inter-op-threads", type=int, default=0,
                        help="TensorFlow inter-op threads (0 = TensorFlow's default)")
    parser.add_argument("--executor-type", default="",
                        help="trace the export under this function executor "
                             "(SINGLE_THREADED_EXECUTOR; default: TensorFlow's)")
    args = parser.parse_args(argv)
    import tensorflow as tf

    # Process-wide and fixed once TensorFlow starts: compare thread settings across runs.
    tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)
    work_dir = pathlib.Path(args.work_dir)

    from keras_transformer.data import multi30k_lines

    sources = multi30k_lines("test_2016", "en", args.batch_size)
    batches = {str(args.batch_size): sources, "1": sources[:1]}
    model, source_tokenizer, target_tokenizer = reference_parts(args, work_dir)
    if args.dtype != "float32":
        from keras_transformer.model import with_dtype_policy

        model = with_dtype_policy(model, args.dtype)
    paths, translators = export(args, work_dir, model, source_tokenizer, target_tokenizer)
    beam = translators["beam"]
    print(f"# profile_decoder: export {paths['beam']}")
    print_op_counts(f"beam {args.beam_size}", step_ops(beam.translate.get_concrete_function()))
    print_op_counts("greedy", step_ops(beam.translate_greedy.get_concrete_function()))
    if not args.skip_profile:
        for signature, (batch_name, batch) in itertools.product(SIGNATURES, batches.items()):
            print_session_profile(f"{signature}, batch {batch_name}", paths["beam"], signature,
                                  batch, args.trace_repeats)
    exports = {args.name: paths["beam"]}
    for other in args.compare:
        exports[pathlib.Path(other).name] = pathlib.Path(other) / "beam" / "1"
    times = time_exports(exports, batches, args.repeats)
    print_times(times, list(exports), batches)
    if args.uncached:
        import tensorflow as tf

        uncached = tf.saved_model.load(str(paths["greedy_uncached"])).signatures["translate"]
        cached = tf.saved_model.load(str(paths["beam"])).signatures["translate_greedy"]
        text = tf.constant(sources)
        uncached(text=text), cached(text=text)
        pairs = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            cached(text=text)
            middle = time.perf_counter()
            uncached(text=text)
            pairs.append((middle - started, time.perf_counter() - middle))
        ratio = statistics.median(u / c for c, u in pairs)
        cached_ms = 1000 * statistics.median(c for c, _ in pairs)
        uncached_ms = 1000 * statistics.median(u for _, u in pairs)
        print(f"\n## cached greedy vs uncached greedy, batch {args.batch_size}, "
              f"{args.max_output_length} steps: cached {cached_ms:.0f} ms, "
              f"uncached {uncached_ms:.0f} ms, "
              f"speed-up {ratio:.1f}x (median of per-pair ratios)")


if __name__ == "__main__":
    main()

"""Thread settings of the exported SavedModel: sentences/s per (intra-op, inter-op) pair.

Exports a run's checkpoint once (beam `--beam-size` as `translate`, plus `translate_greedy`),
then, for every thread setting, starts a fresh process (TensorFlow fixes its thread pools at
start-up) that loads the SavedModel with `tf.saved_model.load`, as a server would, and times
both signatures on the first `--limit` test_2016 sentences in batches of `--batch-size`
(input order) and one sentence at a time. The settings are what TF Serving's
`--tensorflow_intra_op_parallelism` and `--tensorflow_inter_op_parallelism` set.
`--callers 2` also times the batches shared among 2 threads calling the signature at once,
as TF Serving's `num_batch_threads: 2` runs two batches together. `--onednn on,off` times
every setting with TensorFlow's oneDNN kernels on and off (`TF_ENABLE_ONEDNN_OPTS`, which a
TF Serving process reads from its environment too).

    .venv/bin/python benchmarks/decode_threads.py runs/multi30k --checkpoint averaged \
        --settings 1x1,2x1,1x2,2x2 --callers 2

Run it alone on a quiet machine.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Time the export under the CPU allocator TF Serving runs by default (TensorFlow's), not the
# BFC allocator that importing keras_transformer selects for training (README, "Training");
# TF_CPU_ALLOCATOR_USE_BFC=true in the environment times BFC instead.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", nargs="?", help="training run directory")
    parser.add_argument("--checkpoint", default="best")
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--settings", default="1x1,2x1,1x2,2x2",
                        help="comma-separated INTRAxINTER thread pairs")
    parser.add_argument("--limit", type=int, default=320, help="first N test sentences")
    parser.add_argument("--latency-sentences", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--callers", type=int, default=1,
                        help="also time N threads calling the signature concurrently")
    parser.add_argument("--onednn", default="default",
                        help="comma-separated TF_ENABLE_ONEDNN_OPTS modes to time: on, off, "
                             "default (the environment's)")
    # Internal: one timing process.
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--sources", help=argparse.SUPPRESS)
    parser.add_argument("--threads", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def parse_settings(text):
    """`"2x1,1x1"` -> `[(2, 1), (1, 1)]`, with a clear error on anything else.

    >>> parse_settings("2x1, 1x2")
    [(2, 1), (1, 2)]
    """
    settings = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise SystemExit(f"--settings: expected INTRAxINTER with positive integers, got "
                             f"{item.strip()!r}")
        settings.append((int(parts[0]), int(parts[1])))
    return settings


ONEDNN_MODES = {"on": "1", "off": "0", "default": None}


def parse_onednn(text):
    """`"on,off"` -> `["on", "off"]`, with a clear error on anything else.

    >>> parse_onednn("off, on")
    ['off', 'on']
    """
    modes = [item.strip().lower() for item in text.split(",")]
    for mode in modes:
        if mode not in ONEDNN_MODES:
            raise SystemExit(f"--onednn: expected on, off or default, got {mode!r}")
    return modes


def _measure(args):
    """In a fresh process: time both signatures under one thread setting; print JSON."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops the graph uses)

    intra, inter = (int(n) for n in args.threads.split("x"))
    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    with open(args.sources, encoding="utf-8") as f:
        sources = json.load(f)
    loaded = tf.saved_model.load(args.measure)
    batches = [sources[start:start + args.batch_size]
               for start in range(0, len(sources), args.batch_size)]

    def run(translate, callers):
        """Sentences/s with the batches shared round-robin among `callers` threads."""
        def call_batches(index):
            for batch in batches[index::callers]:
                translate(text=tf.constant(batch))
        threads = [threading.Thread(target=call_batches, args=(i,)) for i in range(callers)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return len(sources) / (time.perf_counter() - started)

    figures = {}
    for signature in ("translate", "translate_greedy"):
        translate = loaded.signatures[signature]
        translate(text=tf.constant(batches[0]))  # warm-up
        rate = run(translate, 1)
        concurrent = run(translate, args.callers) if args.callers > 1 else None
        latencies = []
        for sentence in sources[: args.latency_sentences]:
            started = time.perf_counter()
            translate(text=tf.constant([sentence]))
            latencies.append(time.perf_counter() - started)
        figures[signature] = (rate, statistics.median(latencies), concurrent)
    from tensorflow.python.util import _pywrap_util_port  # no public API says it

    print("RESULT " + json.dumps(figures), flush=True)
    print("ONEDNN " + json.dumps(bool(_pywrap_util_port.IsMklEnabled())), flush=True)


def main(argv=None):
    args = _parse_args(argv)
    if args.measure:
        _measure(args)
        return 0
    if not args.run_dir:
        raise SystemExit("decode_threads.py: give a training run directory")
    settings = parse_settings(args.settings)
    modes = parse_onednn(args.onednn)

    from keras_transformer.data import load_multi30k
    from keras_transformer.export import DecodingConfig, Translator, export_translator, load_run

    model, source_tokenizer, target_tokenizer, _ = load_run(args.run_dir, args.checkpoint)
    sources = [example["en"].decode("utf-8")
               for example in load_multi30k("test_2016").as_numpy_iterator()][: args.limit]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        config = DecodingConfig.for_export(search="beam", beam_size=args.beam_size,
                                           alpha=args.alpha)
        export_dir = export_translator(
            Translator(model, source_tokenizer, target_tokenizer, config),
            os.path.join(tmp, "export"))
        sources_file = os.path.join(tmp, "sources.json")
        with open(sources_file, "w", encoding="utf-8") as f:
            json.dump(sources, f)
        for (intra, inter), mode in [(s, m) for s in settings for m in modes]:
            command = [sys.executable, os.path.abspath(__file__), "--measure", str(export_dir),
                       "--sources", sources_file, "--threads", f"{intra}x{inter}",
                       "--batch-size", str(args.batch_size), "--callers", str(args.callers),
                       "--latency-sentences", str(args.latency_sentences)]
            env = dict(os.environ)
            if ONEDNN_MODES[mode] is not None:
                env["TF_ENABLE_ONEDNN_OPTS"] = ONEDNN_MODES[mode]
            output = subprocess.run(command, check=True, capture_output=True, text=True,
                                    env=env).stdout
            figures = json.loads(output.split("RESULT ", 1)[1].split("\n", 1)[0])
            enabled = json.loads(output.split("ONEDNN ", 1)[1].split("\n", 1)[0])
            if mode != "default" and enabled != (mode == "on"):
                raise SystemExit(f"--onednn {mode}: TensorFlow reports oneDNN "
                                 f"{'on' if enabled else 'off'}")
            mode = "on" if enabled else "off"
            rows.append(((intra, inter), mode, figures))
            print(f"intra {intra}, inter {inter}, oneDNN {mode}: " + ", ".join(
                f"{name} {rate:.1f} sent/s, {1000 * median:.0f} ms median at batch 1"
                for name, (rate, median, _) in figures.items()), flush=True)

    print(f"\n{len(sources)} test_2016 sentences, batch {args.batch_size}, beam "
          f"{args.beam_size}")
    extra = (f" beam sent/s, {args.callers} callers | greedy sent/s, {args.callers} callers |"
             if args.callers > 1 else "")
    print(f"| intra-op | inter-op | oneDNN | beam {args.beam_size} sent/s | beam latency (ms) | "
          f"greedy sent/s | greedy latency (ms) |{extra}")
    print("|---|---|---|---|---|---|---|" + ("---|---|" if extra else ""))
    for (intra, inter), mode, figures in rows:
        (beam, beam_median, beam_both), (greedy, greedy_median, greedy_both) = (
            figures["translate"], figures["translate_greedy"])
        concurrent = f" {beam_both:.1f} | {greedy_both:.1f} |" if extra else ""
        print(f"| {intra} | {inter} | {mode} | {beam:.1f} | {1000 * beam_median:.0f} | {greedy:.1f} | "
              f"{1000 * greedy_median:.0f} |{concurrent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Two exports side by side: sentences/s of each signature, alternating, and whether they agree.

For a change to the decoding code that should not change a translation: export the model
with the code before and after (`keras-transformer export`), then

    PYTHONPATH=$PWD .venv/bin/python benchmarks/compare_exports.py BEFORE AFTER

translates the same sentences (default: Multi30K test_2016, English) in batches in input
order, as TF Serving receives them, with each export in turn (A B A B ...) so that a host
whose speed drifts slows both alike, and prints per signature the median sentences/s of
each, the ratio B / A, the spread of the repetitions, and how many translations differ.
Only `tensorflow` and `tensorflow_text` run the exports (like the model server).
"""

import argparse
import functools
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# TensorFlow's own CPU allocator, the one TF Serving runs (as decode_vs_ctranslate2.py).
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "false")


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("export_a", help="SavedModel directory or base directory of versions")
    parser.add_argument("export_b", help="the other export")
    parser.add_argument("--sources", help="text file (or .gz) of sentences, one per line "
                        "(default: Multi30K test_2016, English)")
    parser.add_argument("--data-dir", help="raw Multi30K directory for the default sentences")
    parser.add_argument("--limit", type=int, help="only the first N sentences")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per export")
    parser.add_argument("--signatures", default="translate,translate_greedy",
                        help="comma-separated signatures to compare")
    parser.add_argument("--threads", type=int, default=1, help="TensorFlow intra-op threads")
    parser.add_argument("--inter-threads", type=int, default=2,
                        help="TensorFlow inter-op threads")
    args = parser.parse_args(argv)
    if args.batch_size < 1 or args.repeats < 1:
        parser.error("--batch-size and --repeats must be at least 1.")
    return args


def read_sources(path, data_dir=None, limit=None):
    """The sentences to translate: `path`'s lines, or Multi30K test_2016's English side."""
    if path is None:
        from keras_transformer.data import multi30k_lines

        sentences = multi30k_lines("test_2016", "en", limit or None, local_dir=data_dir)
    else:
        from keras_transformer.data.readers import iter_lines

        sentences = list(iter_lines(path))
        sentences = sentences[:limit] if limit else sentences
    if not sentences:
        raise SystemExit(f"No sentences to translate in {path or 'test_2016'}.")
    return sentences


def spread(values):
    """(max - min) / median."""
    return (max(values) - min(values)) / statistics.median(values)


def _translations(signature, batch):
    """A signature's translations (bytes) of a list of sentences."""
    return signature(text=batch)["translation"].numpy().tolist()


def compare(functions, batches, repeats):
    """Times each function over all batches, alternating; `(seconds per pass, outputs)`.

    Args:
        functions: two callables, list of str -> list of translations (bytes).
        batches: list of lists of str.
        repeats: int, timed passes per function.

    Returns:
        `(times, outputs)`: per function a list of `repeats` seconds and its translations
        of the last pass.
    """
    for function in functions:  # warm-up: the first call of a shape allocates
        function(batches[0])
    times, outputs = [[] for _ in functions], [None for _ in functions]
    for _ in range(repeats):
        for i, function in enumerate(functions):
            start = time.perf_counter()
            result = [translation for batch in batches for translation in function(batch)]
            times[i].append(time.perf_counter() - start)
            outputs[i] = result
    return times, outputs


def main(argv=None):
    args = _parse_args(argv)
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the SentencePiece ops of the exported graph)

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.inter_threads)
    from keras_transformer.export.saved_model import latest_version_dir

    paths = [latest_version_dir(path) for path in (args.export_a, args.export_b)]
    loaded = [tf.saved_model.load(str(path)) for path in paths]
    sentences = read_sources(args.sources, args.data_dir, args.limit)
    batches = [sentences[i:i + args.batch_size]
               for i in range(0, len(sentences), args.batch_size)]
    print(f"A: {paths[0]}\nB: {paths[1]}\n{len(sentences)} sentences in batches of "
          f"{args.batch_size} (input order), {args.threads} intra-op thread(s), "
          f"{args.inter_threads} inter-op, {args.repeats} alternating passes each")
    print("\n| signature | A sent/s | B sent/s | B / A | spread A | spread B | "
          "translations that differ |")
    print("|---|---|---|---|---|---|---|")
    for name in args.signatures.split(","):
        missing = [str(path) for path, model in zip(paths, loaded)
                   if name not in model.signatures]
        if missing:
            raise SystemExit(f"No signature {name!r} in {', '.join(missing)}.")

        functions = [functools.partial(_translations, model.signatures[name])
                     for model in loaded]
        times, outputs = compare(functions, batches, args.repeats)
        rates = [len(sentences) / statistics.median(seconds) for seconds in times]
        differ = sum(a != b for a, b in zip(*outputs))
        print(f"| {name} | {rates[0]:.1f} | {rates[1]:.1f} | {rates[1] / rates[0]:.3f} | "
              f"{spread(times[0]):.0%} | {spread(times[1]):.0%} | {differ} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

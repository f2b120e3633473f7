"""How much of a translation call is the encoder, with and without its padding.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/encoder_share.py RUN_DIR --checkpoint last

Translates test_2016 (or --sources) in batches of --batch-size, once in input order (as TF
Serving receives requests) and once sorted by length (as `keras-transformer translate` and
`evaluate` batch), with the code an export runs, and prints per order the share of source
positions that are padding and the seconds of: tokenization alone; tokenization and the
encoder with its memory keys/values (`TransformerParts.encode`, every position, and
`encode_packed`, the real tokens only, which exports use); the whole greedy and beam-4
calls. Each timed pass goes over every batch; the best of --repeats passes is printed,
the variants alternating. One intra-op thread, one inter-op thread.
"""

import argparse
import itertools
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a training run directory")
    parser.add_argument("--checkpoint", default="last")
    parser.add_argument("--sources", default=None,
                        help="text file (or .gz) of source sentences, one per line "
                        "(default: test_2016's English side, from the local Multi30K copy)")
    parser.add_argument("--limit", type=int, help="only the first N sentences")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--alpha", type=float, default=1.4, help="beam length penalty")
    return parser.parse_args(argv)


def _read(path, limit):
    """`path`'s lines, or test_2016's English side (Multi30K, found as the package finds
    it: `KERAS_TRANSFORMER_MULTI30K_DIR` or `shared/data/multi30k`)."""
    from keras_transformer.data import multi30k_lines
    from keras_transformer.data.readers import iter_lines

    limit = limit or None  # 0: every line
    if path is None:
        return multi30k_lines("test_2016", "en", limit)
    return [line.strip() for line in itertools.islice(iter_lines(path), limit)]


def _functions(run, checkpoint, alpha):
    """`{name: tf.function(text) -> tensor}` and the tokenizing function."""
    import tensorflow as tf

    from keras_transformer.export import DecodingConfig, Translator
    from keras_transformer.export.run import load_run

    model, source_tokenizer, target_tokenizer, _ = load_run(run, checkpoint)
    translators = {
        "greedy": Translator(model, source_tokenizer, target_tokenizer,
                             DecodingConfig.for_export(search="greedy")),
        "beam": Translator(model, source_tokenizer, target_tokenizer,
                           DecodingConfig.for_export(search="beam", beam_size=4, alpha=alpha)),
    }
    translator = translators["greedy"]
    parts, max_input = translator._parts, translator.config.max_input_length
    spec = [tf.TensorSpec([None], tf.string)]

    def tokens(text):
        return translator.source_tokenizer.tokenize(
            text, max_length=max_input, add_end=True).to_tensor(0)

    def encoded(encode):
        def function(text):
            state = parts.memory_state(*encode(tokens(text)))
            return tf.nest.flatten(state)[-1]
        return function

    functions = {
        "tokenize": lambda text: tokens(text),
        "tokenize + encoder + memory keys/values, every position": encoded(parts.encode),
        "tokenize + encoder + memory keys/values, real tokens only": encoded(
            parts.encode_packed),
        "greedy call (as exported)": lambda text: translators["greedy"]._translate(
            text, "greedy")["length"],
        "beam-4 call (as exported)": lambda text: translators["beam"]._translate(
            text, "beam")["length"],
    }
    return ({name: tf.function(function, input_signature=spec)
             for name, function in functions.items()}, tf.function(tokens, input_signature=spec))


def main(argv=None):
    args = _parse_args(argv)
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 (the SentencePiece ops)

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    sentences = _read(args.sources, args.limit)
    functions, tokens = _functions(args.run, args.checkpoint, args.alpha)
    print(f"{len(sentences)} sentences in batches of {args.batch_size}, 1 thread, best of "
          f"{args.repeats} alternating passes")
    for order in ("input order", "sorted by length"):
        ordered = sentences if order == "input order" else sorted(sentences, key=len)
        batches = [tf.constant(ordered[start:start + args.batch_size])
                   for start in range(0, len(ordered), args.batch_size)]
        ids = [tokens(batch) for batch in batches]
        padding = sum(int(tf.reduce_sum(tf.cast(t == 0, tf.int32))) for t in ids) / sum(
            int(tf.size(t)) for t in ids)
        for function in functions.values():
            function(batches[0])  # traced, untimed
        best = {}
        for _ in range(args.repeats):
            for name, function in functions.items():
                started = time.perf_counter()
                for batch in batches:
                    function(batch)
                seconds = time.perf_counter() - started
                best[name] = min(best.get(name, seconds), seconds)
        print(f"\n{order}: {100 * padding:.1f}% of the source positions are padding\n")
        print("| part | seconds | share of the greedy call | share of the beam call |")
        print("|---|---|---|---|")
        greedy, beam = best["greedy call (as exported)"], best["beam-4 call (as exported)"]
        for name, seconds in best.items():
            print(f"| {name} | {seconds:.2f} | {100 * seconds / greedy:.1f}% | "
                  f"{100 * seconds / beam:.1f}% |")


if __name__ == "__main__":
    main()

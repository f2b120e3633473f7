"""What one oversized sentence costs an export's `translate`: milliseconds per call.

Loads each SavedModel given (a version directory or a base directory of versions) with
`tf.saved_model.load`, as a server would, and times its `translate` signature on one
sentence of about 8 KiB (the byte cap of an export with the default `--max-input-length`
128: 64 bytes a piece) and one of about 5 MB, the best of `--repeats` calls after a warm-up
call. Give two exports of the same model, made before and after a change, to compare them
side by side in one run.

    .venv/bin/python benchmarks/oversized_input.py OLD_EXPORT/1 NEW_EXPORT/1

Run it alone on a quiet machine.
"""

import argparse
import time

SENTENCE = "A dog runs. "
SIZES = {"8 KiB": 683, "5 MB": 437_000}  # repetitions of SENTENCE (12 bytes)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("exports", nargs="+", help="SavedModel version or base directories")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls (default 3)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be 1 or more, got {args.repeats}")

    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    from keras_transformer.export import latest_version_dir

    for export in args.exports:
        path = latest_version_dir(export)
        translate = tf.saved_model.load(str(path)).signatures["translate"]
        translate(text=tf.constant(["A warm-up call."]))
        for label, repeats in SIZES.items():
            text = tf.constant([SENTENCE * repeats])
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                outputs = translate(text=text)
                times.append(time.perf_counter() - start)
            print(f"{path}  {label:>5}: {min(times) * 1000:7.0f} ms  "
                  f"truncated={bool(outputs['truncated'].numpy()[0])}", flush=True)


if __name__ == "__main__":
    main()

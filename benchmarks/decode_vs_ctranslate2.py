"""Our exported SavedModel against CTranslate2 on the same weights, side by side in one process.

    .venv/bin/python benchmarks/decode_vs_ctranslate2.py runs/multi30k [--limit N]

1. Exports the run's checkpoint as a SavedModel (beam `--beam-size`, plus its
   `translate_greedy` signature) and converts the same weights into a CTranslate2 model
   (`keras_transformer.export.ctranslate2_converter`; needs `pip install -e .[bench]`).
2. Conversion check: the greedy translations of both engines must be the same for at least
   `--min-same` of the sentences (90%) and reach the same BLEU (within `--bleu-tolerance`);
   the script stops otherwise, since timing two different models says nothing.
3. Times both engines on the run's own test set (`--split`; the first test set of the data
   it was trained on, in its direction, as `keras-transformer evaluate` reads it: test_2016
   for the `multi30k` presets): beam and greedy, batches of `--batch-size` (sentences/s over the whole set) and batch 1 (sentences/s and median latency
   over the first `--latency-sentences`), each engine warmed up first. Both engines get the
   same batches in input order, the same number of threads, raw text in and text out
   (CTranslate2's time includes SentencePiece in Python, ours the in-graph tokenizer), at
   most `--max-output-length` output tokens. BLEU is tokenized for the run's target
   language, as `evaluate` does. A run with separate source and target vocabularies is
   refused (the CTranslate2 engine here tokenizes both sides with one SentencePiece model).
4. Prints a Markdown table: sentences/s, BLEU, how many translations are those of the
   default export (of the bfloat16 export for bfloat16 + XLA), and the ratio ours /
   CTranslate2. Exports that only change how the search runs (dropping finished sentences,
   the cache's layout, XLA) must give every translation of the one they are compared with.
   CTranslate2's greedy translations must be ours too (it is given `min_decoding_length=0`,
   as our searches may end a translation at once, and `disable_unk=True`, as our export).
   Its beam search divides a score by `length ** alpha` where our default export divides by
   GNMT's `((5 + length) / 6) ** alpha`, so beam translations differ unless
   `--length-penalty-form power` exports ours with CTranslate2's penalty. (Our export also
   bounds a translation at its source's length plus `extra_length`, 50: Multi30K's
   sentences do not reach it. A model whose translations do not end, an undertrained one,
   is stopped there by ours and at `--max-output-length` by CTranslate2, and fails the
   conversion check: a `--max-output-length` below its sources' length + 50 bounds both
   alike.)

`--threads 1 --inter-threads 2 --callers 2` times a server's setting on a 2-core machine: two
batches at once (TF Serving's `num_batch_threads: 2`), one thread each. Both engines get it:
TensorFlow's inter-op pool and CTranslate2's `inter_threads` (batches run in parallel) are
`--inter-threads`, and `--callers` threads call each engine at the same time.

`--compare-keep-finished` also exports the same weights with `drop_finished=False` (finished
sentences stay in the batch, as before that option existed) and times it in the same run (at
batch 1 the two exports run the same steps, less the per-step check for sentences to drop).

`--compare-growing-cache` also exports the same weights with `in_place_cache="none"` (beam
search's keys/values grown by concatenation, as before the time-major in-place cache; `export
--growing-cache`) and `--in-place-greedy` exports greedy search with the in-place cache too
(`in_place_cache="all"`); each is timed beside the others, batch 1 included.

`--compare-jit` also exports the same weights with `jit_compile=True` (`export --jit`: XLA
compiles the encoder and the search loop for batches of at most `jit_max_rows` decoder rows,
finished sentences staying in the batch and the decoder cache of a fixed size; larger batches
take the regular search) and times it beside the others. XLA compiles once per (batch size,
source width) pair, so that engine first translates every batch once untimed: the timed pass
is a warm server's. With `--compare-bf16` as well, the bfloat16 export is also timed with XLA.

Run it alone on a quiet machine for figures worth recording (benchmarks/RESULTS.md).
"""

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Time the export under the CPU allocator TF Serving runs by default (TensorFlow's), not the
# BFC allocator that importing keras_transformer selects for training (README, "Training");
# TF_CPU_ALLOCATOR_USE_BFC=true in the environment times BFC instead.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "false")

# The searches compared: (name, our signature, CTranslate2 beam size from the arguments).
SEARCHES = ("beam", "greedy")


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", help="training run directory")
    parser.add_argument("--checkpoint", default="best",
                        choices=("best", "final", "last", "averaged"))
    parser.add_argument("--split", default="test",
                        help="the run's split to translate (default: its first test set)")
    parser.add_argument("--limit", type=int, help="only the first N test sentences")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--latency-sentences", type=int, default=100)
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty strength")
    parser.add_argument("--length-penalty-form", default="gnmt", choices=("gnmt", "power"),
                        help="our export's length penalty (`export --length-penalty-form`): "
                        "gnmt, the default, or power, CTranslate2's: then both engines run the "
                        "same beam search (for alpha != 0)")
    parser.add_argument("--max-output-length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="intra-op threads of both engines (default: all cores)")
    parser.add_argument("--inter-threads", type=int, default=1,
                        help="TensorFlow inter-op threads and CTranslate2 inter_threads")
    parser.add_argument("--callers", type=int, default=1,
                        help="threads calling an engine at once in the batch throughput runs")
    parser.add_argument("--quantization", default=None,
                        help="CTranslate2 weight type, e.g. int8 (default: float32)")
    parser.add_argument("--bleu-tolerance", type=float, default=0.5,
                        help="largest greedy BLEU difference accepted by the conversion check")
    parser.add_argument("--min-same", type=float, default=0.9,
                        help="smallest share of equal greedy translations accepted by the "
                        "conversion check (default 0.9)")
    parser.add_argument("--data-dir", help="raw Multi30K directory (see `keras-transformer`)")
    parser.add_argument("--tfds-dir", help="TFDS data directory of a tfds:NAME run")
    parser.add_argument("--compare-exact-stopping", action="store_true",
                        help="also time an export whose beam search stops only when no alive "
                             "hypothesis can win (`export --beam-stopping exact`; the default "
                             "stops once beam-size hypotheses have finished, as CTranslate2)")
    parser.add_argument("--compare-keep-finished", action="store_true",
                        help="also time an export that keeps finished sentences in the batch")
    parser.add_argument("--in-place-greedy", action="store_true",
                        help="our export's greedy search writes its cache in place too "
                             "(`in_place_cache='all'`; default: beam search only)")
    parser.add_argument("--compare-growing-cache", action="store_true",
                        help="also time an export whose decoder cache grows by concatenation "
                             "(`export --growing-cache`)")
    parser.add_argument("--compare-bf16", action="store_true",
                        help="also time an export computing in bfloat16 (`export --dtype "
                             "bfloat16`; fast only on CPUs with AVX-512 BF16 or AMX)")
    parser.add_argument("--compare-jit", action="store_true",
                        help="also time the XLA-compiled export (`export --jit`), warmed up "
                             "on every batch shape first (with --compare-bf16, the bfloat16 "
                             "export too)")
    return parser.parse_args(argv)


class OurEngine:
    """The exported SavedModel's signatures, called on raw text."""

    def __init__(self, export_dir, name="SavedModel", warm_every_batch=False, reference=None):
        from keras_transformer.export import ExportedTranslator

        self.name = name
        # The engine whose translations this one's are counted against (None: none).
        self.reference = reference
        # XLA compiles per input shape: translate every batch once before timing.
        self.warm_every_batch = warm_every_batch
        self._translators = {
            "beam": ExportedTranslator(export_dir, signature="translate"),
            "greedy": ExportedTranslator(export_dir, signature="translate_greedy"),
        }

    def translate(self, sentences, search):
        # sort_buffer_batches=1: the batch as given, as CTranslate2 gets it.
        results = self._translators[search].translate(sentences, batch_size=len(sentences),
                                                      sort_buffer_batches=1)
        return [r["translation"] for r in results]


class CTranslate2Engine:
    """A converted CTranslate2 model with SentencePiece in Python around it."""

    name = "CTranslate2"
    warm_every_batch = False  # nothing compiles per shape
    reference = None  # set by `main`: our default export

    def __init__(self, model_dir, tokenizer_model, threads, beam_size, alpha, max_length,
                 max_input_length, inter_threads=1):
        import ctranslate2
        import sentencepiece

        self._translator = ctranslate2.Translator(
            str(model_dir), device="cpu", inter_threads=inter_threads, intra_threads=threads)
        self._sentencepiece = sentencepiece.SentencePieceProcessor(model_file=tokenizer_model)
        self._options = {
            "beam": dict(beam_size=beam_size, length_penalty=alpha),
            "greedy": dict(beam_size=1),
        }
        # min_decoding_length=0: END may come first, as in our searches (CTranslate2's Python
        # default, 1, forbids an empty translation); UNK never produced, as by our export.
        self._common = dict(max_decoding_length=max_length, max_input_length=max_input_length,
                            min_decoding_length=0, disable_unk=True)

    def pieces(self, sentences):
        return self._sentencepiece.encode(list(sentences), out_type=str)

    def translate(self, sentences, search):
        pieces = self.pieces(sentences)
        results = self._translator.translate_batch(
            pieces, **self._options[search], **self._common)
        return [self._sentencepiece.decode(r.hypotheses[0]) for r in results]


def _throughput(engine, search, sources, batch_size, callers=1):
    """Sentences/s and translations; the batches shared round-robin among `callers` threads."""
    starts = list(range(0, len(sources), batch_size))
    # Warm-up: first-call costs (and XLA's compilations) not timed.
    for start in starts if engine.warm_every_batch else starts[:1]:
        engine.translate(sources[start:start + batch_size], search)
    outputs = {}

    def call_batches(index):
        for start in starts[index::callers]:
            outputs[start] = engine.translate(sources[start:start + batch_size], search)

    threads = [threading.Thread(target=call_batches, args=(i,)) for i in range(callers)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rate = len(sources) / (time.perf_counter() - started)
    return rate, [text for start in starts for text in outputs[start]]


def _latency(engine, search, sources):
    for sentence in sources if engine.warm_every_batch else sources[:1]:
        engine.translate([sentence], search)
    latencies = []
    for sentence in sources:
        started = time.perf_counter()
        engine.translate([sentence], search)
        latencies.append(time.perf_counter() - started)
    return len(latencies) / sum(latencies), statistics.median(latencies)


def finished_row_share(lengths, batch_size, sort=False):
    """Share of a batched greedy search's row-steps spent on sentences already finished.

    A batch runs until its longest output ends; a row of output length `n` in a batch whose
    longest is `m` costs `m - n` steps of wasted work (CTranslate2 drops finished rows).

    >>> finished_row_share([2, 4, 4, 2], batch_size=2)
    0.25
    >>> finished_row_share([2, 4, 4, 2], batch_size=2, sort=True)
    0.0
    """
    lengths = sorted(lengths) if sort else list(lengths)
    spent = useful = 0
    for start in range(0, len(lengths), batch_size):
        batch = lengths[start:start + batch_size]
        spent += max(batch) * len(batch)
        useful += sum(batch)
    return 1.0 - useful / spent if spent else 0.0


def _same_as(hypotheses, reference, reference_name):
    """`"SavedModel: 7/9"`: how many of `hypotheses` equal `reference`'s, line by line.

    >>> _same_as(["a", "b", "c"], ["a", "x", "c"], "SavedModel")
    'SavedModel: 2/3'
    """
    equal = sum(h == r for h, r in zip(hypotheses, reference, strict=True))
    return f"{reference_name}: {equal}/{len(reference)}"


def _bleu(hypotheses, references, target_lang):
    from keras_transformer.export import evaluate_translations

    return evaluate_translations(hypotheses, references, target_lang)["bleu"]


def conversion_check(ours, theirs, our_bleu, their_bleu, bleu_tolerance, min_same):
    """Why the two engines' greedy translations (lists of str) and BLEU show another model
    than ours, or `None`: fewer than `min_same` of the translations equal, or BLEU further
    apart than `bleu_tolerance`. Equal BLEU alone is no proof: two models scored near zero
    (a broken conversion, or translations of another language pair) agree on it."""
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    if same < min_same * len(ours):
        return (f"only {same} of {len(ours)} greedy translations are the same, fewer than "
                f"{100 * min_same:g}% (--min-same)")
    if abs(our_bleu - their_bleu) > bleu_tolerance:
        return (f"greedy BLEU differs by more than {bleu_tolerance} (--bleu-tolerance): "
                f"{our_bleu:.2f} against {their_bleu:.2f}")
    return None


def _cpu_allocator():
    """The allocator TensorFlow's CPU device really uses, and why.

    Only a BFC allocator keeps statistics. `TF_CPU_ALLOCATOR_USE_BFC=false` selects
    TensorFlow's system allocator, except where oneDNN is on by default (CPUs with
    AVX-512 VNNI or BF16): its own BFC allocator then serves the CPU device whatever that
    variable says, as it would in a model server built with oneDNN.
    """
    import tensorflow as tf
    from tensorflow.python.util import _pywrap_util_port

    try:
        tf.config.experimental.get_memory_info("CPU:0")
    except ValueError:
        allocator = "system"
    else:
        allocator = "BFC"
    onednn = "on" if _pywrap_util_port.IsMklEnabled() else "off"
    variable = os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "unset")
    return f"{allocator} (TF_CPU_ALLOCATOR_USE_BFC={variable}, oneDNN {onednn})"


def _test_set(run_config, args):
    """`read_split` of the run's own data (SystemExit with its message)."""
    from keras_transformer.export.run import data_spec, read_split

    try:
        return read_split(data_spec(run_config), args.split, local_dir=args.data_dir,
                          tfds_dir=args.tfds_dir, limit=args.limit)
    except (OSError, ValueError) as error:
        raise SystemExit(f"The run's {args.split} split cannot be read: {error}") from None


def main(argv=None):
    args = _parse_args(argv)
    import tensorflow as tf

    # Before TensorFlow's runtime starts: the same thread budget as CTranslate2's.
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.inter_threads)

    from keras_transformer.export import DecodingConfig, Translator, export_translator, load_run
    from keras_transformer.export.ctranslate2_converter import convert

    try:
        model, source_tokenizer, target_tokenizer, run_config = load_run(args.run_dir,
                                                                         args.checkpoint)
    except (OSError, ValueError) as error:
        raise SystemExit(str(error)) from None
    if source_tokenizer is not target_tokenizer:
        raise SystemExit("The benchmark handles shared vocabularies only.")
    sources, references, description, target_lang = _test_set(run_config, args)
    config = DecodingConfig.for_export(
        search="beam", beam_size=args.beam_size, alpha=args.alpha,
        length_penalty_form=args.length_penalty_form,
        max_output_length=args.max_output_length,
        in_place_cache="all" if args.in_place_greedy else "beam")
    with tempfile.TemporaryDirectory() as tmp:
        export_dir = export_translator(
            Translator(model, source_tokenizer, target_tokenizer, config),
            os.path.join(tmp, "export"))
        ct2_dir = convert(model, source_tokenizer, target_tokenizer, os.path.join(tmp, "ct2"),
                          quantization=args.quantization)
        ours = OurEngine(export_dir)

        def variant(flag, name, directory, variant_model=model, warm_every_batch=False,
                    reference=ours, **changes):
            """Our export with other settings (or weights), when its `--compare-*` flag is set."""
            if not flag:
                return None
            return OurEngine(export_translator(
                Translator(variant_model, source_tokenizer, target_tokenizer,
                           dataclasses.replace(config, **changes)),
                os.path.join(tmp, directory)), name=name, warm_every_batch=warm_every_batch,
                reference=reference)

        exact = variant(args.compare_exact_stopping, "SavedModel, exact stopping",
                        "export_exact", early_stopping=False)
        kept = variant(args.compare_keep_finished, "SavedModel, finished kept", "export_kept",
                       drop_finished=False)
        grown = variant(args.compare_growing_cache, "SavedModel, growing cache",
                        "export_grown", in_place_cache="none")
        bf16_model = None
        if args.compare_bf16:
            from keras_transformer.model import with_dtype_policy

            bf16_model = with_dtype_policy(model, "bfloat16")
        bf16 = variant(bf16_model is not None, "SavedModel, bfloat16", "export_bf16",
                       variant_model=bf16_model)
        # XLA for one sentence's beam at least (`export --jit --jit-max-rows`).
        jit_rows = dict(jit_compile=True,
                        jit_max_rows=max(config.jit_max_rows or 0, args.beam_size))
        jit = variant(args.compare_jit, "SavedModel, XLA (--jit)", "export_jit",
                      warm_every_batch=True, **jit_rows)
        bf16_jit = variant(args.compare_jit and bf16_model is not None,
                           "SavedModel, bfloat16 + XLA", "export_bf16_jit",
                           variant_model=bf16_model, warm_every_batch=True, reference=bf16,
                           **jit_rows)
        theirs = CTranslate2Engine(
            ct2_dir, source_tokenizer.model_path, args.threads, args.beam_size, args.alpha,
            args.max_output_length, config.max_input_length, args.inter_threads)
        theirs.reference = ours
        print(f"{len(sources)} sentences of {description}, {args.threads} intra-op thread(s), "
              f"{args.inter_threads} inter-op, {args.callers} caller(s), batch "
              f"{args.batch_size}, CTranslate2 {args.quantization or 'float32'}, TensorFlow "
              f"CPU allocator: {_cpu_allocator()}, our length penalty: {args.length_penalty_form}, "
              f"alpha {args.alpha}", flush=True)

        # Conversion check on greedy output, the search both engines define identically.
        check = {}
        for engine in (ours, theirs):
            _, hypotheses = _throughput(engine, "greedy", sources, args.batch_size)
            check[engine.name] = (_bleu(hypotheses, references, target_lang), hypotheses)
            if engine is ours:
                print(f"first sentence: {sources[0]!r}, ours (greedy): {hypotheses[0]!r}",
                      flush=True)
        # Output lengths in pieces, END included: what a batched greedy search steps over.
        lengths = [len(p) + 1 for p in theirs.pieces(hypotheses)]
        print(f"greedy row-steps spent on finished sentences: "
              f"{100 * finished_row_share(lengths, args.batch_size):.1f}% (batches in input "
              f"order), {100 * finished_row_share(lengths, args.batch_size, sort=True):.1f}% "
              "(sorted by output length: the floor that sorting by source length approaches)",
              flush=True)
        (our_bleu, our_greedy), (their_bleu, their_greedy) = check[ours.name], check[theirs.name]
        print(f"conversion check, greedy BLEU: ours {our_bleu:.2f}, CTranslate2 "
              f"{their_bleu:.2f}; {_same_as(their_greedy, our_greedy, 'same translations')}",
              flush=True)
        failed = conversion_check(our_greedy, their_greedy, our_bleu, their_bleu,
                                  args.bleu_tolerance, args.min_same)
        if failed:
            print(f"Conversion check failed: {failed}.", file=sys.stderr)
            return 1

        rows = []
        latency_sources = sources[: args.latency_sentences]
        for search in SEARCHES:
            figures, outputs = {}, {}
            engines = (ours, exact, grown, kept, bf16, jit, bf16_jit, theirs)
            for engine in [e for e in engines if e is not None]:
                rate, hypotheses = _throughput(engine, search, sources, args.batch_size,
                                               args.callers)
                # Batch 1 too for `kept`: the same steps as `ours`, without the per-step
                # check for finished sentences that can leave (never, with one sentence).
                rate_one, median = _latency(engine, search, latency_sources)
                figures[engine.name] = (rate, _bleu(hypotheses, references, target_lang),
                                        rate_one, median)
                outputs[engine.name] = hypotheses
                print(f"{search} {engine.name}: {rate:.1f} sent/s (batch {args.batch_size}), "
                      f"{rate_one:.1f} sent/s and {1000 * median:.0f} ms median (batch 1), "
                      f"BLEU {figures[engine.name][1]:.2f}", flush=True)
            same = {e.name: _same_as(outputs[e.name], outputs[e.reference.name],
                                     e.reference.name)
                    for e in engines if e is not None and e.reference is not None}
            rows.append((search, figures, same))

    label = {"beam": f"beam {args.beam_size}", "greedy": "greedy"}
    print(f"\n| search | engine | sent/s, batch {args.batch_size} | sent/s, batch 1 | "
          "median latency, batch 1 (ms) | BLEU | same translations as |")
    print("|---|---|---|---|---|---|---|")
    for search, figures, same in rows:
        for name, (rate, bleu, rate_one, median) in figures.items():
            print(f"| {label[search]} | {name} | {rate:.1f} | {rate_one:.1f} | "
                  f"{1000 * median:.0f} | {bleu:.2f} | {same.get(name, '')} |")
    print(f"\n| search | ours / CTranslate2, batch {args.batch_size} | ours / CTranslate2, "
          "batch 1 | latency ours / CTranslate2 |")
    print("|---|---|---|---|")
    for search, figures, _ in rows:
        ct2_rate, _, ct2_one, ct2_median = figures[theirs.name]
        for engine, suffix in ((ours, ""), (exact, ", exact stopping"), (grown, ", growing cache"),
                               (kept, ", finished kept"),
                               (bf16, ", bfloat16"), (jit, ", XLA"),
                               (bf16_jit, ", bfloat16 + XLA")):
            if engine is None:
                continue
            rate, _, rate_one, median = figures[engine.name]
            if engine is kept:  # its batch-1 figures are `ours`'s (the same steps)
                print(f"| {label[search]}{suffix} | {rate / ct2_rate:.2f}x | | |")
            else:
                print(f"| {label[search]}{suffix} | {rate / ct2_rate:.2f}x | "
                      f"{rate_one / ct2_one:.2f}x | {median / ct2_median:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

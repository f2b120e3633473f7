"""Using an exported SavedModel: translate text files and score them with sacreBLEU.

Nothing here needs the Keras model or this package's layers: `ExportedTranslator` loads the
SavedModel with `tf.saved_model.load` (after `import tensorflow_text`, which registers the
SentencePiece ops the graph uses) and calls one of its signatures, exactly what TF Serving
does with the same directory.
"""

import json
import os
import pathlib
import select
import stat
import sys
import time

import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the SentencePiece ops of the exported graph)

from keras_transformer.export.batching import (  # noqa: F401  (this module's API before)
    IDLE,
    SORT_BUFFER_BATCHES,
    BatchTranslator,
    as_bytes,
    check_positive_integer,
    check_sentence_list,
    translate_by_length,
)
from keras_transformer.export.ctranslate2_translator import (
    METADATA_NAME as CTRANSLATE2_METADATA_NAME,
)
from keras_transformer.export.ctranslate2_translator import CTranslate2Translator
from keras_transformer.export.saved_model import latest_version_dir
from keras_transformer.textfiles import (
    LINE_ENDINGS_SAMPLE,
    UTF8_BOM,
    check_line_endings,
    check_not_utf16,
    count_lines,
    decode_utf8,
    open_binary,
    whole_lines,
)

# The input of every exported signature and its outputs (see docs/CONTRACTS.md).
INPUT_NAME = "text"
OUTPUT_NAMES = ("translation", "score", "length", "truncated", "unfinished")
# Where `export_translator` records the decoding settings.
METADATA_PATH = pathlib.Path("assets.extra") / "translator.json"


# How long standard input may pause before what it gave is translated (`translate`).
IDLE_SECONDS = 0.2


def is_ctranslate2_model(path):
    """Whether `path` is a CTranslate2 model directory `keras-transformer export-ctranslate2`
    wrote (CTranslate2's `model.bin` with our record beside it)."""
    path = pathlib.Path(path)
    return (path / "model.bin").is_file() and (path / CTRANSLATE2_METADATA_NAME).is_file()


def open_translator(path, signature="translate", compute_type=None):
    """The translator of an export: `ExportedTranslator` for a SavedModel (or a base
    directory of versions), `CTranslate2Translator` for a CTranslate2 model directory.

    Args:
        path: str or path-like, the export.
        signature: str, `"translate"` (the export's search) or `"translate_greedy"`; a
            SavedModel's other signatures too. Defaults to `"translate"`.
        compute_type: str or None, CTranslate2's computation type (`"int8"`, ...); None
            for a SavedModel, which refuses any other. Defaults to `None`.
    """
    if is_ctranslate2_model(path):
        return CTranslate2Translator(path, signature=signature,
                                     compute_type=compute_type or "default")
    if compute_type is not None:
        latest_version_dir(path)  # a missing or half-written export, named as such
        raise ValueError(f"compute_type={compute_type!r} is a setting of CTranslate2 models; "
                         f"{path} is not one (keras-transformer export-ctranslate2 writes them).")
    return ExportedTranslator(path, signature=signature)


def read_export_metadata(path):
    """The record `export_translator` wrote (`assets.extra/translator.json`), without loading
    the SavedModel; a CTranslate2 model's (`keras_transformer.json`).

    Args:
        path: str or path-like, a SavedModel or a base directory of versions (its highest
            version is read), or a CTranslate2 model directory.

    Returns:
        dict, `{}` when the export has no record.
    """
    if is_ctranslate2_model(path):
        return json.loads((pathlib.Path(path) / CTRANSLATE2_METADATA_NAME).read_text())
    record = latest_version_dir(path) / METADATA_PATH
    return json.loads(record.read_text()) if record.is_file() else {}


class ExportedTranslator(BatchTranslator):
    """An exported translator loaded for inference in Python.

    Loads a SavedModel written by `export_translator` (a version directory, or a base
    directory whose highest integer version is taken) and calls one of its signatures on
    batches of sentences. Only `tensorflow` and `tensorflow_text` are needed: the tokenizer,
    the encoder, the cached decoder and the search are all inside the graph.

    Args:
        path: str or path-like, a SavedModel directory or a base directory of versions.
        signature: str, the signature to call: `"translate"` (the export-time search, also
            `"serving_default"`) or `"translate_greedy"` (present unless the export-time
            search is greedy). Defaults to `"translate"`.

    Raises:
        FileNotFoundError: when `path` is neither a SavedModel nor a base directory.
        ValueError: when the SavedModel has no signature `signature`, or one that takes
            other inputs than a batch of sentences (`metadata`, `translate_seeded`).

    Example:
    >>> from keras_transformer import build_transformer
    >>> from keras_transformer.text import train_tokenizers
    >>> pairs = {"en": ["A dog runs.", "Two dogs play in the snow."] * 20,
    ...          "de": ["Ein Hund rennt.", "Zwei Hunde spielen im Schnee."] * 20}
    >>> tokenizer, _ = train_tokenizers(pairs, vocab_size=290, output_dir="vocab")
    >>> model = build_transformer(vocab_size=tokenizer.vocab_size, d_model=16,
    ...                           num_heads=2, ff_dim=32, num_layers=1)
    >>> from keras_transformer.export import DecodingConfig, Translator, export_translator
    >>> path = export_translator(Translator(model, tokenizer, tokenizer,
    ...                          DecodingConfig(max_output_length=8)), "export")
    >>> translator = ExportedTranslator("export")  # the highest version: export/1
    >>> results = translator.translate(["A dog runs."])
    >>> translator.version, sorted(results[0])
    (1, ['length', 'score', 'translation', 'truncated', 'unfinished'])
    """

    def __init__(self, path, signature="translate"):
        self.path = latest_version_dir(path)
        self.signature = signature
        self._loaded = tf.saved_model.load(str(self.path))
        if signature not in self._loaded.signatures:
            raise ValueError(
                f"{self.path} has no signature {signature!r}; it has "
                f"{sorted(self._loaded.signatures.keys())}."
            )
        self._function = self._loaded.signatures[signature]
        inputs = sorted(self._function.structured_input_signature[1])
        if inputs != [INPUT_NAME]:
            usable = sorted(name for name, function in self._loaded.signatures.items()
                            if sorted(function.structured_input_signature[1]) == [INPUT_NAME])
            raise ValueError(
                f"The signature {signature!r} of {self.path} takes the inputs {inputs}, not one "
                f"batch of sentences ({INPUT_NAME!r}): translate with one of {usable}."
            )

    @property
    def version(self):
        """int or None, the version number when the directory is named after one."""
        return int(self.path.name) if self.path.name.isdigit() else None

    @property
    def metadata(self):
        """dict, the record `export_translator` wrote (decoding settings...), `{}` if none."""
        return read_export_metadata(self.path)

    def _translate_batch(self, batch):
        """One signature call: list of bytes -> list of result dicts."""
        outputs = self._function(**{INPUT_NAME: tf.constant(batch, tf.string)})
        translations = outputs["translation"].numpy().tolist()
        scores = outputs["score"].numpy().tolist()
        lengths = outputs["length"].numpy().tolist()
        # Exports from before the flags have no `truncated` or `unfinished` output.
        flags = {name: (outputs[name].numpy().tolist() if name in outputs
                        else [False] * len(batch)) for name in ("truncated", "unfinished")}
        return [
            {
                # The detokenizer emits valid UTF-8; "replace" only guards the unexpected.
                "translation": t.decode("utf-8", errors="replace"),
                "score": float(s),
                "length": int(n),
                "truncated": bool(c),
                "unfinished": bool(u),
            }
            for t, s, n, c, u in zip(translations, scores, lengths, flags["truncated"],
                                     flags["unfinished"])
        ]


def read_lines(path_or_dash, strict=False):
    """Reads one sentence per line from a UTF-8 file (plain or `.gz`), or from stdin when
    given `"-"`.

    Only `"\\n"` separates lines (a trailing `"\\r"` is dropped), so Unicode line separators
    inside a sentence do not shift it against its reference; empty lines are kept; invalid
    UTF-8 bytes become U+FFFD, or with `strict` raise `ValueError` naming the line.

    Args:
        path_or_dash: str or path-like, a file, or `"-"` for standard input.
        strict: bool, refuse bytes that are not UTF-8 (a file in another encoding) rather
            than replace them. Defaults to `False`.

    Returns:
        list of str, without line terminators.
    """
    return list(iter_lines(path_or_dash, strict))


def iter_lines(path_or_dash, strict=False, on_replaced=None, idle_seconds=None):
    """`read_lines` one line at a time, so a long file or a pipe is read as it is translated.

    Splitting the bytes at `b"\\n"` before decoding is safe: that byte never occurs inside a
    multi-byte UTF-8 character.

    Args:
        path_or_dash: str or path-like, a file, or `"-"` for standard input.
        strict: bool, as in `read_lines`. Defaults to `False`.
        on_replaced: callable or None, called with the 1-based number of each line whose
            bytes that are not UTF-8 were replaced (not `strict`). Defaults to `None`.
        idle_seconds: float or None: standard input, or a file named that is not a regular
            file (a terminal, a pipe, `/dev/stdin`), gives `IDLE` once when no input came
            for this long, so that lines typed or written one at a time can be translated
            as they come. Defaults to `None`.

    Yields:
        str, each line without its terminator (nor the first line a UTF-8 byte order mark);
        or `IDLE`.

    Raises:
        ValueError: `strict`, on a line that is not UTF-8.
    """
    if str(path_or_dash) == "-":
        stream = sys.stdin.buffer
        if idle_seconds is not None:
            stream = _pausing_lines(stream, idle_seconds)
        yield from _decoded_lines(stream, "<stdin>", strict, on_replaced)
        return
    name = os.fspath(path_or_dash)
    if (idle_seconds is not None and os.name == "posix" and not name.endswith(".gz")
            and not stat.S_ISREG(os.stat(name).st_mode)):
        # A pipe given by name (`/dev/stdin`, `<(prog)`, a FIFO) is read as standard input
        # is: unbuffered, so that what `_pausing_lines` reads is all there is.
        with open(name, "rb", buffering=0) as stream:
            yield from _decoded_lines(_pausing_lines(stream, idle_seconds), name, strict,
                                      on_replaced)
        return
    with open_binary(path_or_dash) as stream:
        # A file's first bytes, judged before reading (its first line alone may be a title).
        sample = stream.peek(LINE_ENDINGS_SAMPLE)[:LINE_ENDINGS_SAMPLE] if hasattr(
            stream, "peek") else b""
        check_line_endings(whole_lines(sample), os.fspath(path_or_dash))
        yield from _decoded_lines(stream, os.fspath(path_or_dash), strict, on_replaced)


def _pausing_lines(stream, idle_seconds):
    """The lines (bytes, with their `b"\\n"`) of a binary stream, and `IDLE` once whenever
    no input came for `idle_seconds`, read from its file descriptor when it is a terminal
    or a pipe (POSIX); other streams' lines as they are."""
    try:
        descriptor = stream.fileno()
        regular = stat.S_ISREG(os.fstat(descriptor).st_mode)
    except (AttributeError, OSError, ValueError):
        descriptor, regular = None, True
    if regular or os.name != "posix":
        yield from stream
        return
    pending, idle = [], False  # the unfinished line's chunks, joined once
    while True:
        if not idle and not select.select([descriptor], [], [], idle_seconds)[0]:
            idle = True
            yield IDLE
            continue
        chunk = os.read(descriptor, 1 << 16)
        idle = False
        if not chunk:
            break
        *lines, rest = chunk.split(b"\n")
        if lines:
            lines[0] = b"".join(pending + [lines[0]])
            pending = []
            for line in lines:
                yield line + b"\n"
        pending.append(rest)
    if any(pending):
        yield b"".join(pending)


def _decoded_lines(stream, name, strict=False, on_replaced=None):
    """Lines of a byte stream as str; bytes that are not UTF-8 become U+FFFD, or with
    `strict` raise `ValueError` naming `name` (the stream's, for messages) and the line.
    `on_replaced` (a callable, or None) is called with the number of each line with
    replaced bytes.
    UTF-16 text raises either way (`check_not_utf16`), told from the first line that is not
    empty (its byte order mark, or NULs beside its letters): a later line's stray NUL bytes
    are UTF-8, read as such, so one odd line does not stop a long translation half-way."""
    checked = False
    number = -1
    for line in stream:
        if line is IDLE:
            yield IDLE
            continue
        number += 1
        where = f"{name}:{number + 1}"
        if not checked and line.rstrip(b"\r\n"):
            check_not_utf16(line, where)
            if not line.endswith(b"\n"):  # the whole input is one line
                check_line_endings(line, name)
            checked = True
        if number == 0 and line.startswith(UTF8_BOM):  # a Windows editor's byte order mark
            line = line[len(UTF8_BOM):]
        if line.endswith(b"\n"):
            line = line[:-1]
        if line.endswith(b"\r"):
            line = line[:-1]
        if strict:
            yield decode_utf8(line, where, check_utf16=False)
            continue
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError:
            if on_replaced is not None:
                on_replaced(number + 1)
            yield line.decode("utf-8", errors="replace")


class ProgressBar:
    """A one-line progress bar on a terminal stream: done/total, percent, rate and ETA.

    Redrawn in place with `"\\r"` at most every `min_interval` seconds, and ended with a
    newline by `close()`, so the translations on stdout never mix with it.

    Without a total (a pipe, read once) it counts: done, rate.

    Args:
        total: int or None, sentences to translate.
        stream: a text stream. Defaults to `sys.stderr`.
        unit: str, what is counted. Defaults to `"sentences"`.
        min_interval: float, seconds between redraws. Defaults to `0.2`.

    Example:
    >>> bar = ProgressBar(1000)
    >>> bar.update(64)  # stderr: " 64/1000 sentences   6%  120.3/s  ETA 0:00:07"
    >>> bar.close()
    """

    def __init__(self, total, stream=None, unit="sentences", min_interval=0.2):
        self.total = total
        self.stream = stream or sys.stderr
        self.unit = unit
        self.min_interval = min_interval
        self.done = 0
        self._started = time.perf_counter()
        self._drawn = 0.0

    def update(self, count):
        """Counts `count` more done and redraws when due (always at the end)."""
        self.done += count
        now = time.perf_counter()
        if now - self._drawn >= self.min_interval or (
                self.total is not None and self.done >= self.total):
            self._drawn = now
            self._draw(now - self._started)

    def _draw(self, elapsed):
        rate = self.done / elapsed if elapsed > 0 else 0.0
        if self.total is None:
            self.stream.write(f"\r{self.done} {self.unit}  {rate:7.1f}/s")
            self.stream.flush()
            return
        percent = 100.0 * self.done / self.total if self.total else 100.0
        remaining = (self.total - self.done) / rate if rate > 0 else 0.0
        minutes, seconds = divmod(int(remaining), 60)
        eta = f"{minutes // 60:02d}:{minutes % 60:02d}:{seconds:02d}"  # hours past 24 too
        width = len(str(self.total))
        self.stream.write(f"\r{self.done:>{width}}/{self.total} {self.unit} {percent:5.1f}%  "
                          f"{rate:7.1f}/s  ETA {eta}")
        self.stream.flush()

    def close(self):
        """Ends the bar's line (a count without a total drawn once more: its last number)."""
        if self.total is None:
            self._draw(time.perf_counter() - self._started)
        self.stream.write("\n")
        self.stream.flush()


def evaluate_translations(hypotheses, references, target_lang=None, normalization="nmt_nfkc"):
    """Corpus BLEU (cased and lowercased) and chrF with sacreBLEU, with their signatures.

    Both sides are detokenized text, scored with sacreBLEU's defaults (`13a` tokenization,
    exponential smoothing, chrF with character order 6 and beta 2), BLEU tokenized as
    `target_lang` is written (`keras_transformer.languages.bleu_tokenizer`: `zh` for
    Chinese, characters for Japanese without MeCab, Thai, ...). References are used as
    given. The exported translator writes text normalized by its vocabulary's rule
    (`keras_transformer.text.normalize`; `nmt_nfkc` unless trained with another
    `normalization`): for most text that only collapses spaces, but under NFKC full-width
    punctuation (Chinese, Japanese), ligatures or compatibility characters in a reference
    are characters the model cannot write, and under `nmt_nfkc` zero-width characters and
    bidi marks too. Such references are counted (`references_changed_by_normalization`,
    whitespace aside), and BLEU against the normalized references is given too
    (`bleu_normalized_references`).

    Args:
        hypotheses: list of str, one translation per sentence.
        references: list of str, one reference per sentence.
        target_lang: str or None, the language of both (None: `13a`). Defaults to `None`.
        normalization: str, the SentencePiece rule of the model's vocabulary (the run's
            `normalization`). Defaults to `"nmt_nfkc"`.

    Returns:
        dict with `bleu`, `bleu_signature`, `bleu_lowercase`, `bleu_lowercase_signature`,
        `chrf`, `chrf_signature` (scores in [0, 100]), `sentences`, `normalization`,
        `references_changed_by_normalization` and `bleu_normalized_references` (`bleu`
        when no reference changed).

    Raises:
        ValueError: when the lists differ in length or are empty.
    """
    import sacrebleu  # Imported here: translating needs no sacreBLEU.

    check_sentence_list(hypotheses)
    check_sentence_list(references)
    from keras_transformer.training.presets import NORMALIZATIONS  # light: no TensorFlow

    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got "
                         f"normalization={normalization!r}.")
    hypotheses, references = list(hypotheses), list(references)
    for name, sentences in (("hypotheses", hypotheses), ("references", references)):
        if any(isinstance(s, dict) for s in sentences):
            raise TypeError(f"{name} must be strings; for the records of "
                            "`ExportedTranslator.translate` pass each one's [\"translation\"].")
    if len(hypotheses) != len(references):
        raise ValueError(
            f"Got {len(hypotheses)} hypotheses and {len(references)} references; "
            "they must pair up line by line."
        )
    if not hypotheses:
        raise ValueError("Nothing to evaluate: no hypotheses and no references.")
    from keras_transformer.languages import bleu_tokenizer

    tokenize = bleu_tokenizer(target_lang)
    metrics = {
        "bleu": sacrebleu.metrics.BLEU(tokenize=tokenize),
        "bleu_lowercase": sacrebleu.metrics.BLEU(lowercase=True, tokenize=tokenize),
        "chrf": sacrebleu.metrics.CHRF(),
    }
    result = {}
    for name, metric in metrics.items():
        result[name] = float(metric.corpus_score(hypotheses, [references]).score)
        result[f"{name}_signature"] = str(metric.get_signature())
    result["sentences"] = len(hypotheses)
    from keras_transformer.text.normalization import normalize

    normalized = normalize(references, normalization)
    result["normalization"] = normalization
    result["references_changed_by_normalization"] = sum(
        n.split() != r.split() for n, r in zip(normalized, references))
    result["bleu_normalized_references"] = (float(
        metrics["bleu"].corpus_score(hypotheses, [normalized]).score)
        if result["references_changed_by_normalization"] else result["bleu"])
    return result


def _export_normalization(translator):
    """The normalization rule of a translator's target vocabulary: its SentencePiece model
    in a SavedModel's `assets/` or beside a CTranslate2 model (`target.model` with separate
    vocabularies, else `tokenizer.model`), else the run's configuration in its record, else
    `nmt_nfkc` (every vocabulary's before the setting)."""
    from keras_transformer.text import MODEL_FILENAME
    from keras_transformer.text.normalization import NORMALIZATION_RULE, model_normalization
    from keras_transformer.text.tokenizers import TARGET_FILENAME

    for name in (TARGET_FILENAME, MODEL_FILENAME):
        for directory in (translator.path / "assets", translator.path):  # a CTranslate2 model's
            if (directory / name).is_file():
                return model_normalization(directory / name)
    return (translator.metadata.get("training_config") or {}).get("normalization",
                                                                  NORMALIZATION_RULE)


def evaluate_export(path, sources, references, batch_size=64, signature="translate",
                    on_batch=None, target_lang=None, compute_type=None):
    """Translates `sources` with an exported model, scores them and measures the speed.

    One sentence is translated before the clock starts, so one-time costs of the first call
    (graph optimization, resource creation) are not counted.

    Args:
        path: str or path-like, a SavedModel or a base directory of versions, or a
            CTranslate2 model directory (`open_translator`).
        sources: list of str, the sentences to translate.
        references: list of str, their reference translations.
        batch_size: int, sentences per call. Defaults to `64`.
        signature: str, the signature to call. Defaults to `"translate"`.
        on_batch: callable or None, called with each timed batch's size (a progress bar).
        target_lang: str or None, the references' language, for BLEU's tokenization
            (`evaluate_translations`). Defaults to `None`: the target language the export
            records (its metadata or training configuration), as `keras-transformer
            evaluate` reads it.
        compute_type: str or None, a CTranslate2 model's computation type (`"int8"`, ...).
            Defaults to `None`.

    Returns:
        The dict of `evaluate_translations`, plus `seconds` (translation wall time),
        `sentences_per_second`, `batch_size`, `signature`, `model_path` (the version
        directory), `translations` (list of str, in order of `sources`) and
        `truncated_lines` (the 1-based numbers of the sources longer than the export's
        `max_input_length`, cut before translating), `unfinished_lines` (those whose
        translation reached its length limit before its end) and `compute_type` (a
        CTranslate2 model's, `"default"` when not given; `None` for a SavedModel).
    """
    sources, references = list(sources), list(references)
    if len(sources) != len(references):
        raise ValueError(
            f"Got {len(sources)} sources and {len(references)} references; "
            "they must pair up line by line."
        )
    translator = open_translator(path, signature=signature, compute_type=compute_type)
    if sources:
        translator.translate(sources[:1])  # warm-up, not timed
    start = time.perf_counter()
    results = translator.translate(sources, batch_size=batch_size, on_batch=on_batch)
    seconds = time.perf_counter() - start
    translations = [r["translation"] for r in results]
    normalization = _export_normalization(translator)  # the version it loaded
    if target_lang is None:
        metadata = translator.metadata
        target_lang = (metadata.get("target_lang")
                       or (metadata.get("training_config") or {}).get("target_lang"))
    result = evaluate_translations(translations, references, target_lang, normalization)
    result.update(
        seconds=seconds,
        sentences_per_second=len(sources) / seconds if seconds > 0 else float("inf"),
        batch_size=batch_size,
        signature=signature,
        model_path=str(translator.path),
        translations=translations,
        truncated_lines=[number for number, r in enumerate(results, 1) if r["truncated"]],
        unfinished_lines=[number for number, r in enumerate(results, 1) if r["unfinished"]],
        compute_type=(compute_type or "default") if isinstance(translator, CTranslate2Translator)
        else None,
    )
    return result

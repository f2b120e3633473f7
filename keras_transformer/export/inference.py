"""Using an exported SavedModel: translate text files and score them with sacreBLEU.

Nothing here needs the Keras model or this package's layers: `ExportedTranslator` loads the
SavedModel with `tf.saved_model.load` (after `import tensorflow_text`, which registers the
SentencePiece ops the graph uses) and calls one of its signatures, exactly what TF Serving
does with the same directory.
"""

import json
import pathlib
import sys
import time

import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the SentencePiece ops of the exported graph)

from keras_transformer.export.saved_model import latest_version_dir

# The input of every exported signature and its outputs (see docs/CONTRACTS.md).
INPUT_NAME = "text"
OUTPUT_NAMES = ("translation", "score", "length")
# Where `export_translator` records the decoding settings.
METADATA_PATH = pathlib.Path("assets.extra") / "translator.json"


def _as_bytes(sentence):
    """str -> UTF-8 bytes; bytes pass through untouched (the graph repairs invalid UTF-8)."""
    if isinstance(sentence, bytes):
        return sentence
    if isinstance(sentence, str):
        return sentence.encode("utf-8")
    raise TypeError(f"Expected str or bytes sentences, got {type(sentence).__name__}.")


class ExportedTranslator:
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
        ValueError: when the SavedModel has no signature `signature`.

    Example:
    >>> translator = ExportedTranslator("runs/quick/export")
    >>> translator.translate(["A dog runs."])
    [{'translation': 'Ein Hund rennt.', 'score': -1.83, 'length': 5}]
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

    @property
    def version(self):
        """int or None, the version number when the directory is named after one."""
        return int(self.path.name) if self.path.name.isdigit() else None

    @property
    def metadata(self):
        """dict, the record `export_translator` wrote (decoding settings...), `{}` if none."""
        record = self.path / METADATA_PATH
        return json.loads(record.read_text()) if record.is_file() else {}

    def translate(self, sentences, batch_size=64):
        """Translates sentences in batches of `batch_size`.

        Args:
            sentences: list of str (or UTF-8 bytes; invalid bytes are replaced in the graph).
            batch_size: int, sentences per signature call. Defaults to `64`.

        Returns:
            A list with one dict per sentence, in order: `{"translation": str, "score":
            float (log-probability of the translation), "length": int (target tokens, END
            included)}`.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got batch_size={batch_size}.")
        sentences = [_as_bytes(s) for s in sentences]
        results = []
        for start in range(0, len(sentences), batch_size):
            batch = tf.constant(sentences[start : start + batch_size], tf.string)
            outputs = self._function(**{INPUT_NAME: batch})
            translations = outputs["translation"].numpy().tolist()
            scores = outputs["score"].numpy().tolist()
            lengths = outputs["length"].numpy().tolist()
            results.extend(
                {
                    # The detokenizer emits valid UTF-8; "replace" only guards the unexpected.
                    "translation": t.decode("utf-8", errors="replace"),
                    "score": float(s),
                    "length": int(n),
                }
                for t, s, n in zip(translations, scores, lengths)
            )
        return results

    def __call__(self, sentences, batch_size=64):
        """Translates sentences; returns only the translations, a list of str."""
        return [r["translation"] for r in self.translate(sentences, batch_size=batch_size)]


def read_lines(path_or_dash):
    """Reads one sentence per line from a UTF-8 file, or from stdin when given `"-"`.

    Only `"\\n"` separates lines (a trailing `"\\r"` is dropped), so Unicode line separators
    inside a sentence do not shift it against its reference; empty lines are kept; invalid
    UTF-8 bytes become U+FFFD.

    Args:
        path_or_dash: str or path-like, a file, or `"-"` for standard input.

    Returns:
        list of str, without line terminators.
    """
    if str(path_or_dash) == "-":
        data = sys.stdin.buffer.read()
    else:
        data = pathlib.Path(path_or_dash).read_bytes()
    text = data.decode("utf-8", errors="replace")
    if not text:
        return []
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def evaluate_translations(hypotheses, references):
    """Corpus BLEU (cased and lowercased) and chrF with sacreBLEU, with their signatures.

    Both sides are detokenized text, scored with sacreBLEU's defaults (`13a` tokenization,
    exponential smoothing, chrF with character order 6 and beta 2). References are used as
    given: the exported translator's outputs are SentencePiece-normalized
    (`keras_transformer.text.normalize`), which for ordinary text only collapses spaces.

    Args:
        hypotheses: list of str, one translation per sentence.
        references: list of str, one reference per sentence.

    Returns:
        dict with `bleu`, `bleu_signature`, `bleu_lowercase`, `bleu_lowercase_signature`,
        `chrf`, `chrf_signature` (scores in [0, 100]) and `sentences`.

    Raises:
        ValueError: when the lists differ in length or are empty.
    """
    import sacrebleu  # Imported here: translating needs no sacreBLEU.

    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references):
        raise ValueError(
            f"Got {len(hypotheses)} hypotheses and {len(references)} references; "
            "they must pair up line by line."
        )
    if not hypotheses:
        raise ValueError("Nothing to evaluate: no hypotheses and no references.")
    metrics = {
        "bleu": sacrebleu.metrics.BLEU(),
        "bleu_lowercase": sacrebleu.metrics.BLEU(lowercase=True),
        "chrf": sacrebleu.metrics.CHRF(),
    }
    result = {}
    for name, metric in metrics.items():
        result[name] = float(metric.corpus_score(hypotheses, [references]).score)
        result[f"{name}_signature"] = str(metric.get_signature())
    result["sentences"] = len(hypotheses)
    return result


def evaluate_export(path, sources, references, batch_size=64, signature="translate"):
    """Translates `sources` with an exported model, scores them and measures the speed.

    One sentence is translated before the clock starts, so one-time costs of the first call
    (graph optimization, resource creation) are not counted.

    Args:
        path: str or path-like, a SavedModel or a base directory of versions.
        sources: list of str, the sentences to translate.
        references: list of str, their reference translations.
        batch_size: int, sentences per call. Defaults to `64`.
        signature: str, the signature to call. Defaults to `"translate"`.

    Returns:
        The dict of `evaluate_translations`, plus `seconds` (translation wall time),
        `sentences_per_second`, `batch_size`, `signature`, `model_path` (the version
        directory) and `translations` (list of str, in order of `sources`).
    """
    sources, references = list(sources), list(references)
    if len(sources) != len(references):
        raise ValueError(
            f"Got {len(sources)} sources and {len(references)} references; "
            "they must pair up line by line."
        )
    translator = ExportedTranslator(path, signature=signature)
    if sources:
        translator.translate(sources[:1])  # warm-up, not timed
    start = time.perf_counter()
    translations = translator(sources, batch_size=batch_size)
    seconds = time.perf_counter() - start
    result = evaluate_translations(translations, references)
    result.update(
        seconds=seconds,
        sentences_per_second=len(sources) / seconds if seconds > 0 else float("inf"),
        batch_size=batch_size,
        signature=signature,
        model_path=str(translator.path),
        translations=translations,
    )
    return result

"""Translating with a CTranslate2 model that `keras-transformer export-ctranslate2` wrote.

The directory holds CTranslate2's `model.bin`, `config.json` and vocabularies, the run's
SentencePiece models (`source.model`, `target.model`) and our record,
`keras_transformer.json`: the direction, the checkpoint, the training configuration and the
default decoding settings. `CTranslate2Translator` takes raw sentences to translations with
the same steps as our exported `translate` signature, around CTranslate2's C++ decoder;
`keras-transformer translate` and `evaluate` take such a directory as `--export`.
"""

import json
import math
import pathlib
import unicodedata

from keras_transformer.export.batching import BatchTranslator

# Our record beside CTranslate2's files: the direction, the checkpoint, the training
# configuration and the decoding defaults.
METADATA_NAME = "keras_transformer.json"
# The SentencePiece models written beside CTranslate2's files.
SOURCE_MODEL_NAME = "source.model"
TARGET_MODEL_NAME = "target.model"
# Decoding settings a directory's record (its `"decoding"`) leaves out: our export's bounds;
# beam search's length penalty is CTranslate2's `log_prob / length ** alpha`, whose neutral
# value is 1.0, not our export's GNMT form.
DEFAULT_SETTINGS = {"beam_size": 4, "length_penalty": 1.0, "max_input_length": 128,
                    "max_output_length": 128}
# What the `signature` argument may name, as an export's signatures: its search or greedy.
SIGNATURES = ("translate", "serving_default", "translate_greedy")
INSTALL_HINT = "pip install 'keras-transformer[ctranslate2]' (or 'ctranslate2>=4.5,<5')"
# Characters that are no text: a sentence of these alone translates to "" (our export's
# `NO_TEXT_PATTERN`: whitespace, separators, controls, format characters such as zero-width
# spaces, bidi marks and a BOM).
NO_TEXT_CATEGORIES = ("Zs", "Zl", "Zp", "Cc", "Cf")
# Pieces our searches never produce: PAD and START (UNK is `disable_unk`).
SUPPRESSED_PIECES = (("<pad>",), ("<s>",))


def has_text(sentence):
    """Whether `sentence` (str) holds a character that is not whitespace, a separator, a
    control or a format character."""
    return any(not c.isspace() and unicodedata.category(c) not in NO_TEXT_CATEGORIES
               for c in sentence)


def check_position_tables(settings, positions):
    """Refuses decoding bounds past a converted model's position tables.

    CTranslate2 fails in the middle of a batch on a position its table lacks: the source
    embeds up to `max_input_length` positions (the pieces and END), the target up to
    `max_output_length`.

    Args:
        settings: dict with `max_input_length` and `max_output_length`.
        positions: dict `{"source": rows, "target": rows}` (`keras_transformer.json`'s
            `"positions"`), or `None` (a directory converted before it was recorded:
            nothing to check).

    Raises:
        ValueError: naming the bound, the table and its size.
    """
    if not positions:
        return
    for name, side in (("max_input_length", "source"), ("max_output_length", "target")):
        if settings[name] > positions[side]:
            raise ValueError(
                f"{name}={settings[name]} exceeds the {side} position table "
                f"({positions[side]} positions): a sentence that long would fail inside "
                f"CTranslate2. Use {name} <= {positions[side]} (`--"
                f"{name.replace('_', '-')} {positions[side]}` when converting).")


def import_ctranslate2():
    """The `ctranslate2` module, or an `ImportError` saying how to install it."""
    try:
        import ctranslate2
    except ImportError as error:
        raise ImportError(f"CTranslate2 is not installed: {INSTALL_HINT}.") from error
    return ctranslate2


def read_metadata(path):
    """The `keras_transformer.json` record of a CTranslate2 model directory.

    Raises:
        FileNotFoundError: when `path` holds no CTranslate2 model written by
            `keras-transformer export-ctranslate2` (or `ctranslate2_converter.convert`).
    """
    path = pathlib.Path(path)
    missing = [name for name in ("model.bin", SOURCE_MODEL_NAME, TARGET_MODEL_NAME,
                                 METADATA_NAME) if not (path / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{path} is not a CTranslate2 model written by `keras-transformer "
            f"export-ctranslate2` (no {', '.join(missing)}).")
    return json.loads((path / METADATA_NAME).read_text())


class CTranslate2Translator(BatchTranslator):
    """Raw sentences in, translations out, with CTranslate2 on a converted run.

    The steps of our exported `translate` signature around CTranslate2's decoder: a sentence
    is stripped of leading and trailing whitespace (one without text, blank or of zero-width
    characters, bidi marks or controls alone, translates to `""`),
    tokenized by the run's SentencePiece model (its normalization included), cut to
    `max_input_length` tokens (END included), translated with UNK, PAD and START never
    produced and END allowed first, and detokenized. Greedy translations are ours token for
    token (`keras-transformer export-ctranslate2` checks it on the run's validation
    sentences); beam search ranks hypotheses by CTranslate2's `log_prob / length **
    length_penalty` (our `export --length-penalty-form power`) and stops once `beam_size`
    hypotheses have finished (our `--beam-stopping early`; at `length_penalty=0`
    CTranslate2 stops as soon as its best hypothesis ends). Unlike our export, a translation
    is bounded by `max_output_length` alone, not also by its source's length.

    `translate`, `translate_stream` and calling it work as `ExportedTranslator`'s; each
    result's `score` is CTranslate2's: the log-probability (UNK masked before the softmax,
    where ours masks it after: a little higher), divided by the length penalty in beam
    search; `length` counts END when the translation has one.

    Args:
        path: str or path-like, a directory `keras-transformer export-ctranslate2` wrote.
        signature: str, `"translate"` (or `"serving_default"`): beam search with the
            directory's settings; `"translate_greedy"`: greedy search. Defaults to
            `"translate"`.
        beam_size: int or None, hypotheses kept (1 is greedy search). Defaults to the
            directory's setting.
        length_penalty: float or None, beam search's `alpha`. Defaults to the directory's.
        max_output_length: int or None, target tokens at most. Defaults to the directory's.
        compute_type: str, CTranslate2's computation type: `"default"` (as saved), `"int8"`
            (faster on CPU; measure its BLEU with `keras-transformer evaluate
            --compute-type int8`), ... Defaults to `"default"`.
        intra_threads: int, threads per batch; 0 lets CTranslate2 choose. Defaults to `0`.
        inter_threads: int, CTranslate2's replicas, each translating one batch at a time.
            One `translate` call submits its batches one after another, so more than 1
            helps only callers that translate from several threads at once (as
            `benchmarks/decode_vs_ctranslate2.py --callers` does). Defaults to `1`.

    Raises:
        FileNotFoundError: when `path` is not such a directory.
        ImportError: when `ctranslate2` is not installed.
        ValueError: on an unknown signature or compute type, or settings out of range.

    Example (needs a converted run, so not a doctest):

        translator = CTranslate2Translator("runs/quick/ctranslate2", compute_type="int8")
        translator(["A dog runs in the snow."])  # ['Ein Hund rennt im Schnee.']
    """

    def __init__(self, path, signature="translate", beam_size=None, length_penalty=None,
                 max_output_length=None, compute_type="default", intra_threads=0,
                 inter_threads=1):
        import sentencepiece

        ctranslate2 = import_ctranslate2()
        self.path = pathlib.Path(path)
        self.metadata = read_metadata(self.path)
        if signature not in SIGNATURES:
            raise ValueError(f"A CTranslate2 model has no signature {signature!r}; it has "
                             f"{list(SIGNATURES)}.")
        self.signature = signature
        settings = {**DEFAULT_SETTINGS, **self.metadata.get("decoding", {})}
        if beam_size is None:
            beam_size = 1 if signature == "translate_greedy" else settings["beam_size"]
        self.beam_size = beam_size
        self.length_penalty = (settings["length_penalty"] if length_penalty is None
                               else length_penalty)
        self.max_input_length = settings["max_input_length"]
        self.max_output_length = (settings["max_output_length"] if max_output_length is None
                                  else max_output_length)
        for name, least in (("beam_size", 1), ("max_input_length", 2),  # END and a token
                            ("max_output_length", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}.")
        check_position_tables({"max_input_length": self.max_input_length,
                               "max_output_length": self.max_output_length},
                              self.metadata.get("positions"))
        if not (isinstance(self.length_penalty, (int, float)) and
                math.isfinite(self.length_penalty) and self.length_penalty >= 0):
            raise ValueError(f"length_penalty must be a number >= 0, got "
                             f"{self.length_penalty!r}.")
        supported = ctranslate2.get_supported_compute_types("cpu") | {"default", "auto"}
        if compute_type not in supported:
            raise ValueError(f"compute_type {compute_type!r} is not supported on this CPU; "
                             f"it supports {sorted(supported)}.")
        try:
            self._translator = ctranslate2.Translator(
                str(self.path), device="cpu", compute_type=compute_type,
                intra_threads=intra_threads, inter_threads=inter_threads)
        except RuntimeError as error:  # a model.bin this CTranslate2 cannot read
            raise ValueError(f"CTranslate2 {ctranslate2.__version__} cannot load {self.path}: "
                             f"{error}") from None
        self._source = sentencepiece.SentencePieceProcessor(
            model_file=str(self.path / SOURCE_MODEL_NAME))
        self._target = sentencepiece.SentencePieceProcessor(
            model_file=str(self.path / TARGET_MODEL_NAME))

    def _translate_batch(self, batch):
        """One call of CTranslate2: list of UTF-8 bytes -> list of result dicts."""
        # Invalid bytes become U+FFFD, as in our graph.
        sentences = [s.decode("utf-8", errors="replace").strip() for s in batch]
        pieces = self._source.encode(sentences, out_type=str)
        # CTranslate2 appends END itself: the pieces stop one short of the bound.
        truncated = [len(p) > self.max_input_length - 1 for p in pieces]
        pieces = [p[:self.max_input_length - 1] for p in pieces]
        results = [{"translation": "", "score": 0.0, "length": 0, "truncated": cut,
                    "unfinished": False} for cut in truncated]
        # A sentence without text stays "", as in our export.
        kept = [i for i, (p, s) in enumerate(zip(pieces, sentences)) if p and has_text(s)]
        if not kept:
            return results
        outputs = self._translator.translate_batch(
            [pieces[i] for i in kept], beam_size=self.beam_size,
            # Greedy search too divides its score by the penalty: 0 keeps the log-probability.
            length_penalty=self.length_penalty if self.beam_size > 1 else 0.0,
            max_decoding_length=self.max_output_length, min_decoding_length=0,
            disable_unk=True, suppress_sequences=[list(p) for p in SUPPRESSED_PIECES],
            max_input_length=0, return_scores=True, return_end_token=True)
        for i, output in zip(kept, outputs):
            hypothesis = output.hypotheses[0]
            ended = bool(hypothesis) and hypothesis[-1] == "</s>"
            text = hypothesis[:-1] if ended else hypothesis
            results[i] = {"translation": self._target.decode(text),
                          "score": float(output.scores[0]), "length": len(hypothesis),
                          "truncated": truncated[i], "unfinished": not ended}
        return results

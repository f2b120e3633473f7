"""`TrainingConfig`: every setting of a training run in one place, and the named presets."""

import dataclasses
import json
import math
import numbers
import os
import types
import typing

PRECISIONS = (None, "mixed_bfloat16", "mixed_float16", "auto")
# SentencePiece normalization rules a vocabulary may be trained with (`normalization`).
NORMALIZATIONS = ("nmt_nfkc", "nfkc", "identity")
# The shapes of the learning-rate cooldown (`lr_cooldown_shape`): `schedules.COOLDOWN_SHAPES`,
# not imported (this module loads no TensorFlow, and export's modules load the schedule).
COOLDOWN_SHAPES = ("linear", "1-sqrt")
# The most segmentations SentencePiece samples from (`subword_nbest`): `nbest_encode`'s limit,
# `text.subword_sampling.MAX_NBEST` (not imported: this module loads no TensorFlow).
MAX_NBEST = 512
# CPU feature flags (Linux /proc/cpuinfo) of instructions that compute bfloat16 dot products
# natively. Without them TensorFlow emulates bfloat16 and `mixed_bfloat16` trains slower than
# float32; with AVX-512 BF16 it trained the `multi30k` model 1.32x faster (RESULTS.md).
NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_has_native_bf16(cpuinfo_path="/proc/cpuinfo"):
    """Whether this machine's CPU lists a native bfloat16 instruction set.

    Reads the `flags` lines of `cpuinfo_path` (Linux x86); where the file is missing or
    unreadable (macOS, Windows) the answer is False.

    Args:
        cpuinfo_path: path of the `/proc/cpuinfo`-format file to read.

    Returns:
        True when a `flags` line names one of `NATIVE_BF16_CPU_FLAGS`.
    """
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as file:
            for line in file:
                if line.startswith("flags") and any(
                        flag in line.split() for flag in NATIVE_BF16_CPU_FLAGS):
                    return True
    except OSError:
        return False
    return False


def resolve_precision(precision, cpuinfo_path="/proc/cpuinfo", gpus=None):
    """The Keras dtype policy a `TrainingConfig.precision` stands for on this machine.

    `"auto"` means `"mixed_bfloat16"` on a CPU-only machine whose CPU computes bfloat16
    natively (`cpu_has_native_bf16`), float32 (None) everywhere else, GPUs included; other
    values are returned unchanged.

    Args:
        precision: a value of `PRECISIONS`.
        cpuinfo_path: the `/proc/cpuinfo`-format file to read for `"auto"`.
        gpus: the number of visible GPUs; None asks TensorFlow.

    Returns:
        None, `"mixed_bfloat16"` or `"mixed_float16"`.

    Example:

    >>> resolve_precision("mixed_float16")
    'mixed_float16'
    """
    if precision != "auto":
        return precision
    if gpus is None:
        import tensorflow as tf

        gpus = len(tf.config.list_physical_devices("GPU"))
    if gpus == 0 and cpu_has_native_bf16(cpuinfo_path):
        return "mixed_bfloat16"
    return None


def _field(default, help):
    """A dataclass field whose `metadata["help"]` documents it."""
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """The settings of one training run: model size, data, optimization, precision,
    validation decoding and seed.

    Every field carries its documentation in `metadata["help"]`. Instances are frozen:
    derive variants with `replace(**overrides)`, which validates again. `get_preset(name)`
    returns a named configuration, `from_file(path)` reads one from JSON or YAML.

    Example:

    >>> config = get_preset("quick").replace(epochs=2)
    >>> config.to_dict()["d_model"], config.epochs
    (256, 2)
    """

    # Model size.
    vocab_size: int = _field(
        8000, "Size of the subword vocabulary (incl. the 4 reserved ids 0-3)."
    )
    shared_vocabulary: bool = _field(
        True, "One vocabulary for source and target (a joint tokenizer and embedding)."
    )
    normalization: str = _field(
        "nmt_nfkc", "Text normalization of the vocabulary, which the model reads and writes "
        "text through (SentencePiece's rule): 'nmt_nfkc' (NFKC; whitespace variants, "
        "zero-width characters and bidi marks become spaces, control characters go), "
        "'nfkc' (NFKC only: keeps Persian's zero-width non-joiner and bidi marks), "
        "'identity' (text as written: keeps full-width CJK punctuation too)."
    )
    character_coverage: float = _field(
        1.0, "Share of the training text's characters that get pieces of their own; the "
        "rarest others are spelled in UTF-8 bytes (byte fallback, nothing lost). 1.0: every "
        "character seen; 0.9995 for scripts of thousands of characters (Chinese, Japanese); at "
        "least 0.98."
    )
    d_model: int = _field(512, "Width of embeddings and of every sublayer output.")
    num_heads: int = _field(8, "Attention heads per attention layer; divides d_model.")
    ff_dim: int = _field(2048, "Inner width of the position-wise feed-forward network.")
    num_layers: int = _field(6, "Number of encoder layers.")
    num_decoder_layers: int | None = _field(
        None, "Number of decoder layers; None means the same as num_layers."
    )
    dropout: float = _field(
        0.1, "Dropout rate on sublayer outputs, embeddings and attention weights."
    )
    attention_dropout: float | None = _field(
        None, "Dropout rate on attention weights alone; None = `dropout`. With 0 no mask is "
        "drawn per attention weight (fairseq's small-data recipes leave it at 0)."
    )
    late_dropout: float | None = _field(
        None, "Dropout rate after the first `late_dropout_after` epochs (a 'late dropout', "
        "Liu et al., 2023: learn fast with `dropout`, then regularize more); every dropout "
        "in use changes (LateDropout). None = off; needs dropout > 0."
    )
    late_dropout_after: int = _field(
        0, "Epochs trained at `dropout` before `late_dropout` applies; a run that ends "
        "sooner never changes."
    )
    late_dropout_min_epochs: int = _field(
        0, "Apply `late_dropout` only in a run planned, after its first "
        "`late_dropout_after` epochs, to last at least this many (`epochs`, or what "
        "`time_budget_minutes` predicts then); 0 = always."
    )
    norm_first: bool = _field(
        False, "Pre-layer-norm blocks (True) instead of the paper's post-norm (False)."
    )
    tie_embeddings: bool = _field(
        True, "Share the target embedding with the output projection (and the source "
        "embedding when the vocabulary is shared), as in the paper."
    )
    skip_padding: bool = _field(
        False, "The encoder and decoder stacks run their per-token work on the real tokens "
        "only (`build_transformer(skip_padding=True)`): the same model, less arithmetic on "
        "padded batches; Keras then compiles without XLA."
    )

    # Data.
    data: str = _field(
        "multi30k", "Data source: 'multi30k', 'files' (parallel text files), 'tsv' "
        "(source<TAB>target) or 'tfds:<name>' (any TFDS translation dataset)."
    )
    data_files: dict | None = _field(
        None, "Files of 'files'/'tsv' by split: {split: [source, target]} or {split: tsv}; "
        "'train' required, 'validation' optional, other names are test sets."
    )
    source_lang: str | None = _field(
        None, "Source language code (Multi30K: en, de, fr or cs; files: a suffix such as "
        "train.fr; TFDS: a feature key). None: Multi30K's en, the language the files' names "
        "give (train.fr), a TFDS dataset's supervised keys; a TSV file needs it. A run "
        "records the languages it trained on."
    )
    target_lang: str | None = _field(
        None, "Target language code (see source_lang; None: Multi30K's de).")
    tokenizer_sample_pairs: int = _field(
        200_000, "The vocabulary is trained on a uniform sample of at most this many training "
        "pairs (reservoir sampling in one pass), so its memory and time are bounded "
        "(SentencePiece on 200,000 pairs peaks at ~1.5 GiB RSS, on 500,000 at ~2.7 GiB: "
        "benchmarks/pipeline_2m.py). Its memory grows with the text, so the sample also "
        "holds at most 40 million characters (fewer pairs where lines are long)."
    )
    drop_long_pairs: bool = _field(
        True, "Drop training/validation pairs longer than max_length tokens on either side "
        "(counted in the data report) instead of truncating them."
    )
    max_length: int = _field(
        64, "Maximum tokens per training/validation sequence incl. START/END: longer pairs "
        "are dropped (drop_long_pairs) or truncated. Validation BLEU decodes up to "
        "max_length + 16 tokens; the model's position table covers max(max_length, 512); "
        "an export sets its own bounds (export --max-input-length/--max-output-length)."
    )
    tokens_per_batch: int | None = _field(
        4096, "Token-based batching: about this many padded tokens per batch (a length "
        "bucket's batch size is tokens_per_batch // its longest length); exclusive "
        "with batch_size."
    )
    batch_size: int | None = _field(
        None, "Fixed number of sentence pairs per batch; exclusive with tokens_per_batch."
    )
    bucket_boundaries: tuple[int, ...] | None = _field(
        None, "Sequence-length bucket edges for batching; None lets the data "
        "pipeline derive them from max_length."
    )
    subword_nbest: int = _field(
        1, "Subword regularization (Kudo, 2018): each training epoch reads every training "
        "sentence in one of its `subword_nbest` most likely SentencePiece segmentations, "
        "drawn with probability proportional to P(segmentation)**subword_alpha from the "
        "seed and the epoch (a resumed run reads the same ones). 1 = off. Validation, BLEU "
        "and exports use the best segmentation. The candidates are kept in memory (about "
        "subword_nbest tokenized copies of the training set, at most 300,000 pairs); an "
        "epoch keeps the batch count of the best segmentations."
    )
    subword_alpha: float = _field(
        0.2, "Sharpness of the subword_nbest draw (>= 0): 0 draws uniformly among the "
        "candidates, larger values favour the best ones (Multi30K, 16 candidates: the best "
        "one is drawn for 13% of sentences at 0.1, 27% at 0.2, 70% at 0.5, 91% at 1.0)."
    )
    train_subset: int | None = _field(
        None, "Train on only the first N training pairs (None = all), for fast runs."
    )

    # Optimization.
    warmup_steps: int = _field(4000, "Steps of linear learning-rate warmup.")
    lr_scale: float = _field(
        1.0, "Multiplier of the paper's rate d_model**-0.5 * min(step**-0.5, "
        "step * warmup**-1.5)."
    )
    lr_cooldown: float = _field(
        0.0, "Fraction of the run's updates at its end over which the learning rate falls "
        "linearly to zero (a cooldown: TransformerSchedule); 0 = off. The run's length is "
        "`epochs` times the batches per epoch, or with `time_budget_minutes` the epochs "
        "the budget is predicted to hold, replanned after every epoch until the cooldown "
        "begins (BudgetCooldown)."
    )
    lr_cooldown_shape: str = _field(
        "linear", "How the learning rate falls over the cooldown (`lr_cooldown`): 'linear' "
        "(times 1 - p, p going from 0 to 1 over the cooldown) or '1-sqrt' (times 1 - sqrt(p): "
        "faster at first, slower at the end; Hägele et al., 2024)."
    )
    label_smoothing: float = _field(
        0.1, "Probability mass moved from the true token to the other classes."
    )
    clipnorm: float | None = _field(
        None, "Clip each variable's gradient separately to this norm (Keras' clipnorm); "
        "None = off. Not what papers mean by gradient clipping: see global_clipnorm."
    )
    global_clipnorm: float | None = _field(
        None, "Scale all gradients together so their global L2 norm is at most this "
        "(what papers and torch.nn.utils.clip_grad_norm_ mean); None = off."
    )
    epochs: int = _field(10, "Number of passes over the (sub)set of training data.")
    steps_per_epoch: int | None = _field(
        None, "Batches per epoch; None means one full pass over the data. Shorter than a "
        "pass (epochs as checkpoint intervals on a large corpus), each epoch goes on where "
        "the last one stopped in the shuffled passes, so every pair is read in turn."
    )

    time_budget_minutes: float | None = _field(
        None, "Stop before an epoch that would end after this many minutes of training "
        "(over every attempt of the run, validation included; the longest epoch so far, "
        "the first left out once another is timed, predicts the next): `epochs` becomes an "
        "upper bound. A run stopped by its budget is finished. None: no budget. Several "
        "workers share it: each records the slowest worker's epoch times."
    )

    keep_checkpoints: int = _field(
        0, "Keep the weights of the last N epochs in checkpoints/epoch-NNN.weights.npz "
        "for `keras-transformer average` (the paper averages the last 5); 0 = none."
    )

    # Precision.
    precision: str | None = _field(
        None, "Keras dtype policy: None (float32), 'mixed_bfloat16', 'mixed_float16' or "
        "'auto' (mixed_bfloat16 on a CPU-only machine whose CPU has native bfloat16 "
        "instructions, AVX-512 BF16 or AMX; float32 elsewhere: resolve_precision)."
    )

    # Decoding for validation BLEU.
    beam_size: int = _field(4, "Beam width for validation translations (1 = greedy).")
    length_penalty: float = _field(
        0.6, "Length penalty alpha of beam search (GNMT, as in the paper)."
    )
    bleu_sentences: int = _field(
        200, "Validation sentences translated to compute val_bleu; 0 disables it."
    )
    bleu_every_n_epochs: int = _field(
        1, "Compute val_bleu after every this many epochs, and after the run's last (its "
        "`epochs`, or the one its time budget ends it after).")

    # Reproducibility.
    seed: int = _field(1234, "Seed of Python, NumPy, TF and Keras initializers and dropout.")

    def __post_init__(self):
        _check_types(self)
        for field in dataclasses.fields(self):  # NumPy numbers as Python's (JSON writes them)
            value = getattr(self, field.name)
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                # A NumPy float32 as the number it prints as (0.1, not 0.10000000149...).
                object.__setattr__(self, field.name, int(value)
                                   if isinstance(value, numbers.Integral)
                                   else float(str(value)) if type(value).__module__ == "numpy"
                                   else float(value))
        if self.data_files is not None:
            object.__setattr__(self, "data_files", _normalized_data_files(self.data_files))
        if self.bucket_boundaries is not None:
            object.__setattr__(self, "bucket_boundaries",
                               tuple(int(edge) for edge in self.bucket_boundaries))
        _check_ranges(self)
        if self.d_model % self.num_heads:
            raise ValueError(
                f"`d_model` must be divisible by `num_heads`. Received: "
                f"d_model={self.d_model}, num_heads={self.num_heads}"
            )
        if self.d_model % 2:  # the sinusoid table has sine/cosine pairs
            raise ValueError(
                f"`d_model` must be even (sinusoidal positions). Received: "
                f"d_model={self.d_model}"
            )
        if (self.tokens_per_batch is None) == (self.batch_size is None):
            raise ValueError(
                "Set exactly one of `tokens_per_batch` and `batch_size`. Received: "
                f"tokens_per_batch={self.tokens_per_batch}, batch_size={self.batch_size}"
            )
        if self.data not in ("multi30k", "files", "tsv") and not self.data.startswith("tfds:"):
            raise ValueError(
                "`data` must be 'multi30k', 'files', 'tsv' or 'tfds:<name>'. Received: "
                f"{self.data!r}"
            )
        if self.data in ("files", "tsv") and not (self.data_files or {}).get("train"):
            raise ValueError(
                f"`data={self.data!r}` needs `data_files` with a 'train' entry. Received: "
                f"{self.data_files!r}"
            )
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(
                f"`normalization` must be one of {NORMALIZATIONS}. Received: "
                f"{self.normalization!r}"
            )
        if not 0.98 <= self.character_coverage <= 1.0:  # SentencePiece's own range
            raise ValueError(
                "`character_coverage` must be in [0.98, 1]. Received: "
                f"{self.character_coverage}"
            )
        if self.precision not in PRECISIONS:
            raise ValueError(
                f"`precision` must be one of {PRECISIONS}. Received: {self.precision!r}"
            )
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(
                f"`label_smoothing` must be in [0, 1). Received: {self.label_smoothing}"
            )
        if self.clipnorm is not None and self.global_clipnorm is not None:
            raise ValueError(
                "Set at most one of `clipnorm` and `global_clipnorm`. Received: "
                f"clipnorm={self.clipnorm}, global_clipnorm={self.global_clipnorm}"
            )
        if self.keep_checkpoints < 0:
            raise ValueError(
                f"`keep_checkpoints` must be >= 0. Received: {self.keep_checkpoints}"
            )
        if self.time_budget_minutes is not None and not 0 < self.time_budget_minutes < math.inf:
            raise ValueError(  # JSON's Infinity had failed after the first epoch
                "`time_budget_minutes` must be a finite number > 0, or None. Received: "
                f"{self.time_budget_minutes}"
            )
        if not 0.0 <= self.lr_cooldown <= 1.0:
            raise ValueError(f"`lr_cooldown` must be in [0, 1]. Received: {self.lr_cooldown}")
        if self.lr_cooldown_shape not in COOLDOWN_SHAPES:
            raise ValueError(f"`lr_cooldown_shape` must be one of {COOLDOWN_SHAPES}. Received: "
                             f"{self.lr_cooldown_shape!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1). Received: {self.dropout}")
        if self.attention_dropout is not None and not 0.0 <= self.attention_dropout < 1.0:
            raise ValueError("`attention_dropout` must be in [0, 1) or None. Received: "
                             f"{self.attention_dropout}")
        if not 1 <= self.subword_nbest <= MAX_NBEST:
            raise ValueError(f"`subword_nbest` must be in [1, {MAX_NBEST}] (SentencePiece's "
                             f"limit). Received: {self.subword_nbest}")
        if not 0 <= self.subword_alpha < math.inf:
            raise ValueError("`subword_alpha` must be a finite number >= 0. Received: "
                             f"{self.subword_alpha}")
        if self.late_dropout_min_epochs < 0:
            raise ValueError("`late_dropout_min_epochs` must be >= 0. Received: "
                             f"{self.late_dropout_min_epochs}")
        if self.late_dropout is not None and not (0.0 < self.late_dropout < 1.0
                                                  and self.dropout > 0
                                                  and self.late_dropout_after >= 1):
            raise ValueError(
                "`late_dropout` must be in (0, 1), with `dropout` > 0 (the dropouts it raises) "
                "and `late_dropout_after` >= 1. Received: "
                f"late_dropout={self.late_dropout}, dropout={self.dropout}, "
                f"late_dropout_after={self.late_dropout_after}")

    @property
    def decoder_layers(self):
        """int, the number of decoder layers (`num_decoder_layers` or `num_layers`)."""
        return self.num_layers if self.num_decoder_layers is None else self.num_decoder_layers

    def to_dict(self):
        """Returns the fields as a JSON-serializable dict (tuples become lists)."""
        values = dataclasses.asdict(self)
        if values["bucket_boundaries"] is not None:
            values["bucket_boundaries"] = list(values["bucket_boundaries"])
        return values

    def replace(self, **overrides):
        """Returns a copy with `overrides` applied (validated; unknown names raise)."""
        _check_names(overrides)
        return dataclasses.replace(self, **overrides)

    def to_file(self, path):
        """Writes the config as JSON (or YAML if `path` ends with `.yaml`/`.yml`)."""
        with open(path, "w", encoding="utf-8") as f:
            if str(path).endswith((".yaml", ".yml")):
                import yaml

                yaml.safe_dump(self.to_dict(), f, sort_keys=False)
            else:
                json.dump(self.to_dict(), f, indent=2)

    @classmethod
    def from_dict(cls, values):
        """Builds a config from a dict; a `"preset"` key names the preset it overrides."""
        values = dict(values)
        base = values.pop("preset", None)
        _check_names(values)
        if base is not None:
            return get_preset(base).replace(**values)
        return cls(**values)

    @classmethod
    def from_file(cls, path):
        """Reads a config from a JSON or YAML (`.yaml`/`.yml`) file, see `from_dict`."""
        with open(path, encoding="utf-8") as f:
            if str(path).endswith((".yaml", ".yml")):
                import yaml

                try:
                    values = yaml.safe_load(f) or {}
                except yaml.YAMLError as error:
                    raise ValueError(f"{os.fspath(path)!r} is not valid YAML: {error}") from None
            else:
                try:
                    values = json.load(f)
                except json.JSONDecodeError as error:
                    raise ValueError(f"{os.fspath(path)!r} is not valid JSON: {error}") from None
        if not isinstance(values, dict):
            raise ValueError(f"{os.fspath(path)!r} must hold a mapping of field names.")
        return cls.from_dict(values)


def _accepts(annotation, value):
    """Whether `value` is of a field's type (`int | None`, `tuple[int, ...] | None`, ...);
    an int is a float, a bool is not a number."""
    if isinstance(annotation, types.UnionType):
        return any(_accepts(member, value) for member in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    origin = typing.get_origin(annotation) or annotation
    if origin is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if origin is float:
        return isinstance(value, numbers.Real)
    if origin is int:
        return isinstance(value, numbers.Integral)
    if origin is tuple:  # tuple[int, ...]: a list from JSON/YAML too
        return isinstance(value, (tuple, list)) and all(
            _accepts(typing.get_args(annotation)[0], item) for item in value)
    return isinstance(value, origin)


# Fields that must be at least 1 (None allowed where the field allows it) and those that
# must be positive; the rest of the ranges are checked in `__post_init__`.
_AT_LEAST_ONE = ("d_model", "num_heads", "ff_dim", "num_layers", "num_decoder_layers",
                 "tokenizer_sample_pairs", "tokens_per_batch", "batch_size", "train_subset",
                 "warmup_steps", "epochs", "steps_per_epoch", "beam_size",
                 "bleu_every_n_epochs")
_POSITIVE = ("lr_scale", "clipnorm", "global_clipnorm")
# The 4 reserved ids (padding, START, END, unknown) and at least one piece of text.
_MIN_VOCAB_SIZE = 5
# START, one token, END.
_MIN_MAX_LENGTH = 3


def _check_ranges(config):
    """Raises ValueError naming every field whose value is out of its range (a zero batch
    or warm-up had trained with another value, or failed after the vocabulary was written)."""
    wrong = [f"{name}={getattr(config, name)!r} (at least 1)" for name in _AT_LEAST_ONE
             if getattr(config, name) is not None and getattr(config, name) < 1]
    wrong += [f"{name}={getattr(config, name)!r} (a finite number above 0)" for name in _POSITIVE
              if getattr(config, name) is not None
              and not 0 < getattr(config, name) < math.inf]
    if config.vocab_size < _MIN_VOCAB_SIZE:
        wrong.append(f"vocab_size={config.vocab_size} (at least {_MIN_VOCAB_SIZE}: 4 reserved "
                     "ids and the text's pieces)")
    if config.max_length < _MIN_MAX_LENGTH:
        wrong.append(f"max_length={config.max_length} (at least {_MIN_MAX_LENGTH}: START, a "
                     "token, END)")
    for name in ("bleu_sentences", "late_dropout_after"):
        if getattr(config, name) < 0:
            wrong.append(f"{name}={getattr(config, name)} (at least 0)")
    if not math.isfinite(config.length_penalty):
        wrong.append(f"length_penalty={config.length_penalty} (a finite number)")
    if wrong:
        raise ValueError("TrainingConfig field(s) out of range: " + "; ".join(wrong) + ".")


def _normalized_data_files(files):
    """`data_files` as JSON holds it: split names to absolute path strings (a `[source,
    target]` list, or one TSV path), so that a run's `config.json` compares equal to the
    config that wrote it, and a run started from one directory resumes from another.
    Tuples and path-likes are accepted; `~` is expanded, symlinks resolved. Two names of the
    validation split (`VALIDATION_NAMES`) are refused: one would silently replace the other.
    """
    from keras_transformer.data.sources import VALIDATION_NAMES
    from keras_transformer.textfiles import absolute_path

    def absolute(path, split):
        if not isinstance(path, (str, os.PathLike)):
            raise ValueError(f"`data_files[{split!r}]` must hold file paths. Received: {path!r}")
        return absolute_path(path)

    normalized = {}
    for split, paths in files.items():
        if not isinstance(split, str):
            raise ValueError(f"`data_files` keys must be split names. Received: {split!r}")
        normalized[split] = ([absolute(path, split) for path in paths]
                             if isinstance(paths, (list, tuple)) else absolute(paths, split))
    validation = sorted(set(normalized) & set(VALIDATION_NAMES))
    if len(validation) > 1:
        raise ValueError(
            f"`data_files` names the validation split {len(validation)} times ({validation}): "
            "give one of them (the other names are test sets).")
    return normalized


def _check_types(config):
    """Raises ValueError naming every field whose value is not of its declared type."""
    wrong = [f"{field.name}={getattr(config, field.name)!r} (expected {_type_name(field.type)})"
             for field in dataclasses.fields(config)
             if not _accepts(field.type, getattr(config, field.name))]
    if wrong:
        raise ValueError("TrainingConfig field(s) of the wrong type: " + "; ".join(wrong)
                         + ". On the command line values are JSON: --set "
                         "bucket_boundaries=[8,16] data_files='{\"train\": [...]}'.")


def _type_name(annotation):
    """`int | None` -> "int or null" (null: JSON's and YAML's None)."""
    members = (typing.get_args(annotation) if isinstance(annotation, types.UnionType)
               else (annotation,))
    return " or ".join(
        "null" if member is type(None)
        else "a list of integers such as [8, 16]" if typing.get_origin(member) is tuple
        else member.__name__ for member in members)


def _check_names(values):
    known = {f.name for f in dataclasses.fields(TrainingConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(
            f"Unknown TrainingConfig field(s) {unknown}. Valid fields: {sorted(known)}"
        )


PRESETS = {
    # Unit tests and smoke runs: a few seconds on CPU.
    "tiny": TrainingConfig(
        # Byte fallback alone needs 256 pieces plus the reserved ids and characters.
        vocab_size=400,
        d_model=16,
        num_heads=2,
        ff_dim=32,
        num_layers=1,
        dropout=0.0,
        max_length=16,
        # Smoke runs keep every pair: most Multi30K sentences exceed 16 tokens.
        drop_long_pairs=False,
        tokens_per_batch=None,
        batch_size=8,
        train_subset=1000,
        warmup_steps=10,
        epochs=1,
        steps_per_epoch=4,
        beam_size=1,
        bleu_sentences=8,
    ),
    # The reference recipe: best BLEU per minute within ~60 minutes on 2 CPU cores.
    # Machines of this kind differ in speed by up to 1.7x: on the 2026-11-22 machine the
    # model trains at 4,801 real tokens/s (benchmarks/train_throughput.py; 3,700-3,870
    # before the hand-written loss gradient), an epoch of 29,000 pairs with validation takes
    # ~3.8 min, so 14 epochs (~54 min with vocabulary and data preparation) fit in the hour;
    # on the 2026-11-21 machine (5,610 tokens/s before the loss change) 16 epochs took 53 min;
    # the 2026-11-23 machine (AMD EPYC without AVX-512) trains at 3,278 tokens/s, where 14
    # epochs would take ~80 min. So the preset trains for a time budget: 55 minutes of
    # training (`epochs` an upper bound), ~1 min of vocabulary and data preparation on top,
    # and headroom: 14 epochs on the 2026-11-22 machine, fewer on a slower one.
    # A first attempt with warmup 1000 / peak 1e-3 and dropout 0.2 reached only 1.9 val BLEU
    # after 2 epochs: in a budget of ~4,000 updates the peak must come early, so warmup 400
    # (peak ~1.6e-3) and dropout 0.1. Wu et al.'s tiny shape (d 128, ff 256, 4+4 layers) at
    # warmup 1000 had 2.1 val BLEU after 4 epochs (~8 min) where this shape has ~18: see
    # benchmarks/RESULTS.md, "Recipe experiments". Validation BLEU is greedy on 500 sentences
    # every 2 epochs and after the last (beam 4 every epoch would cost ~10% of the budget)
    # and picks checkpoints/best.keras; the last 5 epochs are kept for `keras-transformer average`.
    # The rate falls linearly to zero over the last 30% of the updates the budget holds
    # (lr_cooldown): with the same seed, 8 epochs reached 36.21 greedy validation BLEU
    # (500 sentences) at epoch 8 where the inverse-square-root run had 33.39 (RESULTS.md,
    # "A learning-rate cooldown"). Where the budget holds many epochs the model overfits
    # (validation loss flat from epoch ~15 at dropout 0.1), so after 12 epochs dropout rises
    # to 0.3 (late_dropout), only in a run then planned to last at least 30 epochs: with the
    # same seed, 40 epochs gave 40.61-40.85 beam validation BLEU (alpha 1.0-1.4) against
    # 39.11-39.46 for 38 epochs at 0.1 throughout (RESULTS.md, "Late dropout"), but 25
    # epochs with it gave 39.16 where 21 and 23 without it gave 39.78 and 40.10 (session 31:
    # "Late dropout in a 25-epoch run"); 30 lies between, not measured. bfloat16
    # where the CPU has it (1.32x the tokens/s), so up to 40 epochs. Subword regularization
    # (each epoch draws every sentence's segmentation among its 16 best, alpha 0.3): with
    # the same seed on the same kind of machine, 24 epochs reached 40.85 beam validation
    # BLEU where 21 and 23 without it had 39.78 and 40.10; its greedy validation BLEU was
    # far ahead in the first epochs (32.09 against 23.85 at epoch 6), mixed from epoch 8
    # (RESULTS.md, session 32); alpha 0.1 and 0.5 gave 40.46 and 40.77 (session 33).
    # Batches of 1,536 tokens (356 updates an epoch instead of 269 at 2,048, the same
    # tokens/s) with the warm-up's tokens kept (533 steps, so a peak rate sqrt(3/4) as high):
    # at 16 epochs on a float32 machine, beam validation BLEU higher than 2,048 tokens in 15
    # of 16 checkpoint x alpha x stopping cells with seed 1 (best 40.53 against 40.19) and in
    # 16 of 16 with seed 1234 (40.57 against 39.80; RESULTS.md, sessions 56 and 57); 4,096
    # tokens (warm-up 200) was far behind at epoch 8. Not measured at 40 epochs.
    "multi30k": TrainingConfig(
        vocab_size=8000,
        d_model=256,
        num_heads=4,
        ff_dim=1024,
        num_layers=3,
        dropout=0.1,
        late_dropout=0.3,
        late_dropout_after=12,
        late_dropout_min_epochs=30,
        subword_nbest=16,
        subword_alpha=0.3,
        precision="auto",
        max_length=64,
        tokens_per_batch=1536,
        warmup_steps=533,
        lr_scale=0.5,
        label_smoothing=0.1,
        global_clipnorm=1.0,
        lr_cooldown=0.3,
        epochs=40,
        time_budget_minutes=55.0,
        keep_checkpoints=5,
        beam_size=1,
        length_penalty=0.6,
        bleu_sentences=500,
        bleu_every_n_epochs=2,
    ),
}


# `make run`: the reference recipe with 2+2 layers for 2 epochs, about 5 minutes of training
# on 2 CPU cores. After 2 epochs the d=256 reference model reached 13.8 greedy val BLEU while
# a d=128, 2+2-layer model had 6.8 (measured here), so `quick` keeps the reference width.
# The cooldown over the last 30% of its 2 epochs (inherited from `multi30k`; no budget, so
# the run's length is known) took greedy validation BLEU after epoch 2 from 12.46 to 24.12
# (same seed, same machine, 2026-11-25; benchmarks/RESULTS.md).
# Subword regularization, which the full recipe gains from, lost in these 2 epochs: 22.60
# beam validation BLEU against 23.87 without it (same seed; RESULTS.md, session 32).
# Batches of 2,048 tokens and a 400-step warm-up, as measured for it (the full recipe's
# 1,536 were measured at 16 epochs only).
PRESETS["quick"] = PRESETS["multi30k"].replace(
    num_layers=2, epochs=2, time_budget_minutes=None, bleu_sentences=200, bleu_every_n_epochs=1,
    subword_nbest=1, tokens_per_batch=2048, warmup_steps=400,
)


def parse_overrides(pairs):
    """`--set` items `FIELD=VALUE` -> a dict for `TrainingConfig.replace`.

    Values are read as JSON where they parse (numbers, booleans, `null`, lists), else kept
    as strings. The command line and the benchmark scripts read `--set` with this.

    Args:
        pairs: iterable of str, or `None`.

    Returns:
        dict of field name -> value (not checked here: `replace` checks the fields).

    Raises:
        ValueError: an item without `=`.

    Example:

    >>> parse_overrides(["epochs=2", "bucket_boundaries=[8,16]", "data=files"])
    {'epochs': 2, 'bucket_boundaries': [8, 16], 'data': 'files'}
    """
    overrides = {}
    for pair in pairs or ():
        if "=" not in pair:
            raise ValueError(f"--set expects FIELD=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides


def get_preset(name):
    """Returns the `TrainingConfig` preset called `name`.

    Args:
        name: string, one of `"tiny"`, `"quick"`, `"multi30k"`.

    Returns:
        A `TrainingConfig`.

    Raises:
        ValueError: on an unknown name, listing the valid ones.

    Example:

    >>> get_preset("tiny").d_model
    16
    """
    if name not in PRESETS:
        raise ValueError(
            f"Unknown preset {name!r}. Valid presets: {', '.join(sorted(PRESETS))}."
        )
    return PRESETS[name]

"""`Translator`: strings in, strings out, tokenization and cached search inside one graph."""

import dataclasses
import math
import numbers
import types
import typing

import numpy as np
import tensorflow as tf

from keras_transformer import decoding
from keras_transformer.decoding.sampling import MAX_TEMPERATURE, MIN_SAMPLING_SETTING
from keras_transformer.decoding.utils import check_length_penalty_form
from keras_transformer.export.inference import as_bytes, check_sentence_list
from keras_transformer.model import TransformerParts
from keras_transformer.text import END_ID, PAD_ID, START_ID, UNK_ID, SubwordTokenizer
from keras_transformer.text.subword_tokenizer import strip_whitespace

SEARCHES = ("beam", "greedy", "greedy_uncached", "sample")
IN_PLACE_CACHE = ("beam", "all", "none")
# `export --beam-stopping` and `choose_on_validation.py --beam-stopping`: "early" is
# `DecodingConfig(early_stopping=True)`, "exact" is False.
BEAM_STOPPING = ("early", "exact")


# A line holding no text: whitespace and separators, controls and format characters (zero-width
# spaces and joiners, bidi marks, a BOM) alone (RE2's Unicode classes, a core TensorFlow op).
NO_TEXT_PATTERN = r"[\s\p{Z}\p{Cc}\p{Cf}]*"


# Largest `max_input_length`, `extra_length` and `max_output_length` (tokens): the graph
# adds lengths in int32, which larger settings overflowed (every translation empty).
MAX_DECODING_LENGTH = 2**20


@dataclasses.dataclass
class DecodingConfig:
    """How a `Translator` decodes; fixed when the SavedModel is exported.

    Whatever the search, PAD and START are never produced, and UNK neither unless
    `disable_unk=False`. Invalid values raise `ValueError` here, at export time.

    Position limits: a model with a learned position table (`learned_positions=True`)
    knows only `max_length` positions, so `Translator` refuses a `max_input_length` or a
    `max_output_length` above that number rather than export a graph that fails inside
    the server on the first long request. Sinusoidal positions are computed for any
    position, so they set no limit (quality past the lengths seen in training is another
    matter).
    """

    # "beam", "greedy" (cached), "greedy_uncached" (recomputes the prefix; a reference for
    # benchmarks) or "sample".
    search: str = "beam"
    # Hypotheses kept per sentence by beam search.
    beam_size: int = 4
    # Length-penalty strength: beam search ranks hypotheses by log_prob / ((5 + len) /
    # 6)^alpha (GNMT's, END counted) ...
    alpha: float = 0.6
    # ... or, with "power", by log_prob / len^alpha (END counted too): CTranslate2's
    # `length_penalty`; with `early_stopping` and alpha != 0, its beam search.
    length_penalty_form: str = "gnmt"
    # Beam search: a sentence is done once `beam_size` hypotheses have finished (END ranked
    # among the beam_size best candidates), as in fairseq and CTranslate2. False: once no
    # alive hypothesis can beat the finished ones (`decoding.beam_search`), which with a
    # length penalty decodes longer: on the reference model at alpha 1.4, about 2x the time
    # for +0.16 validation BLEU (benchmarks/RESULTS.md).
    early_stopping: bool = True
    # Longest source in tokens, END included: longer input is truncated to it.
    max_input_length: int = 128
    # A translation may have at most (source tokens + extra_length) tokens ...
    extra_length: int = 50
    # ... and never more than this (the length of the searches' token buffers; the XLA
    # search's cache holds at most this many positions).
    max_output_length: int = 128
    # Sampling only: softmax temperature (> 0), top-k (0 = off), nucleus top-p in (0, 1]
    # (1.0 = off). No seed here: `translate` draws a fresh random seed on every call,
    # `translate_seeded(text, seed)` takes one seed per sentence.
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    # Never produce the UNK piece (CTranslate2's `disable_unk`): it detokenizes to " ⁇ ".
    disable_unk: bool = True
    # Compile the encoder and the search loop with XLA (`jit_compile=True`): fewer, fused
    # kernels per step, a fixed-size decoder cache (as many positions as the batch can
    # decode: its source width plus `extra_length`, at most `max_output_length`). The
    # export then needs a server with XLA CPU compilation enabled (TF Serving:
    # `--xla_cpu_compilation_enabled=true`), and each
    # new (batch size, source width rounded up to a multiple of `JIT_WIDTH_MULTIPLE`) pair
    # compiles once. Off by default: stock servers run without that flag. Greedy and beam
    # search only: in an export searching `sample` or `greedy_uncached`, only
    # `translate_greedy` is compiled.
    jit_compile: bool = False
    # With `jit_compile`: a batch whose search decodes more rows than this (sentences,
    # times `beam_size` for beam search) takes the regular search instead (finished
    # sentences dropped; beam search's cache in place, greedy's growing): on more rows XLA's
    # fixed-size cache and finished rows cost more than its fused kernels save. Measured on
    # the reference model with the cache sized to the batch (session 49), XLA over the
    # regular search: greedy 1.48x at batch 1, 1.39x at 4, 1.10x at 8, 1.00x at 16; beam 4
    # 1.64x at batch 1, 1.49x at 2, 1.11x at 4 (benchmarks/RESULTS.md). Each batch size
    # compiles once (warm the server up). None: XLA at every batch size.
    jit_max_rows: int | None = 8
    # Greedy and beam search: a finished sentence leaves the batch (its rows are dropped
    # from the decoder's cache at the end of the step it finished), so it stops costing
    # compute; the results are the same. Not in the XLA-compiled search (static shapes).
    drop_finished: bool = True
    # Which searches keep the decoder's self-attention keys/values in time-major buffers
    # written in place (`decoding.InPlaceCache`; beam search reorders a table of row
    # ancestries, not the keys and values) instead of a cache grown by concatenation:
    # "beam", "all" (greedy too) or "none". The same results either way. Measured on the
    # reference model (benchmarks/RESULTS.md, three runs): beam search 1.00-1.09x at batch
    # 32 and 1.02-1.17x at batch 1; greedy 1.08x at batch 1 but 0.95x at batch 32 (its
    # finished sentences copy the written positions when they leave), hence "beam". Not in
    # the XLA-compiled search (its fixed-size cache).
    in_place_cache: str = "beam"
    # A tied model's pre-softmax kernel is its target embedding table transposed, `(d_model,
    # V)`, which every call otherwise transposes (the reference model's 8 MB in float32:
    # 1.5-3.3 ms a call on one thread, benchmarks/RESULTS.md, session 35). With
    # `stored_projection` the `Translator` keeps it as a variable of its own, made once at
    # construction in the decoder's compute dtype, and an export saves it (the table's size
    # again). Only for weights that no longer change: a `Translator` kept while training goes
    # on would go on translating with the table of its construction (hence off by default;
    # `keras-transformer export` sets it). Nothing changes for an untied model.
    stored_projection: bool = False

    # What an export sets unlike the defaults above (for weights that no longer change).
    EXPORT_SETTINGS = {"stored_projection": True}

    @classmethod
    def for_export(cls, **settings):
        """The config `keras-transformer export` builds: the defaults, `EXPORT_SETTINGS`
        (the stored projection kernel), then `settings`.

        Benchmarks that mean to time what an export runs build their config with this.

        Example:

        >>> DecodingConfig.for_export(search="greedy").stored_projection
        True
        >>> DecodingConfig.for_export(stored_projection=False).stored_projection
        False
        """
        return cls(**{**cls.EXPORT_SETTINGS, **settings})

    def __post_init__(self):
        if self.search not in SEARCHES:
            raise ValueError(f"search must be one of {SEARCHES}, got search={self.search!r}.")
        # Types first, as the fields declare them: a string alpha, a float length or
        # `early_stopping="exact"` (truthy: the early rule) had failed inside the graph at
        # the first call, or changed results.
        for field in dataclasses.fields(self):
            kinds = (typing.get_args(field.type) if isinstance(field.type, types.UnionType)
                     else (field.type,))
            kind = next((k for k in kinds if k in (int, float, bool)), None)
            name, value = field.name, getattr(self, field.name)
            if kind is None or (value is None and type(None) in kinds):
                continue
            if kind is bool:
                right = isinstance(value, (bool, np.bool_))
            else:
                right = (isinstance(value, numbers.Integral if kind is int else numbers.Real)
                         and not isinstance(value, (bool, np.bool_))
                         and (kind is int or math.isfinite(value)))
            if not right:
                expected = {int: "an int", float: "a finite number", bool: "True or False"}[kind]
                hint = (" (the 'exact' rule is early_stopping=False)"
                        if name == "early_stopping" else "")
                raise ValueError(f"`{name}` must be {expected}{hint}, got {name}={value!r}.")
            setattr(self, name, kind(value))  # NumPy's as Python's (the record is JSON)
        for name in ("beam_size", "max_input_length", "max_output_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be positive, got {name}={getattr(self, name)}.")
        if self.max_input_length < 2:
            raise ValueError("`max_input_length` must be at least 2 (a piece and END), got "
                             f"max_input_length={self.max_input_length}.")
        if self.extra_length < 0:
            raise ValueError(f"`extra_length` must be >= 0, got {self.extra_length}.")
        for name in ("max_input_length", "extra_length", "max_output_length"):
            if getattr(self, name) > MAX_DECODING_LENGTH:  # int32 sums in the graph
                raise ValueError(f"`{name}` must be at most {MAX_DECODING_LENGTH:,} tokens, "
                                 f"got {name}={getattr(self, name)}.")
        if not 0 < self.temperature <= MAX_TEMPERATURE:  # past float32: refused by `sample`
            raise ValueError(
                f"`temperature` must be > 0 and at most {MAX_TEMPERATURE:g} (lower is greedier; "
                f"use search='greedy' for the argmax), got temperature={self.temperature}."
            )
        if self.temperature < MIN_SAMPLING_SETTING:  # logits / temperature past float32
            raise ValueError(
                f"`temperature` must be at least {MIN_SAMPLING_SETTING:g} (use search='greedy' "
                f"for the argmax), got temperature={self.temperature}."
            )
        if self.top_k < 0:
            raise ValueError(f"`top_k` must be an int >= 0 (0 = off), got top_k={self.top_k}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"`top_p` must be in (0, 1] (1 = off), got top_p={self.top_p}.")
        if self.top_p < MIN_SAMPLING_SETTING:  # below float32's normal numbers the nucleus
            raise ValueError(  # comparison failed: uniformly random pieces
                f"`top_p` must be at least {MIN_SAMPLING_SETTING:g} (use search='greedy' for "
                f"the most likely piece), got top_p={self.top_p}."
            )
        sampling = {name: getattr(self, name) for name, off in (
            ("temperature", 1.0), ("top_k", 0), ("top_p", 1.0)) if getattr(self, name) != off}
        if sampling and self.search != "sample":
            raise ValueError(
                f"{sampling} apply to search='sample' only; search={self.search!r} would "
                "ignore them."
            )
        defaults = {field.name: field.default for field in dataclasses.fields(self)}
        beam = {name: getattr(self, name)
                for name in ("beam_size", "alpha", "length_penalty_form", "early_stopping")
                if getattr(self, name) != defaults[name]
                and not (name == "beam_size" and self.beam_size == 1)}  # greedy is beam 1
        if beam and self.search != "beam":
            raise ValueError(
                f"{beam} apply to search='beam' only; search={self.search!r} would ignore them."
            )
        check_length_penalty_form(self.length_penalty_form)
        if self.in_place_cache not in IN_PLACE_CACHE:
            raise ValueError(f"in_place_cache must be one of {IN_PLACE_CACHE}, got "
                             f"in_place_cache={self.in_place_cache!r}.")
        if self.jit_max_rows is not None and self.jit_max_rows < 1:
            raise ValueError(
                f"`jit_max_rows` must be >= 1 (or None: XLA at every batch size), got "
                f"jit_max_rows={self.jit_max_rows}."
            )
        if (self.jit_compile and self.search == "beam" and self.jit_max_rows is not None
                and self.beam_size > self.jit_max_rows):
            raise ValueError(
                f"jit_max_rows={self.jit_max_rows} is below beam_size={self.beam_size}, the "
                "rows one sentence decodes: beam search would never take the XLA search. "
                f"Set jit_max_rows to at least {self.beam_size} (export --jit-max-rows), or "
                "None for every batch size (export --jit-max-rows 0).")


def _check_vocabularies(parts, source_tokenizer, target_tokenizer):
    """Refuses tokenizers whose vocabulary is not the model's (ids past the embedding
    table would fail inside the serving graph, on some inputs only; a larger model
    vocabulary would produce ids the detokenizer rejects)."""
    for side, tokenizer, embedding in (("source", source_tokenizer, parts.source_embedding),
                                       ("target", target_tokenizer, parts.target_embedding)):
        size = getattr(tokenizer, "vocab_size", None)
        if callable(size):  # tensorflow_text's tokenizers: a method
            size = size()
        if size is not None and int(size) != embedding.vocab_size:
            raise ValueError(
                f"The {side} tokenizer has {int(size)} pieces but the model's {side} "
                f"vocabulary has {embedding.vocab_size}: use the tokenizer the model was "
                "trained with (a run's tokenizer/ directory)."
            )


TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")
# One seed per sentence, so that TF Serving's server-side batching, which concatenates
# requests along axis 0, can batch it (a scalar input cannot be batched).
SEED_SPEC = tf.TensorSpec([None], tf.int64, name="seed")


# With `jit_compile`, XLA compiles the search once per (batch size, source width) pair; source
# widths rounded up to a multiple of this bound the compilations (a sentence of 1 to 8
# pieces shares one) at the cost of a few masked source positions.
JIT_WIDTH_MULTIPLE = 8
# Bytes of source text kept per piece of max_input_length before tokenizing: SentencePiece's
# pieces hold at most 16 characters (max_sentencepiece_length) of at most 4 bytes.
MAX_BYTES_PER_PIECE = 64


def padded_width(lengths, multiple=1, limit=None):
    """The source tensor's width: the longest of `lengths` (at least 1), rounded up.

    Args:
        lengths: int32 tensor (B,), source lengths in pieces (END included).
        multiple: Python int >= 1; the width is rounded up to a multiple of it.
        limit: optional Python int; rounding never goes past it (a learned position
            table ends there), though the longest length is always kept.

    Returns:
        A scalar int32 tensor; at least 1, so an empty batch still has a (0, 1) source.

    >>> int(padded_width(tf.constant([3, 5])))
    5
    >>> [int(padded_width(tf.constant(n), multiple=8)) for n in ([3, 5], [8], [9], [])]
    [8, 8, 16, 8]
    >>> int(padded_width(tf.constant([9]), multiple=8, limit=12))
    12
    """
    width = tf.maximum(tf.reduce_max(tf.concat([tf.reshape(lengths, [-1]), [1]], 0)), 1)
    rounded = (width + multiple - 1) // multiple * multiple
    if limit is not None:
        rounded = tf.maximum(tf.minimum(rounded, limit), width)
    return rounded


def _outputs(result):
    """A `SearchResult`'s tokens, float32 scores and int32 lengths (one structure, so that
    `tf.cond` can choose between searches)."""
    return result.tokens, tf.cast(result.scores, tf.float32), tf.cast(result.lengths, tf.int32)


def check_position_limits(parts, config):
    """Refuses decoding lengths past a learned position table (see `DecodingConfig`).

    The encoder embeds up to `max_input_length` source positions and the decoder
    `max_output_length` target positions (`0 ... max_output_length - 1`).

    Args:
        parts: `TransformerParts` of the model.
        config: `DecodingConfig`.

    Raises:
        ValueError: naming the length, the table size and the fix.
    """
    for name, embedding, length in (
        ("max_input_length", parts.source_embedding, config.max_input_length),
        ("max_output_length", parts.target_embedding, config.max_output_length),
    ):
        if not getattr(embedding, "learned_positions", False):
            continue  # sinusoids are defined for every position
        table = embedding.max_length
        if length > table:
            raise ValueError(
                f"{name}={length} exceeds the model's learned position table "
                f"({embedding.name} has {table} positions, the model's max_length): a request "
                f"that long would fail inside the server. Export with {name} <= {table} "
                f"(`--{name.replace('_', '-')} {table}`), or train a model with a larger "
                "max_length or sinusoidal positions."
            )


def _tf_variable(variable):
    """The `tf.Variable` behind a Keras 3 variable (a `tf.Variable` passes through)."""
    inner = getattr(variable, "value", variable)
    return inner if isinstance(inner, tf.Variable) else variable


def fresh_seed():
    """A `(2,)` int64 seed drawn anew on every run of the op.

    The random op's own seeds are 0: `tf.random.uniform` took them from the global seed
    when one was set at trace time (`train()` sets it), and an exported sampling signature
    then drew the same "fresh" seeds in every process that loaded it.
    """
    return tf.raw_ops.RandomUniformInt(shape=[2], minval=tf.constant(0, tf.int64),
                                       maxval=tf.int64.max, seed=0, seed2=0)


class Translator(tf.Module):
    """A trained Transformer with its tokenizers and decoding settings, ready to export.

    `translate(text)` takes a batch of raw sentences (`tf.string [None]`) and returns
    `{"translation": tf.string [None], "score": float32 [None], "length": int32 [None],
    "truncated": bool [None], "unfinished": bool [None]}`: the translation, its
    log-probability under the model, its length in target tokens (END included), whether
    the source was longer than `max_input_length` tokens (END included) and cut to them, and
    whether the translation reached its length limit (`min(source tokens + extra_length,
    max_output_length)`) before END, so that its end is missing. Tokenization, the encoder (run
    once), the cached decoder steps and the search all run inside one `tf.function`, so the
    SavedModel needs no Python and no project import; the tokenizer `.model` files travel as
    SavedModel assets.

    Why a `tf.Module` and not Keras' `ExportArchive`: the exported function is not a Keras
    layer call but string ops, ragged tensors and `tf.while_loop` searches around several
    layer calls; a `tf.Module` tracks the model variables and the tokenizer resources and
    assets directly and lets us declare several signatures with no Keras wrapper between
    them and `tf.saved_model.save`.

    Inputs that must not break it: an empty batch returns empty outputs; a sentence is
    stripped of leading and trailing whitespace first, as training strips its sentences
    (`strip_whitespace`); an empty or whitespace-only sentence translates to `""` (score
    0, length 0); sentences longer than
    `config.max_input_length` tokens are truncated; invalid UTF-8 bytes are replaced by
    U+FFFD before tokenization; output length is bounded by `min(source length +
    extra_length, max_output_length)`.

    Sampling (`config.search == "sample"`): `translate` draws a fresh random seed on
    every call (the sentences of a call get different random numbers).
    `translate_seeded(text, seed)` takes one int64 seed per sentence (`seed: int64 [None]`,
    as long as `text`): a sentence's sample depends only on the sentence and its seed,
    never on the other sentences of the batch, so the same sentence and seed give the same
    sample alone, inside any batch, and under TF Serving's server-side batching. Repeat one
    seed for every sentence to seed a whole request; give one sentence several seeds to get
    several samples of it. Through TF Serving REST:
    `{"signature_name": "translate_seeded", "instances": [{"text": "A dog.", "seed": 7}]}`;
    with saved_model_cli: `--signature_def translate_seeded --input_exprs
    'text=["A dog."];seed=[7]'`. (TF Serving signatures have no optional inputs, hence a
    second signature.)

    Args:
        model: a `keras.Model` from `build_transformer` (or its loaded `.keras` file).
        source_tokenizer: `SubwordTokenizer` of the source language.
        target_tokenizer: `SubwordTokenizer` of the target language (may be the same).
        config: `DecodingConfig`. Defaults to beam search with 4 beams, alpha 0.6.
        metadata: dict of str -> str or None, facts the export answers with its
            `metadata` signature (no input; one scalar string per key), e.g.
            `{"source_lang": "fr", "target_lang": "en", "data": "files"}`: the direction
            travels with the model and TF Serving clients can ask for it. Defaults to
            `None` (empty `source_lang`/`target_lang`).

    Raises:
        ValueError: when the model has learned positions and `config.max_input_length` or
            `config.max_output_length` exceeds its position table.

    Example:
    >>> from keras_transformer import build_transformer
    >>> from keras_transformer.text import train_tokenizers
    >>> pairs = {"en": ["A dog runs.", "Two dogs play in the snow."] * 20,
    ...          "de": ["Ein Hund rennt.", "Zwei Hunde spielen im Schnee."] * 20}
    >>> tokenizer, _ = train_tokenizers(pairs, vocab_size=290, output_dir="vocab")
    >>> model = build_transformer(vocab_size=tokenizer.vocab_size, d_model=16,
    ...                           num_heads=2, ff_dim=32, num_layers=1)
    >>> translator = Translator(model, tokenizer, tokenizer,
    ...                         DecodingConfig(beam_size=4, max_output_length=8))
    >>> outputs = translator.translate(tf.constant(["A dog runs.", "Two dogs."]))
    >>> sorted(outputs), outputs["translation"].shape
    (['length', 'score', 'translation', 'truncated', 'unfinished'], TensorShape([2]))
    """

    def __init__(self, model, source_tokenizer, target_tokenizer, config=None, metadata=None):
        super().__init__(name="translator")
        # The Keras model is kept out of the SavedModel's object graph (behind the plain
        # `TransformerParts`); only its raw `tf.Variable`s are tracked, as Keras'
        # `ExportArchive` does. Tracking the Keras model itself makes each Keras variable save
        # as a *copy* that the TF1 session loader (saved_model_cli, TF Serving) restores while
        # the traced functions read the un-restored originals.
        self.model_variables = [_tf_variable(v) for v in model.variables]
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer
        if config is not None and not isinstance(config, DecodingConfig):
            raise TypeError(f"config must be a DecodingConfig (or None), got "
                            f"{type(config).__name__}: DecodingConfig(**settings).")
        self.config = config or DecodingConfig()
        self._parts = TransformerParts(model)
        _check_vocabularies(self._parts, source_tokenizer, target_tokenizer)
        check_position_limits(self._parts, self.config)
        if self.config.stored_projection and self._parts.output_projection is None:
            table = self._parts.target_embedding.embeddings
            self.projection_kernel = tf.Variable(
                tf.cast(tf.transpose(tf.convert_to_tensor(table)),
                        self._parts.decoder.compute_dtype),
                trainable=False, name="projection_kernel")
            self._parts.projection_kernel = self.projection_kernel
        # autograph=False: the searches are explicit `tf.while_loop`s and the layers branch
        # only on Python values, so nothing needs converting; it also keeps tracing from
        # re-reading source files (a process whose sources changed on disk still traces).
        self._compiled_searches = {
            search: tf.function(
                lambda source_ids, max_lengths, search=search: self._search(
                    source_ids, tf.shape(source_ids)[0], max_lengths, search, compiled=True
                ),
                jit_compile=True,
                autograph=False,
            )
            for search in ("greedy", "beam")
        } if self.config.jit_compile else {}
        self.translate = tf.function(
            lambda text: self._translate(text, self.config.search),
            input_signature=[TEXT_SPEC],
            autograph=False,
        )
        self.translate_greedy = tf.function(
            lambda text: self._translate(text, "greedy"), input_signature=[TEXT_SPEC],
            autograph=False,
        )
        if self.config.search == "sample":
            self.translate_seeded = tf.function(
                lambda text, seed: self._translate(text, "sample", seed),
                input_signature=[TEXT_SPEC, SEED_SPEC],
                autograph=False,
            )
        self.metadata_values = {"source_lang": "", "target_lang": "", **(metadata or {})}
        self.metadata = tf.function(
            lambda: {k: tf.constant("" if v is None else str(v))
                     for k, v in self.metadata_values.items()},
            input_signature=[], autograph=False,
        )

    def _translate(self, text, search, seeds=None):
        # The signature declares `text` (B,), but neither a loaded SavedModel nor a model
        # server checks a request's shape, and Grappler trusts the declaration (an assert on
        # the rank is folded away): a scalar (REST's `{"inputs": "A dog."}`) or a (B, N)
        # batch failed in a strided_slice, and (B, 1) was read as B sentences. EnsureShape
        # runs: "Shape of tensor text [] is not compatible with expected shape [?]".
        text = tf.raw_ops.EnsureShape(input=text, shape=[None])
        text = strip_whitespace(text)  # as training strips its sentences
        batch_size = tf.shape(text)[0]
        config = self.config
        if seeds is not None:
            seeds = tf.raw_ops.EnsureShape(input=seeds, shape=[None])  # as `text`
            check = tf.debugging.assert_equal(
                tf.shape(seeds), tf.shape(text),
                message="`seed` needs one int64 per sentence of `text`",
            )
            with tf.control_dependencies([check]):
                # A row's random stream is the fingerprint of its seed and its (stripped)
                # sentence's hash: the seed alone made sentences sharing one draw the same
                # number at every step (one seed repeated over a request gave correlated
                # samples). Still a function of the sentence and its seed only. Not an XOR
                # of the two: seeds made from the text's own hash would cancel it.
                keys = tf.stack([seeds, tf.strings.to_hash_bucket_fast(text, tf.int64.max)],
                                axis=1)  # (B, 2)
                seeds = tf.bitcast(tf.fingerprint(keys), tf.int64)  # (B, 8) uint8 -> (B,)
        # Bytes past what max_input_length pieces can hold are not tokenized (a 5 MB request
        # took 1.3 s to keep its first pieces): a piece holds at most 16 characters
        # (SentencePiece's max_sentencepiece_length), 64 bytes. The cut may split a
        # character: UTF-8 is made whole again (the split one replaced) on the cut part only.
        max_bytes = config.max_input_length * MAX_BYTES_PER_PIECE
        oversized = tf.strings.length(text) > max_bytes
        cut = tf.strings.unicode_transcode(tf.strings.substr(text, 0, max_bytes), "UTF-8",
                                           "UTF-8", errors="replace")
        cut = tf.where(oversized, cut, text)
        pieces = self.source_tokenizer.tokenize(cut)  # ragged (B, None)
        # Bytes the normalization removes (whitespace runs, zero-width characters) make no
        # pieces: a cut that kept fewer than twice max_input_length pieces may have lost
        # some of the first ones, and that source is tokenized whole. Past twice the bound,
        # what the cut changes (the segmentation of its last word) is far from the pieces
        # kept.
        whole = oversized & (pieces.row_lengths() < 2 * config.max_input_length)
        text = tf.where(whole, text, cut)  # what is tokenized, for the test of no text below
        pieces = tf.cond(tf.reduce_any(whole), lambda: self.source_tokenizer.tokenize(text),
                         lambda: pieces)
        # A source longer than max_input_length (END included) is cut to it: flagged.
        truncated = pieces.row_lengths() + 1 > config.max_input_length
        source = SubwordTokenizer.add_special_tokens(
            pieces, max_length=config.max_input_length, add_end=True
        )  # ragged (B, None), END last
        source_lengths = tf.cast(source.row_lengths(), tf.int32)  # (B,)
        compiles = self._compiles(search)
        width = padded_width(source_lengths, JIT_WIDTH_MULTIPLE if compiles else 1,
                             limit=config.max_input_length)
        source_ids = source.to_tensor(PAD_ID, shape=[batch_size, width])  # (B, S)
        # A sentence without text translates to nothing, not to what the model makes of it:
        # an empty or blank line (END alone), or one of zero-width characters, bidi marks
        # and controls alone, which training drops whatever the vocabulary keeps of them.
        # Its bound is one token, so it does not keep the batch in the search.
        empty = (source_lengths <= 1) | tf.strings.regex_full_match(text, NO_TEXT_PATTERN)
        max_lengths = tf.minimum(source_lengths + config.extra_length, config.max_output_length)
        max_lengths = tf.where(empty, tf.ones_like(max_lengths), max_lengths)

        def regular():
            return _outputs(self._search(source_ids, batch_size, max_lengths, search, seeds))

        if compiles:
            # The tokenizers are not XLA ops: only the encoder and the search are compiled.
            def compiled():
                return _outputs(self._compiled_searches[search](source_ids, max_lengths))

            if config.jit_max_rows is None:
                tokens, scores, lengths = compiled()
            else:
                rows = batch_size * (config.beam_size if search == "beam" else 1)
                tokens, scores, lengths = tf.cond(rows <= config.jit_max_rows, compiled, regular)
        else:
            tokens, scores, lengths = regular()
        # A translation whose last token is not END stopped at its length limit.
        last = tf.gather(tokens, tf.maximum(lengths - 1, 0), axis=1, batch_dims=1)
        return {
            "translation": tf.where(empty, "", self.target_tokenizer.detokenize(tokens)),
            "score": tf.where(empty, tf.zeros_like(scores), scores),
            "length": tf.where(empty, tf.zeros_like(lengths), lengths),
            "truncated": truncated,
            "unfinished": ~empty & (lengths > 0) & tf.not_equal(last, END_ID),
        }

    def _search(self, source_ids, batch_size, max_lengths, search, seeds=None, compiled=False):
        """One search; `compiled`: inside the XLA function (static shapes throughout)."""
        config, parts = self.config, self._parts
        # The padding left out of the encoder's arithmetic, except where XLA needs static
        # shapes.
        encode = parts.encode if compiled else parts.encode_packed
        memory, memory_mask = encode(source_ids)
        common = dict(
            batch_size=batch_size,
            max_length=config.max_output_length,
            start_id=START_ID,
            end_id=END_ID,
            pad_id=PAD_ID,
            max_lengths=max_lengths,
            unk_id=UNK_ID if config.disable_unk else None,
        )
        if search == "greedy_uncached":
            return decoding.greedy_search_uncached(
                lambda prefix, state: parts.full_logits(prefix, *state),
                (memory, memory_mask),
                **common,
            )
        if search in ("greedy", "beam"):
            # The memory part of the cache stays at one row per sentence (not tiled to
            # beams), a search argument so that finished sentences can leave the batch.
            layout = None
            if not compiled and config.in_place_cache in (search, "all"):
                layout = decoding.InPlaceCache(ancestry=search == "beam")
            # XLA's cache has a fixed number of positions, each read at every step (and
            # copied by beam search's reorder): as many as this batch can decode (the
            # source's width, known when XLA compiles, plus `extra_length`), not
            # `max_output_length`. On the `multi30k` model: beam 4 at batch 1 in 0.83-0.87x
            # the time, greedy at batch 4 in 0.87x, at batch 1 in 1.03-1.04x (same
            # translations; benchmarks/RESULTS.md, session 49).
            cache_length = None
            if compiled:
                cache_length = tf.minimum(tf.shape(source_ids)[1] + config.extra_length,
                                          config.max_output_length)
            next_logits, cache, memory_state = parts.search_step(
                memory, memory_mask, config.max_output_length, fixed_length=compiled,
                cache_layout=layout, cache_length=cache_length,
            )
            common.update(sentence_cache=memory_state, cache_rows=layout,
                          drop_finished=config.drop_finished and not compiled)
            if search == "greedy":
                return decoding.greedy_search(next_logits, cache, **common)
            return decoding.beam_search(
                next_logits, cache, beam_size=config.beam_size, alpha=config.alpha,
                early_stopping=config.early_stopping,
                length_penalty_form=config.length_penalty_form, **common
            )
        # Sampling is never compiled (`jit_compile` compiles `translate_greedy` only in a
        # sampling export): the growing cache, faster outside XLA.
        next_logits, cache = parts.step_function(memory, memory_mask, config.max_output_length)
        return decoding.sample(
            next_logits,
            cache,
            temperature=config.temperature,
            top_k=config.top_k,
            top_p=config.top_p,
            # Unseeded: a fresh random seed per call, rows apart by their index. Seeded:
            # each sentence's own key (its seed and its text) into one fixed stream, so
            # nothing else in the batch matters.
            seed=fresh_seed() if seeds is None else 0,
            row_keys=seeds,
            **common,
        )

    @property
    def model(self):
        """The Keras model being exported."""
        return self._parts.model

    def __call__(self, sentences):
        """Translates a list of Python strings; returns a list of Python strings."""
        check_sentence_list(sentences)
        outputs = self.translate(tf.constant([as_bytes(s) for s in sentences], tf.string))
        return [t.decode("utf-8") for t in outputs["translation"].numpy().tolist()]

    def _compiles(self, search):
        """Whether `search` runs under XLA: greedy and beam search with `jit_compile`."""
        return self.config.jit_compile and search in ("greedy", "beam")

    def compiled_signatures(self):
        """The names of the signatures XLA compiles (`jit_compile`): `translate_greedy`, and
        `translate`/`serving_default` when the export's search is greedy or beam."""
        names = {"translate_greedy"} if self._compiles("greedy") else set()
        if self._compiles(self.config.search):
            names |= {"translate", "serving_default"}
        return names

    def signatures(self):
        """The concrete functions exported as signatures, by name.

        `translate` (also `serving_default`): the export-time search; `translate_greedy`
        unless that search is greedy; `translate_seeded(text, seed)` for a sampling export.
        """
        translate = self.translate.get_concrete_function()
        signatures = {"serving_default": translate, "translate": translate,
                      "metadata": self.metadata.get_concrete_function()}
        if self.config.search != "greedy":
            signatures["translate_greedy"] = self.translate_greedy.get_concrete_function()
        if self.config.search == "sample":
            signatures["translate_seeded"] = self.translate_seeded.get_concrete_function()
        return signatures

"""`Translator`: strings in, strings out, tokenization and cached search inside one graph."""

import dataclasses

import tensorflow as tf

from keras_transformer import decoding
from keras_transformer.model import TransformerParts
from keras_transformer.text import END_ID, PAD_ID, START_ID

SEARCHES = ("beam", "greedy", "greedy_uncached", "sample")


@dataclasses.dataclass
class DecodingConfig:
    """How a `Translator` decodes; fixed when the SavedModel is exported."""

    # "beam", "greedy" (cached), "greedy_uncached" (recomputes the prefix; a reference for
    # benchmarks) or "sample".
    search: str = "beam"
    # Hypotheses kept per sentence by beam search.
    beam_size: int = 4
    # GNMT length-penalty strength: hypotheses are ranked by log_prob / ((5 + len) / 6)^alpha.
    alpha: float = 0.6
    # Longest source in tokens, END included: longer input is truncated to it.
    max_input_length: int = 128
    # A translation may have at most (source tokens + extra_length) tokens ...
    extra_length: int = 50
    # ... and never more than this; also the static length of the decoder cache.
    max_output_length: int = 128
    # Sampling only: softmax temperature, top-k (0 = off), nucleus top-p (1.0 = off), seed.
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if self.search not in SEARCHES:
            raise ValueError(f"search must be one of {SEARCHES}, got search={self.search!r}.")
        for name in ("beam_size", "max_input_length", "max_output_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be positive, got {name}={getattr(self, name)}.")
        if self.extra_length < 0:
            raise ValueError(f"`extra_length` must be >= 0, got {self.extra_length}.")


TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")


def _tf_variable(variable):
    """The `tf.Variable` behind a Keras 3 variable (a `tf.Variable` passes through)."""
    inner = getattr(variable, "value", variable)
    return inner if isinstance(inner, tf.Variable) else variable


class Translator(tf.Module):
    """A trained Transformer with its tokenizers and decoding settings, ready to export.

    `translate(text)` takes a batch of raw sentences (`tf.string [None]`) and returns
    `{"translation": tf.string [None], "score": float32 [None], "length": int32 [None]}`:
    the translation, its log-probability under the model, and its length in target tokens
    (END included). Tokenization, the encoder (run once), the cached decoder steps and the
    search all run inside one `tf.function`, so the SavedModel needs no Python and no project
    import; the tokenizer `.model` files travel as SavedModel assets.

    Why a `tf.Module` and not Keras' `ExportArchive`: the exported function is not a Keras
    layer call but string ops, ragged tensors and `tf.while_loop` searches around several
    layer calls; a `tf.Module` tracks the model variables and the tokenizer resources and
    assets directly and lets us declare several signatures with no Keras wrapper between
    them and `tf.saved_model.save`.

    Inputs that must not break it: an empty batch returns empty outputs; an empty or
    whitespace-only sentence gets an (often empty) translation; sentences longer than
    `config.max_input_length` tokens are truncated; invalid UTF-8 bytes are replaced by
    U+FFFD before tokenization; output length is bounded by `min(source length +
    extra_length, max_output_length)`.

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

    Example:
    >>> translator = Translator(model, tokenizer, tokenizer, DecodingConfig(beam_size=4))
    >>> translator.translate(tf.constant(["A dog runs."]))["translation"]
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
        self.config = config or DecodingConfig()
        self._parts = TransformerParts(model)
        # autograph=False: the searches are explicit `tf.while_loop`s and the layers branch
        # only on Python values, so nothing needs converting; it also keeps tracing from
        # re-reading source files (a process whose sources changed on disk still traces).
        self.translate = tf.function(
            lambda text: self._translate(text, self.config.search),
            input_signature=[TEXT_SPEC],
            autograph=False,
        )
        self.translate_greedy = tf.function(
            lambda text: self._translate(text, "greedy"), input_signature=[TEXT_SPEC],
            autograph=False,
        )
        self.metadata_values = {"source_lang": "", "target_lang": "", **(metadata or {})}
        self.metadata = tf.function(
            lambda: {k: tf.constant(str(v)) for k, v in self.metadata_values.items()},
            input_signature=[], autograph=False,
        )

    def _translate(self, text, search):
        text = tf.reshape(text, [-1])
        batch_size = tf.shape(text)[0]
        config = self.config
        source = self.source_tokenizer.tokenize(
            text, max_length=config.max_input_length, add_end=True
        )  # ragged (B, None), END last
        source_lengths = tf.cast(source.row_lengths(), tf.int32)  # (B,)
        # At least one column, so an empty batch still has a well-formed (0, 1) source.
        width = tf.maximum(tf.reduce_max(tf.concat([source_lengths, [1]], 0)), 1)
        source_ids = source.to_tensor(PAD_ID, shape=[batch_size, width])  # (B, S)
        max_lengths = tf.minimum(source_lengths + config.extra_length, config.max_output_length)
        result = self._search(source_ids, batch_size, max_lengths, search)
        return {
            "translation": self.target_tokenizer.detokenize(result.tokens),
            "score": tf.cast(result.scores, tf.float32),
            "length": tf.cast(result.lengths, tf.int32),
        }

    def _search(self, source_ids, batch_size, max_lengths, search):
        config, parts = self.config, self._parts
        memory, memory_mask = parts.encode(source_ids)
        common = dict(
            batch_size=batch_size,
            max_length=config.max_output_length,
            start_id=START_ID,
            end_id=END_ID,
            pad_id=PAD_ID,
            max_lengths=max_lengths,
        )
        if search == "greedy_uncached":
            return decoding.greedy_search_uncached(
                lambda prefix, state: parts.full_logits(prefix, *state),
                (memory, memory_mask),
                **common,
            )
        cache = parts.initial_cache(memory, memory_mask, config.max_output_length)
        if search == "greedy":
            return decoding.greedy_search(parts.next_logits, cache, **common)
        if search == "beam":
            return decoding.beam_search(
                parts.next_logits, cache, beam_size=config.beam_size, alpha=config.alpha, **common
            )
        return decoding.sample(
            parts.next_logits,
            cache,
            temperature=config.temperature,
            top_k=config.top_k,
            top_p=config.top_p,
            seed=config.seed,
            **common,
        )

    @property
    def model(self):
        """The Keras model being exported."""
        return self._parts.model

    def __call__(self, sentences):
        """Translates a list of Python strings; returns a list of Python strings."""
        outputs = self.translate(tf.constant(list(sentences), tf.string))
        return [t.decode("utf-8") for t in outputs["translation"].numpy().tolist()]

    def signatures(self):
        """The concrete functions exported as signatures (`serving_default` = `translate`)."""
        translate = self.translate.get_concrete_function()
        signatures = {"serving_default": translate, "translate": translate,
                      "metadata": self.metadata.get_concrete_function()}
        if self.config.search != "greedy":
            signatures["translate_greedy"] = self.translate_greedy.get_concrete_function()
        return signatures

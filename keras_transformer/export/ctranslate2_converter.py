"""Converts a trained model into a CTranslate2 `TransformerSpec` model directory.

CTranslate2 (OpenNMT's C++ inference engine) runs this exact architecture, so the converted
weights serve two purposes: a speed peer for the exported SavedModel
(`benchmarks/decode_vs_ctranslate2.py`) and a correctness oracle (its greedy output must equal
ours token for token, `tests/export/test_ctranslate2.py`).

The mapping, checked against `ctranslate2/specs/transformer_spec.py` and its OpenNMT-tf
converter (`ctranslate2/converters/opennmt_tf.py`, the closest analogue):

- `pre_norm` follows our `norm_first`: post-norm sub-layers compute `LayerNorm(x + f(x))`,
  pre-norm ones `x + f(LayerNorm(x))` with a final norm per stack, in both engines;
- token embeddings are scaled by sqrt(d_model) in both (`scale_embeddings`);
- positions: CTranslate2's built-in sinusoids put all sines before all cosines and start at
  another offset than ours, so the converter writes our own table (sin on even, cos on odd
  dimensions, position 0 first) explicitly, or the learned table;
- Keras `Dense` kernels are `(in, out)`; CTranslate2 linear weights are `(out, in)`;
  self-attention's query/key/value are fused into one linear, cross-attention's key/value
  into one, as CTranslate2 expects;
- the tied projection is the target embedding matrix (no bias); CTranslate2 stores an array
  used twice only once;
- the vocabulary is the SentencePiece model's pieces in id order, so ids agree: `<pad>` 0,
  `<s>` 1 (START, the decoder start token), `</s>` 2 (END, appended to every source as our
  tokenizer does: `add_source_eos`), `<unk>` 3;
- `layer_norm_epsilon` is ours (Keras' default 1e-3 differs from CTranslate2's 1e-6 default).

A converted directory is self-contained: CTranslate2's `model.bin`, `config.json` and
vocabularies, the SentencePiece models (`source.model`, `target.model`) and
`keras_transformer.json` (the direction, the checkpoint and the decoding settings), so that
`CTranslate2Translator(directory)` translates raw strings as our `translate` signature does.
`keras-transformer export-ctranslate2` writes one from a run, after checking that the two
engines' greedy translations agree on the run's validation sentences.

`ctranslate2` is imported only when converting or translating: it is an optional dependency
(`pip install keras-transformer[ctranslate2]`), not a runtime one.
"""

import json
import os
import pathlib
import shutil

import numpy as np

from keras_transformer.export.ctranslate2_translator import (
    DEFAULT_SETTINGS,
    SOURCE_MODEL_NAME,
    TARGET_MODEL_NAME,
    CTranslate2Translator,
    check_position_tables,
    import_ctranslate2,
)
from keras_transformer.export.inference import CTRANSLATE2_METADATA_NAME
from keras_transformer.layers.positional_embedding import sinusoidal_encoding
from keras_transformer.text import END_ID, PAD_ID, START_ID, UNK_ID
from keras_transformer.textfiles import is_url

# CTranslate2's names of our reserved pieces (SentencePiece's defaults, as our models use).
SPECIAL_PIECES = {PAD_ID: "<pad>", START_ID: "<s>", END_ID: "</s>", UNK_ID: "<unk>"}
# Positions in the converted table when the model has no learned table to bound them.
DEFAULT_MAX_POSITIONS = 1024
# The share of greedy translations the check needs the same in both engines: float32
# kernels that sum in another order can flip a near-tie now and then.
MIN_SAME_SHARE = 0.9


def _weights_by_path(model):
    """`{"encoder/block_0/self_attention/query/kernel": np.ndarray, ...}`, float32."""
    return {v.path: np.asarray(v.numpy(), dtype=np.float32) for v in model.weights}


class _Reader:
    """Reads the model's weights by layer path, failing with the missing path named."""

    def __init__(self, model):
        self.weights = _weights_by_path(model)

    def __call__(self, path):
        if path not in self.weights:
            raise ValueError(
                f"The model has no weight {path!r}; is it a model from build_transformer? "
                f"It has {sorted(self.weights)[:8]}..."
            )
        return self.weights[path]

    def has(self, path):
        return path in self.weights


def _set_linear(spec, read, prefix):
    spec.weight = np.ascontiguousarray(read(f"{prefix}/kernel").T)  # (out, in)
    if read.has(f"{prefix}/bias"):
        spec.bias = read(f"{prefix}/bias")


def _set_fused_linear(spec, read, prefixes):
    """One linear from several `Dense` layers: weights stacked along the output axis."""
    spec.weight = np.concatenate([read(f"{p}/kernel").T for p in prefixes], axis=0)
    if all(read.has(f"{p}/bias") for p in prefixes):
        spec.bias = np.concatenate([read(f"{p}/bias") for p in prefixes], axis=0)


def _set_layer_norm(spec, read, prefix):
    spec.gamma = read(f"{prefix}/gamma")
    spec.beta = read(f"{prefix}/beta")


def _set_attention(spec, read, prefix, self_attention):
    names = [f"{prefix}/{name}" for name in ("query", "key", "value")]
    if self_attention:
        _set_fused_linear(spec.linear[0], read, names)
    else:
        _set_fused_linear(spec.linear[0], read, names[:1])
        _set_fused_linear(spec.linear[1], read, names[1:])
    _set_linear(spec.linear[-1], read, f"{prefix}/attention_output")
    _set_layer_norm(spec.layer_norm, read, f"{prefix}_norm")


def _set_feed_forward(spec, read, prefix):
    _set_linear(spec.linear_0, read, f"{prefix}/feed_forward/inner_dense")
    _set_linear(spec.linear_1, read, f"{prefix}/feed_forward/output_dense")
    _set_layer_norm(spec.layer_norm, read, f"{prefix}/feed_forward_norm")


def _position_table(read, embedding_name, d_model, max_positions):
    learned = f"{embedding_name}/position_embeddings"
    if read.has(learned):
        return read(learned)
    return np.asarray(sinusoidal_encoding(max_positions, d_model), dtype=np.float32)


def _activation(name):
    from ctranslate2.specs import common_spec  # build_spec, the caller, checked the import

    activations = {
        "relu": common_spec.Activation.RELU,
        "gelu": common_spec.Activation.GELU,
        "swish": common_spec.Activation.SWISH,
        "silu": common_spec.Activation.SWISH,
        "tanh": common_spec.Activation.Tanh,
    }
    if name not in activations:
        raise ValueError(f"CTranslate2 has no {name!r} activation; it has {sorted(activations)}.")
    return activations[name]


def vocabulary(tokenizer):
    """The tokenizer's pieces in id order (CTranslate2 maps token strings to ids by position).

    Raises:
        ValueError: when the reserved ids are not CTranslate2's `<pad>`, `<s>`, `</s>`, `<unk>`.
    """
    pieces = [p.decode("utf-8") for p in
              tokenizer.id_to_piece(np.arange(tokenizer.vocab_size, dtype=np.int32)).numpy()]
    for token_id, piece in SPECIAL_PIECES.items():
        if pieces[token_id] != piece:
            raise ValueError(
                f"Id {token_id} is {pieces[token_id]!r} in the vocabulary, CTranslate2 expects "
                f"{piece!r}."
            )
    return pieces


def build_spec(model, source_tokenizer, target_tokenizer, max_positions=None):
    """The `ctranslate2.specs.TransformerSpec` of a model from `build_transformer`.

    Args:
        model: a `keras.Model` from `build_transformer` (or its loaded `.keras` file).
        source_tokenizer: `SubwordTokenizer` of the source language.
        target_tokenizer: `SubwordTokenizer` of the target language (may be the same).
        max_positions: int or None, rows of the sinusoid table written. Defaults to the
            learned table's size, or `DEFAULT_MAX_POSITIONS`.

    Returns:
        A validated `TransformerSpec` with vocabularies and configuration.
    """
    import_ctranslate2()
    from ctranslate2.specs import transformer_spec

    encoder_config = model.get_layer("encoder").get_config()
    decoder_config = model.get_layer("decoder").get_config()
    read = _Reader(model)
    shared = read.has("embedding/embeddings")
    source_name, target_name = ("embedding", "embedding") if shared else (
        "source_embedding", "target_embedding")
    d_model = read(f"{source_name}/embeddings").shape[1]
    max_positions = max_positions or DEFAULT_MAX_POSITIONS

    encoder_spec = transformer_spec.TransformerEncoderSpec(
        encoder_config["num_layers"],
        encoder_config["num_heads"],
        pre_norm=encoder_config["norm_first"],
        activation=_activation(encoder_config["activation"]),
    )
    decoder_spec = transformer_spec.TransformerDecoderSpec(
        decoder_config["num_layers"],
        decoder_config["num_heads"],
        pre_norm=decoder_config["norm_first"],
        activation=_activation(decoder_config["activation"]),
    )
    spec = transformer_spec.TransformerSpec(encoder_spec, decoder_spec)

    encoder_spec.embeddings[0].weight = read(f"{source_name}/embeddings")
    encoder_spec.position_encodings.encodings = _position_table(
        read, source_name, d_model, max_positions)
    for index, layer in enumerate(encoder_spec.layer):
        prefix = f"encoder/block_{index}"
        _set_attention(layer.self_attention, read, f"{prefix}/self_attention", True)
        _set_feed_forward(layer.ffn, read, prefix)
    if encoder_config["norm_first"]:
        _set_layer_norm(encoder_spec.layer_norm, read, "encoder/final_norm")

    decoder_spec.embeddings.weight = read(f"{target_name}/embeddings")
    decoder_spec.position_encodings.encodings = _position_table(
        read, target_name, d_model, max_positions)
    for index, layer in enumerate(decoder_spec.layer):
        prefix = f"decoder/block_{index}"
        _set_attention(layer.self_attention, read, f"{prefix}/self_attention", True)
        _set_attention(layer.attention, read, f"{prefix}/cross_attention", False)
        _set_feed_forward(layer.ffn, read, prefix)
    if decoder_config["norm_first"]:
        _set_layer_norm(decoder_spec.layer_norm, read, "decoder/final_norm")
    if read.has("output_projection/kernel"):
        _set_linear(decoder_spec.projection, read, "output_projection")
    else:  # tied: logits = hidden @ embeddings^T, no bias
        decoder_spec.projection.weight = read(f"{target_name}/embeddings")

    spec.config.layer_norm_epsilon = float(decoder_config["layer_norm_epsilon"])
    spec.config.add_source_bos = False
    spec.config.add_source_eos = True  # our source ends with END, as the tokenizer adds it
    spec.config.bos_token = SPECIAL_PIECES[START_ID]
    spec.config.eos_token = SPECIAL_PIECES[END_ID]
    spec.config.unk_token = SPECIAL_PIECES[UNK_ID]
    spec.config.decoder_start_token = SPECIAL_PIECES[START_ID]
    spec.register_source_vocabulary(vocabulary(source_tokenizer))
    spec.register_target_vocabulary(vocabulary(target_tokenizer))
    spec.validate()
    return spec


def convert(model, source_tokenizer, target_tokenizer, output_dir, quantization=None,
            max_positions=None, metadata=None):
    """Writes a self-contained CTranslate2 model directory for `CTranslate2Translator`.

    Args:
        model: a `keras.Model` from `build_transformer`.
        source_tokenizer: `SubwordTokenizer` of the source language.
        target_tokenizer: `SubwordTokenizer` of the target language (may be the same).
        output_dir: str or path-like, the directory to write (created; must not hold a model).
        quantization: str or None, CTranslate2 weight type ("int8", "float16", ...).
            Defaults to `None` (float32; CTranslate2 can still compute in int8 when it
            loads it: `compute_type`).
        max_positions: int or None, rows of a sinusoid table at least (see
            `build_spec`); the decoding bounds' lengths are always covered.
        metadata: dict or None, written into `keras_transformer.json`; its `"decoding"`
            dict sets `CTranslate2Translator`'s defaults (those of `DEFAULT_SETTINGS` it
            leaves out kept). Defaults to `None`.

    Returns:
        `pathlib.Path` of `output_dir`, holding `model.bin`, `config.json`, the
        vocabularies, `source.model`, `target.model` and `keras_transformer.json`.

    Raises:
        FileExistsError: when `output_dir` already holds a `model.bin`.
        ValueError: when the decoding bounds reach past a learned position table (a
            sinusoid table is written as long as `max_positions` and the bounds need),
            before anything is written.

    Example (needs a trained run, so not a doctest):

        model, src_tok, tgt_tok, _ = load_run("runs/quick")
        path = convert(model, src_tok, tgt_tok, "runs/quick/ctranslate2")
        CTranslate2Translator(path)(["A dog runs."])
    """
    output_dir = pathlib.Path(output_dir)
    if (output_dir / "model.bin").exists():
        raise FileExistsError(f"{output_dir} already holds a CTranslate2 model (model.bin).")
    metadata = dict(metadata or {})
    decoding = {**DEFAULT_SETTINGS, **metadata.pop("decoding", {})}
    # Sinusoids for every position the bounds reach; a learned table is what it is.
    max_positions = max(max_positions or DEFAULT_MAX_POSITIONS, decoding["max_input_length"],
                        decoding["max_output_length"])
    spec = build_spec(model, source_tokenizer, target_tokenizer, max_positions=max_positions)
    # The tables' rows, so that every later setting is checked against them too.
    positions = {"source": spec.encoder.position_encodings.encodings.shape[0],
                 "target": spec.decoder.position_encodings.encodings.shape[0]}
    check_position_tables(decoding, positions)
    spec.optimize(quantization=quantization)
    output_dir.mkdir(parents=True, exist_ok=True)
    spec.save(str(output_dir))
    shutil.copyfile(source_tokenizer.model_path, output_dir / SOURCE_MODEL_NAME)
    shutil.copyfile(target_tokenizer.model_path, output_dir / TARGET_MODEL_NAME)
    record = {"quantization": quantization, **metadata, "decoding": decoding,
              "positions": positions, "ctranslate2": import_ctranslate2().__version__}
    (output_dir / CTRANSLATE2_METADATA_NAME).write_text(json.dumps(record, indent=2) + "\n")
    return output_dir


def compare_greedy(model, source_tokenizer, target_tokenizer, directory, sentences,
                   batch_size=32):
    """Greedy translations of `sentences` by our model and by the converted `directory`.

    Returns:
        dict: `compared` (sentences whose translation ended within our export's bound, the
        ones both engines can agree on), `same` (of those, identical in both engines),
        `examples` (up to 3 `(source, ours, theirs)` that differ).
    """
    import tensorflow as tf

    from keras_transformer.export.translator import DecodingConfig, Translator

    theirs_translator = CTranslate2Translator(directory, signature="translate_greedy")
    ours_translator = Translator(model, source_tokenizer, target_tokenizer, DecodingConfig(
        search="greedy", max_output_length=theirs_translator.max_output_length,
        max_input_length=theirs_translator.max_input_length))
    compared = same = 0
    examples = []
    for start in range(0, len(sentences), batch_size):
        batch = sentences[start:start + batch_size]
        outputs = ours_translator.translate(tf.constant(batch))
        ours = [t.decode("utf-8") for t in outputs["translation"].numpy()]
        theirs = theirs_translator(batch)
        for source, a, b, unfinished in zip(batch, ours, theirs, outputs["unfinished"].numpy()):
            if unfinished:  # cut by our export's source-relative bound, which CTranslate2 lacks
                continue
            compared += 1
            if a == b:
                same += 1
            elif len(examples) < 3:
                examples.append((source, a, b))
    return {"compared": compared, "same": same, "examples": examples}


def check_output_dir(output_dir):
    """`output_dir` as the absolute directory `convert_run` creates (a symbolic link's
    target), refused before anything slow runs when it exists and is not an empty directory.

    Raises:
        FileExistsError: naming it.
        ValueError: for a URL (`gs://...` would be a local directory named `gs:`).
    """
    if is_url(output_dir):
        raise ValueError(f"{os.fspath(output_dir)} is a URL: the conversion writes a local "
                         "directory; convert to a local --out, then copy it.")
    output_dir = pathlib.Path(os.path.realpath(output_dir))
    if output_dir.exists() and not (output_dir.is_dir() and not any(output_dir.iterdir())):
        raise FileExistsError(f"{output_dir} exists and is not an empty directory: give a new "
                              "one.")
    return output_dir


def convert_run(run_dir, output_dir, checkpoint="best", check_sentences=None, metadata=None):
    """Converts a run's checkpoint (see `load_run`) into `output_dir`, written whole or not
    at all: staged beside it and renamed into place once converted and checked.

    Args:
        run_dir: str or path-like, a run directory of `train`.
        output_dir: str or path-like, the directory to create (absent or empty; its parent
            is created).
        checkpoint: `"best"`, `"final"`, `"last"` or `"averaged"`. Defaults to `"best"`.
        check_sentences: list of str or None, sentences whose greedy translations must be
            the same in both engines (at least `MIN_SAME_SHARE` of those that end within
            the length bound, and at least one must). Defaults to `None` (no check).
        metadata: dict or None, more entries for `keras_transformer.json`; its `"decoding"`
            dict sets the translator's defaults (`DEFAULT_SETTINGS`).

    Returns:
        `(path, check)`: the directory, and `compare_greedy`'s dict (None without a check).

    Raises:
        FileExistsError: when `output_dir` exists and is not an empty directory.
        ValueError: when the lengths exceed a learned position table, or the check fails
            (nothing is written).
    """
    from keras_transformer.export.run import load_run
    from keras_transformer.export.translator import DecodingConfig, check_position_limits
    from keras_transformer.model import TransformerParts
    from keras_transformer.textfiles import flush_to_disk, partial_path, remove_stale_partials

    output_dir = check_output_dir(output_dir)
    import_ctranslate2()  # before the model loads
    decoding = {**DEFAULT_SETTINGS, **(metadata or {}).get("decoding", {})}
    # The bounds as our export checks them (max_input_length at least 2: END and a token).
    bounds = DecodingConfig(search="greedy", max_input_length=decoding["max_input_length"],
                            max_output_length=decoding["max_output_length"])
    model, source_tokenizer, target_tokenizer, config = load_run(run_dir, checkpoint)
    check_position_limits(TransformerParts(model), bounds)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(output_dir.parent)
    staging = partial_path(output_dir)
    shutil.rmtree(staging, ignore_errors=True)  # a killed process's of this same id
    # The direction and the training configuration, as an export records them: `evaluate`
    # finds the run's data and languages in them.
    record = {"source_lang": config.get("source_lang"), "target_lang": config.get("target_lang"),
              "run_dir": str(pathlib.Path(run_dir).resolve()), **(metadata or {}),
              "training_config": config}
    try:
        # `convert` writes sinusoids for every position the record's bounds reach.
        convert(model, source_tokenizer, target_tokenizer, staging, metadata=record)
        check = None
        if check_sentences is not None:
            check_sentences = list(check_sentences)
            check = compare_greedy(model, source_tokenizer, target_tokenizer, staging,
                                   check_sentences)
            _check_agreement(check)
        # How the conversion was checked, with the rest of its record.
        record_path = staging / CTRANSLATE2_METADATA_NAME
        written = json.loads(record_path.read_text())
        written["check"] = {"sentences": 0} if check is None else {
            "sentences": len(check_sentences), "compared": check["compared"],
            "same": check["same"]}
        record_path.write_text(json.dumps(written, indent=2) + "\n")
        for file in staging.iterdir():
            flush_to_disk(file)
        os.replace(staging, output_dir)  # over an empty directory too
        flush_to_disk(output_dir.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output_dir, check


def _check_agreement(check):
    """Refuses a conversion whose greedy translations (`compare_greedy`'s dict) are not
    ours, or that could not be compared on any sentence."""
    if not check["compared"]:
        raise ValueError(
            "None of the check's greedy translations ended within the length bound, so the "
            "conversion could not be compared with our model (an undertrained model?): "
            "nothing was written. Check on other sentences, or convert without the check.")
    if check["same"] < MIN_SAME_SHARE * check["compared"]:
        shown = "\n".join(f"  SRC: {s}\n  OURS: {a}\n  CTRANSLATE2: {b}"
                          for s, a, b in check["examples"])
        raise ValueError(
            f"The converted model's greedy translations differ from ours in "
            f"{check['compared'] - check['same']} of {check['compared']} sentences "
            f"(at most {1 - MIN_SAME_SHARE:.0%} may, from float rounding): the "
            f"conversion is not faithful, nothing was written. For example:\n{shown}")

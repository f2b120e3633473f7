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

`ctranslate2` is imported only when converting: it is a benchmark/test dependency (the
`bench` extra), not a runtime one.
"""

import pathlib

import numpy as np

from keras_transformer.layers.positional_embedding import sinusoidal_encoding
from keras_transformer.text import END_ID, PAD_ID, START_ID, UNK_ID

# CTranslate2's names of our reserved pieces (SentencePiece's defaults, as our models use).
SPECIAL_PIECES = {PAD_ID: "<pad>", START_ID: "<s>", END_ID: "</s>", UNK_ID: "<unk>"}
# Positions in the converted table when the model has no learned table to bound them.
DEFAULT_MAX_POSITIONS = 1024


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
    from ctranslate2.specs import common_spec

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
            max_positions=None):
    """Writes a CTranslate2 model directory for `ctranslate2.Translator(output_dir)`.

    Args:
        model: a `keras.Model` from `build_transformer`.
        source_tokenizer: `SubwordTokenizer` of the source language.
        target_tokenizer: `SubwordTokenizer` of the target language (may be the same).
        output_dir: str or path-like, the directory to write (created; must not hold a model).
        quantization: str or None, CTranslate2 weight type ("int8", "float16", ...).
            Defaults to `None` (float32).
        max_positions: int or None, see `build_spec`.

    Returns:
        `pathlib.Path` of `output_dir`, holding `model.bin`, `config.json` and the
        vocabularies.

    Example (needs a trained run, so not a doctest):

        model, src_tok, tgt_tok, _ = load_run("runs/quick")
        path = convert(model, src_tok, tgt_tok, "runs/quick/ctranslate2")
        ctranslate2.Translator(str(path)).translate_batch([["▁A", "▁dog", "▁runs", "."]])
    """
    spec = build_spec(model, source_tokenizer, target_tokenizer, max_positions=max_positions)
    spec.optimize(quantization=quantization)
    output_dir = pathlib.Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    spec.save(str(output_dir))
    return output_dir


def convert_run(run_dir, output_dir, checkpoint="best", quantization=None):
    """`convert` for a training run directory's checkpoint (see `load_run`)."""
    from keras_transformer.export.run import load_run

    model, source_tokenizer, target_tokenizer, _ = load_run(run_dir, checkpoint)
    return convert(model, source_tokenizer, target_tokenizer, output_dir,
                   quantization=quantization)

"""`build_transformer`: the encoder-decoder Transformer as a Keras functional model."""

import keras
from keras import ops

from keras_transformer.layers import Decoder, Encoder, PositionalEmbedding

ENCODER_INPUT = "encoder_tokens"
DECODER_INPUT = "decoder_tokens"


def _check_positive(**values):
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"`{name}` must be a positive integer, got {name}={value!r}.")


def build_transformer(
    vocab_size,
    target_vocab_size=None,
    d_model=512,
    num_heads=8,
    ff_dim=2048,
    num_layers=6,
    num_decoder_layers=None,
    dropout=0.1,
    attention_dropout=None,
    activation="relu",
    norm_first=False,
    tie_embeddings=True,
    learned_positions=False,
    max_length=512,
    layer_norm_epsilon=1e-6,
    name="transformer",
):
    """Builds the encoder-decoder Transformer of Vaswani et al. (2017) as a `keras.Model`.

    The model maps `{"encoder_tokens": int32 (B, S), "decoder_tokens": int32 (B, T)}` (token id
    0 is padding) to float32 logits `(B, T, V_target)` for the next target token at each
    position (teacher forcing: `decoder_tokens` is the target shifted right behind a start
    token). The logits stay float32 under a mixed-precision policy.

    Weight tying (`tie_embeddings=True`): with one shared vocabulary (`target_vocab_size` not
    given) the source embedding, the target embedding and the pre-softmax projection are one
    matrix (one `PositionalEmbedding` layer named `embedding`); with separate vocabularies the
    target embedding and the projection share one. Without tying, the projection is a `Dense`
    named `output_projection` (with bias) and each vocabulary has its own embedding.

    Args:
        vocab_size: int, source vocabulary size (and target one when shared).
        target_vocab_size: int or `None`, a separate target vocabulary. Defaults to `None`.
        d_model: int, model width. Defaults to `512`.
        num_heads: int, attention heads; must divide `d_model`. Defaults to `8`.
        ff_dim: int, feed-forward inner width. Defaults to `2048`.
        num_layers: int, encoder blocks (and decoder blocks by default). Defaults to `6`.
        num_decoder_layers: int or `None`, decoder blocks. Defaults to `num_layers`.
        dropout: float, P_drop on embeddings and sub-layer outputs. Defaults to `0.1`.
        attention_dropout: float or `None`, dropout on attention weights. Defaults to `dropout`.
        activation: feed-forward activation. Defaults to `"relu"`.
        norm_first: bool, pre-norm blocks with a final norm per stack instead of the paper's
            post-norm. Defaults to `False`.
        tie_embeddings: bool, share embedding and projection matrices. Defaults to `True`.
        learned_positions: bool, learned position table instead of sinusoids. Defaults to
            `False`.
        max_length: int, longest sequence (size of a learned position table; documents the
            longest input the model was meant for). Defaults to `512`.
        layer_norm_epsilon: float. Defaults to `1e-6`.
        name: str, model name. Defaults to `"transformer"`.

    Returns:
        A `keras.Model`.

    Raises:
        ValueError: on non-positive sizes, `d_model % num_heads != 0`, an odd `d_model` with
            sinusoidal positions, or a dropout rate outside `[0, 1)`.

    Example:
    >>> model = build_transformer(vocab_size=1000, d_model=64, num_heads=4, ff_dim=128,
    ...                           num_layers=2)
    >>> model.count_params()
    231424

    References:
        Vaswani et al., "Attention Is All You Need", 2017.
    """
    num_decoder_layers = num_layers if num_decoder_layers is None else num_decoder_layers
    shared_vocabulary = target_vocab_size is None
    target_vocab_size = vocab_size if shared_vocabulary else target_vocab_size
    _check_positive(
        vocab_size=vocab_size,
        target_vocab_size=target_vocab_size,
        d_model=d_model,
        num_heads=num_heads,
        ff_dim=ff_dim,
        num_layers=num_layers,
        num_decoder_layers=num_decoder_layers,
        max_length=max_length,
    )
    if d_model % num_heads:
        raise ValueError(
            f"d_model must be divisible by num_heads, got d_model={d_model} and "
            f"num_heads={num_heads}."
        )
    if not learned_positions and d_model % 2:
        raise ValueError(
            f"Sinusoidal positions need an even d_model, got d_model={d_model}; use an even "
            "d_model or learned_positions=True."
        )
    for rate_name, rate in (("dropout", dropout), ("attention_dropout", attention_dropout)):
        if rate is not None and not 0.0 <= rate < 1.0:
            raise ValueError(f"`{rate_name}` must be in [0, 1), got {rate_name}={rate}.")

    def embedding(vocab, layer_name):
        return PositionalEmbedding(
            vocab,
            d_model,
            max_length=max_length,
            dropout=dropout,
            learned_positions=learned_positions,
            name=layer_name,
        )

    if shared_vocabulary and tie_embeddings:
        source_embedding = target_embedding = embedding(vocab_size, "embedding")
    else:
        source_embedding = embedding(vocab_size, "source_embedding")
        target_embedding = embedding(target_vocab_size, "target_embedding")
    stack_kwargs = dict(
        num_heads=num_heads,
        ff_dim=ff_dim,
        dropout=dropout,
        attention_dropout=attention_dropout,
        activation=activation,
        norm_first=norm_first,
        layer_norm_epsilon=layer_norm_epsilon,
    )
    encoder = Encoder(num_layers, name="encoder", **stack_kwargs)
    decoder = Decoder(num_decoder_layers, name="decoder", **stack_kwargs)

    encoder_tokens = keras.Input(shape=(None,), dtype="int32", name=ENCODER_INPUT)
    decoder_tokens = keras.Input(shape=(None,), dtype="int32", name=DECODER_INPUT)
    # Padding masks travel as Keras masks from the embeddings (token id 0) into both stacks.
    memory = encoder(source_embedding(encoder_tokens))
    hidden = decoder(target_embedding(decoder_tokens), memory)
    if tie_embeddings:
        logits = target_embedding(hidden, reverse=True)
    else:
        logits = keras.layers.Dense(target_vocab_size, name="output_projection")(hidden)
    # Logits in float32 even under mixed precision: softmax and the loss need the range.
    logits = keras.layers.Activation("linear", dtype="float32", name="logits")(logits)
    return keras.Model(
        inputs={ENCODER_INPUT: encoder_tokens, DECODER_INPUT: decoder_tokens},
        outputs=logits,
        name=name,
    )


def closed_form_parameter_count(
    vocab_size,
    d_model,
    ff_dim,
    num_layers,
    num_decoder_layers=None,
    target_vocab_size=None,
    tie_embeddings=True,
    norm_first=False,
):
    """The parameter count of `build_transformer` (sinusoidal positions) in closed form.

    Per encoder layer: attention `4 (d^2 + d)`, feed-forward `2 d ff + ff + d`, two layer norms
    `2 * 2 d`. Per decoder layer: two attentions, the feed-forward and three norms. Embeddings:
    `V d` for one tied shared matrix; otherwise each vocabulary's embedding plus a projection
    `d V_t + V_t` unless tied to the target embedding. Pre-norm adds a final norm per stack.
    """
    num_decoder_layers = num_layers if num_decoder_layers is None else num_decoder_layers
    attention = 4 * (d_model * d_model + d_model)
    feed_forward = 2 * d_model * ff_dim + ff_dim + d_model
    norm = 2 * d_model
    encoder_layer = attention + feed_forward + 2 * norm
    decoder_layer = 2 * attention + feed_forward + 3 * norm
    final_norms = 2 * norm if norm_first else 0
    if target_vocab_size is None and tie_embeddings:
        embeddings = vocab_size * d_model
    else:
        target = vocab_size if target_vocab_size is None else target_vocab_size
        embeddings = (vocab_size + target) * d_model
        if not tie_embeddings:
            embeddings += d_model * target + target
    return (
        embeddings
        + num_layers * encoder_layer
        + num_decoder_layers * decoder_layer
        + final_norms
    )


class TransformerParts:
    """The pieces of a built Transformer that incremental decoding needs.

    Decoding sees the model only through `encode` and `next_logits` (see docs/CONTRACTS.md);
    this class builds them from the layers of a model made by `build_transformer`, so a loaded
    `.keras` model decodes with a key/value cache without being rebuilt.

    Args:
        model: a `keras.Model` from `build_transformer` (or loaded from its `.keras` file).

    Example:
    >>> from keras import ops
    >>> from keras_transformer import TransformerParts, build_transformer
    >>> model = build_transformer(vocab_size=100, d_model=16, num_heads=2, ff_dim=32,
    ...                           num_layers=1)
    >>> parts = TransformerParts(model)
    >>> memory, memory_mask = parts.encode(ops.array([[5, 6, 7, 2], [8, 2, 0, 0]], "int32"))
    >>> cache = parts.initial_cache(memory, memory_mask, max_length=8)
    >>> start_tokens = ops.ones((2, 1), "int32")
    >>> logits, cache = parts.next_logits(start_tokens, cache, 0)
    >>> tuple(logits.shape)
    (2, 100)
    """

    def __init__(self, model):
        self.model = model
        names = {layer.name for layer in model.layers}
        if "embedding" in names:
            self.source_embedding = self.target_embedding = model.get_layer("embedding")
        else:
            self.source_embedding = model.get_layer("source_embedding")
            self.target_embedding = model.get_layer("target_embedding")
        self.encoder = model.get_layer("encoder")
        self.decoder = model.get_layer("decoder")
        self.output_projection = (
            model.get_layer("output_projection") if "output_projection" in names else None
        )
        self.vocab_size = self.target_embedding.vocab_size

    def encode(self, source_ids, training=False):
        """`source_ids` int `(B, S)` -> `(memory (B, S, d_model), memory_mask bool (B, S))`."""
        memory_mask = ops.not_equal(source_ids, 0)
        embedded = self.source_embedding(source_ids, training=training)
        memory = self.encoder(embedded, padding_mask=memory_mask, training=training)
        return memory, memory_mask

    def initial_cache(self, memory, memory_mask, max_length):
        """The decoding cache: empty self-attention caches, cross keys/values, memory mask.

        The decoder's own cache (see `Decoder.initialize_cache`) as a dict, so the searches
        see named parts.
        """
        self_cache, cross_cache, memory_mask = self.decoder.initialize_cache(
            memory, max_length, encoder_padding_mask=memory_mask
        )
        return {"self": self_cache, "cross": cross_cache, "memory_mask": memory_mask}

    def project(self, hidden):
        """Hidden states `(..., d_model)` -> float32 logits `(..., V)`."""
        if self.output_projection is None:
            logits = self.target_embedding(hidden, reverse=True)
        else:
            logits = self.output_projection(hidden)
        return ops.cast(logits, "float32")

    def next_logits(self, tokens, cache, index):
        """One cached decoder step: `tokens` `(N, 1)` at position `index` -> logits `(N, V)`."""
        embedded = self.target_embedding(tokens, start_index=index, training=False)
        # The memory's padding mask travels in the decoder's cache.
        hidden, (self_cache, cross_cache, memory_mask) = self.decoder(
            embedded,
            None,
            cache=(cache["self"], cache["cross"], cache["memory_mask"]),
            cache_index=index,
            training=False,
        )
        logits = self.project(hidden[:, -1])
        return logits, {"self": self_cache, "cross": cross_cache, "memory_mask": memory_mask}

    def full_logits(self, decoder_tokens, memory, memory_mask):
        """Uncached reference: logits `(B, T, V)` for a whole prefix, recomputed from scratch."""
        embedded = self.target_embedding(decoder_tokens, training=False)
        hidden = self.decoder(
            embedded,
            memory,
            padding_mask=ops.not_equal(decoder_tokens, 0),
            encoder_padding_mask=memory_mask,
            training=False,
        )
        return self.project(hidden)

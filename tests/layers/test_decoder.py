import numpy as np
import pytest

from keras_transformer.layers import Decoder, Encoder, PositionalEmbedding
from tests.layer_checks import (
    assert_functional_model_round_trip,
    assert_symbolic_call_matches_eager,
    random_array,
    run_layer_checks,
    to_numpy,
)

D, FF, H = 8, 16, 2
NORMS = pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])


@NORMS
def test_standard_layer_checks(norm_first):
    run_layer_checks(
        Decoder,
        {"num_layers": 2, "num_heads": H, "ff_dim": FF, "dropout": 0.1, "norm_first": norm_first},
        (random_array(2, 3, D), random_array(2, 5, D, seed=1)),
        expected_output_shape=(2, 3, D),
        expected_num_trainable_weights=2 * 26 + (2 if norm_first else 0),
    )


@NORMS
def test_cached_step_by_step_equals_full_pass(norm_first):
    decoder = Decoder(num_layers=3, num_heads=H, ff_dim=FF, dropout=0.0, norm_first=norm_first)
    x, memory = random_array(2, 5, D), random_array(2, 4, D, seed=1)
    memory_mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], bool)
    full = to_numpy(decoder(x, memory, encoder_padding_mask=memory_mask))
    cache = decoder.initialize_cache(memory, max_length=5)
    assert len(cache[0]) == len(cache[1]) == 3  # one tensor per block
    assert tuple(cache[0][0].shape) == (2, 2, 5, H, D // H)
    assert tuple(cache[1][0].shape) == (2, 2, 4, H, D // H)
    assert tuple(cache[2].shape) == (2, 4)  # the memory's padding mask, all True by default
    steps = []
    for index in range(5):
        out, cache = decoder(x[:, index:index + 1], None, encoder_padding_mask=memory_mask,
                             cache=cache, cache_index=index)
        steps.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, rtol=1e-5, atol=1e-5)


def test_output_carries_no_keras_mask():
    decoder = Decoder(num_layers=1, num_heads=H, ff_dim=FF)
    assert decoder.compute_mask(random_array(1, 2, D)) is None


@pytest.mark.parametrize("tie_embeddings", [True, False], ids=["tied", "untied"])
def test_padding_skipped_or_not_a_users_masked_layers_see_the_same_outputs(tie_embeddings):
    # The stacked path returned its last block's tensor with the target's Keras mask on it,
    # the packed one (`skip_padding`) a fresh tensor without: the same weights gave a user's
    # pooling, and Keras losses on an untied model's logits, other results (the mask
    # applied or not).
    import keras

    from keras_transformer import build_transformer
    from keras_transformer.layers.masking import keras_mask

    embedding = PositionalEmbedding(50, D)
    tokens = np.array([[1, 6, 7, 0, 0, 0], [1, 8, 0, 0, 0, 0]])
    memory = Encoder(1, H, FF)(embedding(np.array([[3, 4, 5, 0], [3, 0, 0, 0]])))
    decoder = Decoder(1, H, FF)
    for skip_padding in (False, True):
        assert keras_mask(decoder(embedding(tokens), memory, skip_padding=skip_padding)) is None

    model = build_transformer(50, d_model=D, num_heads=H, ff_dim=FF, num_layers=1,
                              dropout=0.0, tie_embeddings=tie_embeddings)
    source = np.array([[3, 4, 5, 0], [3, 0, 0, 0]])
    outputs = {}
    for skip_padding in (False, True):
        for name in ("encoder", "decoder"):
            model.get_layer(name).skip_padding = skip_padding
        logits = model({"encoder_tokens": source, "decoder_tokens": tokens})
        assert keras_mask(logits) is None
        outputs[skip_padding] = keras.ops.convert_to_numpy(logits)[tokens != 0]
    # The padded positions' values differ between the paths: the mask is the caller's to
    # apply (a loss's `ignore_class=0` or `sample_weight`), on both.
    np.testing.assert_allclose(outputs[True], outputs[False], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "cached, return_attention_scores",
    [(False, False), (False, True), (True, False), (True, True)],
    ids=["plain", "scores", "cache", "cache_scores"],
)
def test_symbolic_call_returns_the_eager_structure(cached, return_attention_scores):
    decoder = Decoder(num_layers=2, num_heads=H, ff_dim=FF)
    x, memory = random_array(2, 3, D), random_array(2, 5, D, seed=1)
    decoder(x, memory)  # build
    call_kwargs = {"return_attention_scores": return_attention_scores}
    if cached:
        call_kwargs.update(encoder_outputs=None, cache=decoder.initialize_cache(memory, 4),
                           cache_index=1)
        inputs = x[:, :1]
    else:
        inputs = (x, memory)
    assert_symbolic_call_matches_eager(decoder, inputs, call_kwargs)


@pytest.mark.slow
def test_functional_model_outputting_scores_fits_saves_and_reloads(tmp_path):
    outputs, *scores = assert_functional_model_round_trip(
        Decoder,
        {"num_layers": 2, "num_heads": H, "ff_dim": FF},
        (random_array(2, 3, D), random_array(2, 5, D, seed=1)),
        {"return_attention_scores": True},
        tmp_path / "decoder.keras",
    )
    assert outputs.shape == (2, 3, D)
    # Per block, the dict's keys in sorted order: cross-attention, then self-attention.
    assert [s.shape for s in scores] == [(2, H, 3, 5), (2, H, 3, 3)] * 2


def test_a_decoder_is_not_an_encoder():
    # `Decoder` subclassed `Encoder`: code choosing the encoder by type (to freeze it, say:
    # `isinstance(layer, Encoder)` over a model's layers) chose the decoder too.
    assert not isinstance(Decoder(num_layers=1, num_heads=H, ff_dim=FF), Encoder)
    assert not isinstance(Encoder(num_layers=1, num_heads=H, ff_dim=FF), Decoder)


def test_a_functional_model_outputs_each_blocks_own_scores():
    # The symbolic call gave every block's scores dict the same two tensors: a model
    # outputting block 0's cross-attention returned the last block's (and saved so).
    import keras

    decoder = Decoder(num_layers=2, num_heads=H, ff_dim=FF, dropout=0.0)
    x, memory = random_array(2, 3, D), random_array(2, 5, D, seed=1)
    x_in, memory_in = keras.Input((None, D)), keras.Input((None, D))
    _, scores = decoder(x_in, memory_in, return_attention_scores=True)
    keys = ("self_attention", "cross_attention")
    symbolic = [block[key] for block in scores for key in keys]
    assert len({id(tensor) for tensor in symbolic}) == len(symbolic)
    got = keras.Model([x_in, memory_in], symbolic)([x, memory])
    _, eager = decoder(x, memory, return_attention_scores=True)
    for value, expected in zip(got, [block[key] for block in eager for key in keys],
                               strict=True):
        np.testing.assert_allclose(to_numpy(value), to_numpy(expected), atol=1e-6)


@NORMS
def test_cached_decoding_of_sources_of_different_lengths_equals_full_pass(norm_first):
    """Through the public API alone: the cache carries the memory's padding mask."""
    source = np.array([[4, 5, 6, 7, 8, 9], [10, 11, 0, 0, 0, 0], [12, 13, 14, 15, 0, 0]], "int32")
    memory = Encoder(num_layers=1, num_heads=H, ff_dim=FF)(PositionalEmbedding(20, D)(source))
    decoder = Decoder(num_layers=2, num_heads=H, ff_dim=FF, dropout=0.0, norm_first=norm_first)
    x = random_array(3, 4, D)
    full = to_numpy(decoder(x, memory))  # the memory's Keras mask hides the padding
    cache = decoder.initialize_cache(memory, max_length=4)
    steps = []
    for index in range(4):
        out, cache = decoder(x[:, index:index + 1], None, cache=cache, cache_index=index)
        steps.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, rtol=1e-5, atol=1e-5)
    # The same with the mask given explicitly once, to `initialize_cache`.
    plain_memory = to_numpy(memory)  # a NumPy array carries no Keras mask
    cache = decoder.initialize_cache(plain_memory, max_length=4, encoder_padding_mask=source != 0)
    out, _ = decoder(x[:, :1], None, cache=cache, cache_index=0)
    np.testing.assert_allclose(to_numpy(out), full[:, :1], rtol=1e-5, atol=1e-5)
    leaked = to_numpy(decoder(x, plain_memory))
    assert not np.allclose(leaked, full, atol=1e-4)  # padding matters for this input

import re

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer import TransformerParts, build_transformer
from keras_transformer.model import closed_form_parameter_count, with_dtype_policy

TINY = dict(vocab_size=50, d_model=16, num_heads=2, ff_dim=32, num_layers=2, dropout=0.0)
NORMS = pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _batch():
    return {
        "encoder_tokens": np.array([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]], "int32"),
        "decoder_tokens": np.array([[1, 11, 12, 13], [1, 14, 0, 0]], "int32"),
    }


def test_a_small_model_has_the_closed_form_parameter_count():
    model = build_transformer(vocab_size=1000, d_model=64, num_heads=4, ff_dim=128, num_layers=2)
    assert model.count_params() == closed_form_parameter_count(1000, 64, 128, 2) == 231424


@pytest.mark.slow
def test_base_configuration_matches_closed_form_count():
    model = build_transformer(vocab_size=37000)  # 6+6 layers, 512, 8 heads, ff 2048, tied
    expected = 37000 * 512 + 6 * (4 * (512 * 512 + 512) + 2 * 512 * 2048 + 2048 + 512 + 4 * 512)
    expected += 6 * (8 * (512 * 512 + 512) + 2 * 512 * 2048 + 2048 + 512 + 6 * 512)
    assert model.count_params() == expected == closed_form_parameter_count(37000, 512, 2048, 6)
    assert 63.0e6 < expected < 63.2e6


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(tie_embeddings=False),
        dict(target_vocab_size=40),
        dict(target_vocab_size=40, tie_embeddings=False),
        dict(norm_first=True),
        dict(num_decoder_layers=3),
    ],
    ids=["untied", "separate_vocab_tied", "separate_vocab_untied", "pre_norm", "deeper_decoder"],
)
def test_parameter_count_matches_closed_form_for_variants(kwargs):
    config = {**TINY, **kwargs}
    model = build_transformer(**config)
    expected = closed_form_parameter_count(
        config["vocab_size"], config["d_model"], config["ff_dim"], config["num_layers"],
        num_decoder_layers=config.get("num_decoder_layers"),
        target_vocab_size=config.get("target_vocab_size"),
        tie_embeddings=config.get("tie_embeddings", True),
        norm_first=config.get("norm_first", False),
    )
    assert model.count_params() == expected


def test_tied_embedding_is_one_matrix():
    model = build_transformer(**TINY)
    embeddings = [w for w in model.weights if "embeddings" in w.path]
    assert len(embeddings) == 1
    separate = build_transformer(**TINY, target_vocab_size=40)
    names = sorted(w.path for w in separate.weights if "embeddings" in w.path)
    assert names == ["source_embedding/embeddings", "target_embedding/embeddings"]
    logits = _np(separate(_batch()))
    assert logits.shape == (2, 4, 40)


def test_logits_use_the_embedding_matrix():
    model = build_transformer(**TINY)
    parts = TransformerParts(model)
    batch = _batch()
    memory, memory_mask = parts.encode(batch["encoder_tokens"])
    hidden = parts.decoder(parts.target_embedding(batch["decoder_tokens"]), memory,
                           encoder_padding_mask=memory_mask)
    expected = _np(hidden) @ _np(parts.target_embedding.embeddings).T
    np.testing.assert_allclose(_np(model(batch)), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(d_model=30, num_heads=4), r"d_model=30.*num_heads=4"),
        (dict(d_model=15, num_heads=3), r"d_model=15"),
        (dict(vocab_size=0), r"vocab_size=0"),
        (dict(num_layers=-1), r"num_layers=-1"),
        (dict(ff_dim=0), r"ff_dim=0"),
        (dict(dropout=1.0), r"dropout=1.0"),
        # A None epsilon built and trained (Keras' default), then every decoding path failed
        # converting None to a tensor; a negative one gave NaN logits.
        (dict(layer_norm_epsilon=None), r"layer_norm_epsilon=None"),
        (dict(layer_norm_epsilon=-1.0), r"layer_norm_epsilon=-1.0"),
        (dict(layer_norm_epsilon=float("nan")), r"layer_norm_epsilon=nan"),
        # A truthy string built the other model ("no" a pre-norm one) and was saved so.
        (dict(norm_first="no"), r"norm_first='no'"),
        (dict(tie_embeddings="False"), r"tie_embeddings='False'"),
        (dict(learned_positions=1), r"learned_positions=1"),
        (dict(skip_padding="False"), r"skip_padding='False'"),
    ],
)
def test_invalid_settings_raise_value_error_naming_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_transformer(**{**TINY, **kwargs})


def test_numpy_numbers_are_accepted_as_the_layers_accept_them():
    # NumPy's float32 dropout was refused as "not a number in [0, 1)".
    model = build_transformer(**{**TINY, "dropout": np.float32(0.1),
                                 "attention_dropout": np.float64(0.0),
                                 "layer_norm_epsilon": np.float32(1e-6),
                                 "norm_first": np.bool_(True)})
    assert model.get_layer("encoder").get_config()["norm_first"] is True
    keras.Model.from_config(model.get_config())  # a JSON-able config


@NORMS
def test_changing_a_future_target_token_leaves_earlier_logits_unchanged(norm_first):
    model = build_transformer(**TINY, norm_first=norm_first)
    batch = _batch()
    before = _np(model(batch))
    changed = dict(batch, decoder_tokens=batch["decoder_tokens"].copy())
    changed["decoder_tokens"][0, 2] = 30
    after = _np(model(changed))
    np.testing.assert_allclose(before[0, :2], after[0, :2], rtol=1e-5, atol=1e-5)
    assert not np.allclose(before[0, 2:], after[0, 2:])


@NORMS
def test_extra_padding_leaves_logits_at_real_positions_unchanged(norm_first):
    model = build_transformer(**TINY, norm_first=norm_first)
    batch = _batch()
    reference = _np(model(batch))
    padded = {
        "encoder_tokens": np.pad(batch["encoder_tokens"], ((0, 0), (0, 3))),
        "decoder_tokens": np.pad(batch["decoder_tokens"], ((0, 0), (0, 2))),
    }
    out = _np(model(padded))
    np.testing.assert_allclose(out[0, :4], reference[0, :4], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out[1, :2], reference[1, :2], rtol=1e-4, atol=1e-4)


@NORMS
def test_keras_file_reloads_with_safe_mode_and_identical_outputs(tmp_path, norm_first):
    model = build_transformer(**TINY, norm_first=norm_first, learned_positions=norm_first)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(_np(loaded(_batch())), _np(model(_batch())))
    assert loaded.count_params() == model.count_params()


def _rewrite_keras_config(path, edit):
    """Rewrites the `config.json` inside the `.keras` zip at `path` with `edit(text) -> text`."""
    import zipfile

    with zipfile.ZipFile(path) as source:
        members = {name: source.read(name) for name in source.namelist()}
    members["config.json"] = edit(members["config.json"].decode("utf-8")).encode("utf-8")
    with zipfile.ZipFile(path, "w") as target:
        for name, data in members.items():
            target.writestr(name, data)


def test_a_keras_file_saved_with_integer_flags_still_loads(tmp_path):
    # Before the layers refused non-bool flags, `norm_first=1` (or `learned_positions=0`,
    # `skip_padding=1`, ...) built the model a Python truth test says and saved the int.
    # Such files must load as they were built; only new calls are refused.
    model = build_transformer(**TINY, norm_first=True, learned_positions=False)
    path = tmp_path / "model.keras"
    model.save(path)
    flags = r'("(?:norm_first|skip_padding|learned_positions|scale_embeddings|mask_zero)"): (true|false)'
    _rewrite_keras_config(path, lambda text: re.sub(
        flags, lambda m: f"{m.group(1)}: {int(m.group(2) == 'true')}", text))
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(_np(loaded(_batch())), _np(model(_batch())))
    assert loaded.get_layer("encoder").get_config()["norm_first"] is True
    assert loaded.get_layer("decoder").get_config()["skip_padding"] is False
    embedding = loaded.get_layer("embedding").get_config()
    assert embedding["learned_positions"] is False and embedding["scale_embeddings"] is True


def test_a_keras_file_with_a_flag_that_is_not_a_bool_or_0_1_is_refused(tmp_path):
    model = build_transformer(**TINY)
    path = tmp_path / "model.keras"
    model.save(path)
    _rewrite_keras_config(path, lambda text: text.replace('"norm_first": false', '"norm_first": "no"'))
    with pytest.raises(Exception, match=r"norm_first='no'"):
        keras.saving.load_model(path, safe_mode=True)


@pytest.mark.slow
def test_tiny_model_overfits_a_small_batch():
    model = build_transformer(vocab_size=30, d_model=32, num_heads=2, ff_dim=64, num_layers=1,
                              dropout=0.0)
    rng = np.random.default_rng(0)
    targets = rng.integers(3, 30, size=(8, 6)).astype("int32")
    inputs = {
        "encoder_tokens": rng.integers(3, 30, size=(8, 7)).astype("int32"),
        "decoder_tokens": np.concatenate([np.ones((8, 1), "int32"), targets[:, :-1]], 1),
    }
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0),
    )
    history = model.fit(inputs, targets, epochs=150, batch_size=8, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < losses[0] / 20, (losses[0], losses[-1])
    predictions = _np(model(inputs)).argmax(-1)
    assert (predictions == targets).mean() > 0.95


@pytest.mark.slow
def test_mixed_bfloat16_runs_without_nan_including_an_all_padding_row():
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = build_transformer(**TINY)
    batch = _batch()
    batch["encoder_tokens"][1] = 0  # a source that is all padding
    logits = model(batch)
    assert logits.dtype == "float32"
    assert np.all(np.isfinite(_np(logits)))
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, ignore_class=0))
    labels = np.array([[11, 12, 13, 2], [14, 2, 0, 0]], "int32")
    loss = model.train_on_batch(batch, labels)
    assert np.isfinite(loss)
    assert model.get_layer("encoder").compute_dtype == "bfloat16"



@pytest.mark.parametrize("tie_embeddings", [True, False], ids=["tied", "untied"])
def test_with_dtype_policy_converts_every_layer_but_the_float32_logits(tie_embeddings):
    keras.config.set_dtype_policy("mixed_bfloat16")
    trained = build_transformer(**TINY, tie_embeddings=tie_embeddings)  # as a bf16 run saves it
    keras.config.set_dtype_policy("float32")
    batch = _batch()
    as_float32 = with_dtype_policy(trained, "float32")
    policies = {layer.name: layer.dtype_policy.name for layer in as_float32.layers
                if not isinstance(layer, keras.layers.InputLayer)}
    assert set(policies.values()) == {"float32"}, policies
    assert all(w.dtype == "float32" for w in as_float32.weights)
    for source, converted in zip(trained.weights, as_float32.weights):
        np.testing.assert_array_equal(_np(source), _np(converted))  # float32 variables both

    as_bf16 = with_dtype_policy(as_float32, "bfloat16")
    assert as_bf16.get_layer("decoder").compute_dtype == "bfloat16"
    assert as_bf16.get_layer("logits").compute_dtype == "float32"
    assert all(w.dtype == "bfloat16" for w in as_bf16.get_layer("decoder").weights)
    exact, rounded = _np(as_float32(batch)), _np(as_bf16(batch))
    assert rounded.dtype == np.float32
    assert not np.array_equal(exact, rounded)  # computed in bfloat16 for real
    np.testing.assert_allclose(rounded, exact, atol=0.15)
    # Back to float32: the weights are the bfloat16 values, widened exactly.
    back = with_dtype_policy(as_bf16, "float32")
    for rounded_weight, widened in zip(as_bf16.weights, back.weights):
        assert widened.dtype == "float32"
        np.testing.assert_array_equal(_np(ops.cast(rounded_weight, "float32")), _np(widened))
    assert with_dtype_policy(as_float32, "float32") is as_float32

@NORMS
def test_cached_next_logits_equal_the_full_forward_pass(norm_first):
    model = build_transformer(**TINY, norm_first=norm_first)
    parts = TransformerParts(model)
    batch = _batch()
    full = _np(model(batch))
    memory, memory_mask = parts.encode(batch["encoder_tokens"])
    cache = parts.initial_cache(memory, memory_mask, max_length=6)
    for index in range(4):
        tokens = batch["decoder_tokens"][:, index:index + 1]
        logits, cache = parts.next_logits(tokens, cache, index)
        # Row 1 has padding from position 2 on; only real positions must agree.
        rows = [0, 1] if index < 2 else [0]
        np.testing.assert_allclose(_np(logits)[rows], full[rows, index], rtol=1e-4, atol=1e-4)
    uncached = _np(parts.full_logits(batch["decoder_tokens"], memory, memory_mask))
    np.testing.assert_allclose(uncached, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs",
    [dict(), dict(norm_first=True, learned_positions=True), dict(tie_embeddings=False),
     dict(dtype_policy="mixed_bfloat16")],
    ids=["post_norm", "pre_norm_learned_positions", "untied", "bfloat16"],
)
def test_packed_encoder_equals_the_encoder_at_real_positions(kwargs):
    """`encode_packed` runs the encoder's per-token arithmetic on the real tokens only: the
    memory equals `encode`'s wherever a reader looks (real positions), zero at padding,
    also with a whole padding column and a sentence that is only END."""
    import tensorflow as tf

    policy = kwargs.pop("dtype_policy", None)
    model = build_transformer(**TINY, **kwargs)
    if policy:
        model = with_dtype_policy(model, policy)
    parts = TransformerParts(model)
    source = np.array([[5, 6, 7, 8, 2, 0], [9, 10, 2, 0, 0, 0], [2, 0, 0, 0, 0, 0]], "int32")
    expected, _ = parts.encode(source)
    packed, mask = tf.function(parts.encode_packed)(source)
    real = source != 0
    np.testing.assert_array_equal(_np(mask), real)
    assert packed.dtype == expected.dtype
    expected, packed = (_np(ops.cast(x, "float32")) for x in (expected, packed))
    tolerance = 0.05 if policy else 1e-5
    np.testing.assert_allclose(packed[real], expected[real], rtol=tolerance, atol=tolerance)
    assert not np.any(packed[~real])


@pytest.mark.slow
def test_implicit_masks_hide_source_padding_inside_fit_and_predict():
    """Graph mode (`fit`, `predict`): the embeddings' Keras masks still hide padded sources.

    The eager tests above cover the eager path; here extra source padding must leave one
    `fit` step's updated weights and `predict`'s logits unchanged.
    """
    batch = _batch()
    labels = np.array([[11, 12, 13, 2], [14, 2, 0, 0]], "int32")
    padded = dict(batch, encoder_tokens=np.pad(batch["encoder_tokens"], ((0, 0), (0, 3))))

    def fit_one_step(inputs):
        keras.utils.set_random_seed(5)  # the same initial weights for both runs
        model = build_transformer(**TINY)
        model.compile(
            optimizer=keras.optimizers.SGD(0.5),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0),
        )
        model.fit(inputs, labels, batch_size=2, epochs=1, shuffle=False, verbose=0)
        assert not model.run_eagerly
        return model, [_np(w) for w in model.trainable_weights]

    model, reference = fit_one_step(batch)
    _, weights = fit_one_step(padded)
    for expected, actual in zip(reference, weights):
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.predict(padded, verbose=0), model.predict(batch, verbose=0),
                               rtol=1e-5, atol=1e-5)


@NORMS
def test_step_function_with_beams_attends_the_untiled_memory_like_the_tiled_cache(norm_first):
    """`step_function` keeps the memory at B rows and attends a sentence's K beam rows to it
    together; the logits equal `next_logits` on a cache whose memory is tiled to B * K rows."""
    import tensorflow as tf

    beams = 3
    model = build_transformer(**TINY, norm_first=norm_first)
    parts = TransformerParts(model)
    memory, memory_mask = parts.encode(_batch()["encoder_tokens"])
    next_logits, cache = parts.step_function(memory, memory_mask, max_length=6)
    tiled = tf.nest.map_structure(
        lambda t: tf.repeat(t, beams, axis=0),
        parts.initial_cache(memory, memory_mask, max_length=6),
    )
    cache = tf.nest.map_structure(lambda t: tf.repeat(t, beams, axis=0), cache)
    tokens = np.array([[1], [1], [1], [1], [1], [1]], "int32")
    for index, step_tokens in enumerate(([[11], [12], [13], [14], [15], [16]], [[7], [8], [9],
                                                                              [7], [8], [9]])):
        logits, cache = next_logits(tokens, cache, index)
        expected, tiled = parts.next_logits(tokens, tiled, index)
        np.testing.assert_allclose(_np(logits), _np(expected), rtol=1e-5, atol=1e-5)
        assert cache["self"][0][0].shape == (2 * beams, 2, index + 1, 8)  # grows by one
        tokens = np.array(step_tokens, "int32")


@NORMS
@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_in_place_cache_search_equals_the_growing_cache(norm_first, search):
    """`search_step(cache_layout=InPlaceCache(...))` gives the searches of the growing
    cache token for token, finished sentences dropped or not."""
    import tensorflow as tf

    from keras_transformer import decoding

    model = build_transformer(**TINY, norm_first=norm_first)
    parts = TransformerParts(model)
    rng = np.random.default_rng(1)
    source = rng.integers(3, TINY["vocab_size"], size=(5, 7)).astype("int32")
    source[np.arange(7)[None, :] >= np.array([7, 5, 3, 6, 2])[:, None]] = 0
    memory, memory_mask = parts.encode(source)
    bounds = tf.constant([3, 12, 7, 12, 5])
    for drop_finished in (False, True):
        results = []
        for layout in (None, decoding.InPlaceCache(ancestry=search == "beam")):
            step, cache, memory_state = parts.search_step(memory, memory_mask, 12,
                                                          cache_layout=layout)
            options = dict(sentence_cache=memory_state, cache_rows=layout, max_lengths=bounds,
                           drop_finished=drop_finished)
            if search == "greedy":
                results.append(decoding.greedy_search(step, cache, 5, 12, **options))
            else:
                results.append(decoding.beam_search(step, cache, 5, 12, beam_size=3, **options))
        in_place, grown = results
        np.testing.assert_array_equal(_np(in_place.tokens), _np(grown.tokens))
        np.testing.assert_allclose(_np(in_place.scores), _np(grown.scores), rtol=1e-5, atol=1e-5)


def test_fixed_cache_of_fewer_positions_searches_as_the_full_one():
    """`search_step(fixed_length=True, cache_length=n)`: a fixed cache of `n` positions
    (the searches' bounds within them) gives the search of `max_length` positions; without
    `fixed_length` it is refused."""
    import tensorflow as tf

    from keras_transformer import decoding

    model = build_transformer(**TINY)
    parts = TransformerParts(model)
    rng = np.random.default_rng(2)
    source = rng.integers(3, TINY["vocab_size"], size=(3, 6)).astype("int32")
    memory, memory_mask = parts.encode(source)
    bounds = tf.constant([4, 9, 9])
    results = []
    for cache_length in (None, 9, tf.constant(9)):
        step, cache, memory_state = parts.search_step(memory, memory_mask, 16,
                                                      fixed_length=True,
                                                      cache_length=cache_length)
        assert cache["self"][0][0].shape[2] == (16 if cache_length is None else 9)
        results.append(decoding.beam_search(step, cache, 3, 16, beam_size=2,
                                            sentence_cache=memory_state, max_lengths=bounds))
    for result in results[1:]:
        np.testing.assert_array_equal(_np(result.tokens), _np(results[0].tokens))
        np.testing.assert_allclose(_np(result.scores), _np(results[0].scores), rtol=1e-5,
                                   atol=1e-5)
    with pytest.raises(ValueError, match="cache_length.*fixed_length=True"):
        parts.search_step(memory, memory_mask, 16, cache_length=9)
    for outside in (0, 17):
        with pytest.raises(ValueError, match=r"cache_length.*\[1, max_length=16\]"):
            parts.search_step(memory, memory_mask, 16, fixed_length=True,
                              cache_length=outside)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_step_function_refuses_to_drop_finished_sentences(search):
    """`step_function`'s step holds the memory of all B sentences: with rows leaving the
    batch, a surviving sentence's beams attended another sentence's memory (the audit:
    another translation, no error). `search_step` with `sentence_cache` is the way."""
    from keras_transformer import decoding

    parts = TransformerParts(build_transformer(**TINY))
    memory, memory_mask = parts.encode(_batch()["encoder_tokens"])
    next_logits, cache = parts.step_function(memory, memory_mask, max_length=6)
    run = dict(greedy=lambda **kw: decoding.greedy_search(next_logits, cache, 2, 6, **kw),
               beam=lambda **kw: decoding.beam_search(next_logits, cache, 2, 6, beam_size=2,
                                                      **kw))[search]
    with pytest.raises(ValueError, match=r"drop_finished=True.*search_step.*sentence_cache"):
        run(drop_finished=True)
    assert run().tokens.shape == (2, 6)


def test_next_logits_past_a_learned_position_table_is_refused():
    # `step_function` refuses a max_length past the table; `next_logits` had failed in a
    # gather ("indices[0] = 6 is not in [0, 6)").
    import tensorflow as tf

    parts = TransformerParts(build_transformer(**TINY, learned_positions=True, max_length=6))
    memory, memory_mask = parts.encode(_batch()["encoder_tokens"])
    cache = parts.initial_cache(memory, memory_mask)
    tokens = np.ones((2, 1), "int32")
    for index in range(6):
        _, cache = parts.next_logits(tokens, cache, index)
    for index in (6, np.int32(6), tf.constant(6)):
        with pytest.raises(ValueError, match=r"position 6 .*learned position table of 6"):
            parts.next_logits(tokens, cache, index)
    graph_step = tf.function(lambda i: parts.next_logits(tokens, cache, i)[0])
    assert graph_step(tf.constant(5)).shape == (2, TINY["vocab_size"])
    with pytest.raises(tf.errors.InvalidArgumentError, match="learned position table"):
        graph_step(tf.constant(6))


def test_fixed_length_cache_gives_the_growing_cache_logits():
    """The fixed-size cache (for XLA) masks unwritten positions: same logits as growing."""
    model = build_transformer(**TINY)
    parts = TransformerParts(model)
    memory, memory_mask = parts.encode(_batch()["encoder_tokens"])
    growing_step, growing = parts.step_function(memory, memory_mask, max_length=6)
    fixed_step, fixed = parts.step_function(memory, memory_mask, max_length=6, fixed_length=True)
    assert fixed["self"][0][0].shape == (2, 2, 6, 8)
    for index in range(4):
        tokens = _batch()["decoder_tokens"][:, index:index + 1]
        expected, growing = growing_step(tokens, growing, index)
        logits, fixed = fixed_step(tokens, fixed, index)
        np.testing.assert_allclose(_np(logits), _np(expected), rtol=1e-5, atol=1e-5)
    assert fixed["self"][0][0].shape == (2, 2, 6, 8)

"""`Translator` in process: searches agree with each other, batching changes nothing, bounds
hold, the search loop reads no variable."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.text import END_ID, PAD_ID, START_ID, UNK_ID
from tests.export.conftest import DECODING, for_search

# Sources of every kind for the bound checks: empty, short, long, beyond max_input_length.
BOUND_SOURCES = ["", "ka", "bal dor fen gim hut", " ".join(["kor lam"] * 10), "ka " * 200]


def search_tokens(translator, sentences, search):
    """The token matrix `(B, max_output_length)` of `search`, through the Translator's own
    tokenization and `_search` (the public outputs are detokenized text)."""
    config = translator.config
    text = tf.constant(sentences)
    source = translator.source_tokenizer.tokenize(
        text, max_length=config.max_input_length, add_end=True)
    lengths = tf.cast(source.row_lengths(), tf.int32)
    source_ids = source.to_tensor(PAD_ID)
    max_lengths = tf.minimum(lengths + config.extra_length, config.max_output_length)
    result = translator._search(source_ids, tf.shape(source_ids)[0], max_lengths, search)
    return result.tokens.numpy(), result.lengths.numpy()


def source_token_lengths(tokenizer, sentences):
    """Source lengths as the Translator counts them: END included, truncated."""
    ids = tokenizer.tokenize(tf.constant(sentences), max_length=DECODING["max_input_length"],
                             add_end=True)
    return ids.row_lengths().numpy()


def expected_bounds(tokenizer, sentences, extra_length=DECODING["extra_length"],
                    max_output_length=DECODING["max_output_length"]):
    """The longest output of each sentence: 0 for a sentence without text (END alone)."""
    lengths = source_token_lengths(tokenizer, sentences)
    return np.where(lengths <= 1, 0, np.minimum(lengths + extra_length, max_output_length))


def outputs(translator, sentences):
    result = translator.translate(tf.constant(sentences, tf.string))
    return (
        [t.decode("utf-8") for t in result["translation"].numpy().tolist()],
        result["score"].numpy(),
        result["length"].numpy(),
    )


@pytest.mark.slow
def test_tiny_model_learned_to_copy(copy_task):
    """The fixture model is trained for real: greedy output is the source, unseen sentences."""
    translations, _, lengths = outputs(copy_task.translator(search="greedy"), copy_task.held_out)
    exact = sum(t == s for t, s in zip(translations, copy_task.held_out))
    assert exact >= 0.8 * len(copy_task.held_out), list(zip(copy_task.held_out, translations))
    assert np.all(lengths > 1)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["trained", "random_weights"])
def test_cached_greedy_equals_uncached_token_for_token(copy_task, random_model, which):
    model = copy_task.model if which == "trained" else random_model
    cached = copy_task.translator(model, search="greedy")
    uncached = copy_task.translator(model, search="greedy_uncached")
    sentences = copy_task.held_out[:12] + BOUND_SOURCES
    tokens_cached, lengths_cached = search_tokens(cached, sentences, "greedy")
    tokens_uncached, lengths_uncached = search_tokens(uncached, sentences, "greedy_uncached")
    np.testing.assert_array_equal(tokens_cached, tokens_uncached)
    np.testing.assert_array_equal(lengths_cached, lengths_uncached)
    # The exported outputs agree as well (text, length, log-probability).
    text_c, score_c, length_c = outputs(cached, sentences)
    text_u, score_u, length_u = outputs(uncached, sentences)
    assert text_c == text_u
    np.testing.assert_array_equal(length_c, length_u)
    np.testing.assert_allclose(score_c, score_u, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_beam_size_one_equals_greedy(copy_task):
    sentences = copy_task.held_out[:16] + BOUND_SOURCES[:3]
    greedy = copy_task.translator(search="greedy")
    beam = copy_task.translator(search="beam", beam_size=1)
    tokens_greedy, _ = search_tokens(greedy, sentences, "greedy")
    tokens_beam, _ = search_tokens(beam, sentences, "beam")
    np.testing.assert_array_equal(tokens_beam, tokens_greedy)
    text_g, score_g, length_g = outputs(greedy, sentences)
    text_b, score_b, length_b = outputs(beam, sentences)
    assert text_b == text_g
    np.testing.assert_array_equal(length_b, length_g)
    np.testing.assert_allclose(score_b, score_g, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("search", ["greedy", "beam", "sample"])
def test_a_sentence_without_text_translates_to_nothing(copy_task, search):
    # An empty or blank line (a paragraph break in a document) came back as an invented
    # sentence: the model decoded from END alone. Training drops such lines as `blank`.
    translator = copy_task.translator(search=search, beam_size=3)
    text, score, length = outputs(translator, ["", "   ", "\t", copy_task.held_out[0]])
    assert text[:3] == ["", "", ""] and list(length[:3]) == [0, 0, 0]
    assert list(score[:3]) == [0.0, 0.0, 0.0]
    assert text[3] and length[3] > 0


def test_a_line_of_invisible_characters_translates_to_nothing(small_tokenizer):
    # Training drops sides of zero-width characters, bidi marks and controls alone; with a
    # vocabulary that keeps them as pieces (`normalization=nfkc`/`identity`; here the ZWJ,
    # which nmt_nfkc keeps too) a line of them was translated into an invented word.
    translator = tiny_translator(small_tokenizer, tiny_model(small_tokenizer),
                                 max_input_length=TABLE, max_output_length=TABLE)
    text, score, length = outputs(translator, ["\u200d", "\u200b\u200c\u200e \u00a0",
                                               "\x07\ufeff", "ka lo mi\u200d"])
    assert text[:3] == ["", "", ""] and list(length[:3]) == [0, 0, 0]
    assert list(score[:3]) == [0.0, 0.0, 0.0]
    assert length[3] > 0


@pytest.mark.parametrize("search", ["greedy", "beam", "sample"])
def test_a_line_without_text_is_not_decoded_to_its_length_bound(small_tokenizer, search):
    # A line without text came back as "", but only after the search had decoded it up to
    # its bound (source + extra_length tokens): a blank line in a request of short
    # sentences kept the whole batch in the loop for extra_length steps.
    translator = tiny_translator(small_tokenizer, tiny_model(small_tokenizer, bias=NEVER_END),
                                 search=search, beam_size=2, max_input_length=TABLE,
                                 max_output_length=TABLE, extra_length=8)
    bounds = []
    search_function = translator._search

    def recording(source_ids, batch_size, max_lengths, *args, **kwargs):
        bounds.append(max_lengths.numpy().tolist())
        return search_function(source_ids, batch_size, max_lengths, *args, **kwargs)

    translator._search = recording
    tf.config.run_functions_eagerly(True)
    try:
        text, _, length = outputs(translator, ["", "\u200b", "ka lo"])
    finally:
        tf.config.run_functions_eagerly(False)
    assert text[:2] == ["", ""] and list(length[:2]) == [0, 0] and length[2] > 0
    (bound,) = bounds
    assert bound[:2] == [1, 1] and bound[2] > 1


@pytest.mark.parametrize("rule", ["nfkc", "identity"])
def test_a_source_is_stripped_as_training_strips_its_sentences(tmp_path, rule):
    # Training strips every sentence (`str.strip`). Under `nmt_nfkc` the tokenizer's own
    # rule agreed; under `nfkc` or `identity` (the settings for Persian or CJK text) a
    # request's "text\n", leading tab or ideographic-space indent became byte pieces the
    # model never saw in training, and another translation.
    from keras_transformer.text import SubwordTokenizer, train_sentencepiece
    from tests.export.conftest import make_sentences

    path = train_sentencepiece(make_sentences(400, seed=3), tmp_path / f"{rule}.model",
                               vocab_size=300, hard_vocab_limit=False,
                               normalization_rule_name=rule)
    tokenizer = SubwordTokenizer(path)
    translator = tiny_translator(tokenizer, tiny_model(tokenizer), search="greedy",
                                 max_input_length=TABLE, max_output_length=8)
    clean = "ka lo mi nu"
    padded = ["\t" + clean + "\n", clean + "\r\n", "\u3000" + clean, "\u00a0" + clean + " ",
              "\x1c\x85" + clean + "\u2028\u202f\x0b"]
    assert all(text.strip() == clean for text in padded)
    text, score, length = outputs(translator, [clean] + padded)
    assert text[1:] == [text[0]] * len(padded)
    np.testing.assert_array_equal(score[1:], [score[0]] * len(padded))
    np.testing.assert_array_equal(length[1:], [length[0]] * len(padded))


def test_the_in_graph_strip_removes_what_python_strips():
    from keras_transformer.text.subword_tokenizer import strip_whitespace

    characters = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    texts = [c + "x" + c for c in characters]
    stripped = strip_whitespace(tf.constant([t.encode("utf-8") for t in texts])).numpy()
    wrong = [hex(ord(c)) for c, t, got in zip(characters, texts, stripped)
             if got.decode("utf-8") != t.strip()]
    assert not wrong
    # Invalid UTF-8 is kept as it is (the tokenizer replaces it), not an error.
    assert strip_whitespace(tf.constant([b" \xff x\t"])).numpy().tolist() == [b"\xff x"]


@pytest.mark.slow
@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_a_translation_cut_at_its_length_limit_is_flagged(copy_task, search):
    # A translation that reached min(source tokens + extra_length, max_output_length)
    # before END was cut mid-sentence, and nothing in the output said so.
    source = copy_task.held_out[0]
    whole = copy_task.translator(search=search, beam_size=3).translate(
        tf.constant([source, ""], tf.string))
    assert whole["unfinished"].numpy().tolist() == [False, False]
    limit = int(whole["length"].numpy()[0]) - 1  # one token short of its END
    assert limit >= 1
    short = copy_task.translator(search=search, beam_size=3, max_output_length=limit)
    result = short.translate(tf.constant([source, ""], tf.string))
    assert not result["unfinished"].numpy()[1]
    if search == "greedy":  # the same tokens, without the END that no longer fits
        assert result["unfinished"].numpy()[0] and result["length"].numpy()[0] == limit
    else:  # beam search may find a shorter hypothesis that ends: then it is not cut
        assert result["unfinished"].numpy()[0] == (result["length"].numpy()[0] == limit)


@pytest.mark.slow
def test_a_source_cut_at_max_input_length_is_flagged(copy_task):
    # A source longer than max_input_length is cut to it; nothing in the output said so.
    translator = copy_task.translator(search="greedy", max_input_length=6)
    long = "bal dor fen gim hut sel tam vin"  # more than 5 pieces + END
    result = translator.translate(tf.constant(["ka", long, ""], tf.string))
    assert result["truncated"].numpy().tolist() == [False, True, False]
    cut = translator.translate(tf.constant([long], tf.string))["translation"].numpy()[0]
    whole = copy_task.translator(search="greedy").translate(
        tf.constant([long], tf.string))["translation"].numpy()[0]
    assert len(cut) < len(whole)


@pytest.mark.slow
@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_batch_equals_one_at_a_time(copy_task, search):
    """Padding a sentence next to longer ones changes nothing (masks are exact)."""
    translator = copy_task.translator(search=search, beam_size=3)
    sentences = copy_task.held_out[:10] + ["", "ka", "bal dor fen gim hut sel tam vin"]
    batch_text, batch_score, batch_length = outputs(translator, sentences)
    for i, sentence in enumerate(sentences):
        text, score, length = outputs(translator, [sentence])
        assert text[0] == batch_text[i], sentence
        assert length[0] == batch_length[i], sentence
        np.testing.assert_allclose(score[0], batch_score[i], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_xla_export_sends_larger_batches_to_the_regular_search(copy_task):
    """Batches of more than `jit_max_rows` rows skip XLA (faster there), translating the same."""
    from keras_transformer.decoding.utils import SearchResult

    jit = copy_task.translator(search="greedy", jit_compile=True, jit_max_rows=2)
    beam = copy_task.translator(search="beam", beam_size=2, jit_compile=True, jit_max_rows=2)

    def marked(source_ids, max_lengths):  # stands in for the XLA search: scores -123
        rows = tf.shape(source_ids)[0]
        return SearchResult(tokens=tf.fill([rows, 1], 2), scores=tf.fill([rows], -123.0),
                            lengths=tf.ones([rows], tf.int32), normalized_scores=None)

    jit._compiled_searches["greedy"] = marked
    beam._compiled_searches["beam"] = marked
    sentences = copy_task.held_out[:3]
    assert (outputs(jit, sentences[:2])[1] == -123.0).all()
    # Rows, not sentences: one sentence of beam 2 is 2 rows, two are 4.
    assert (outputs(beam, sentences[:1])[1] == -123.0).all()
    assert (outputs(beam, sentences[:2])[1] != -123.0).all()
    text, score, _ = outputs(jit, sentences)
    expected_text, expected_score, _ = outputs(copy_task.translator(search="greedy"), sentences)
    assert text == expected_text
    np.testing.assert_allclose(score, expected_score, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="jit_max_rows"):
        copy_task.translator(search="greedy", jit_compile=True, jit_max_rows=0)


@pytest.mark.slow
@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_xla_compiled_search_equals_the_default(copy_task, search):
    """`jit_compile=True` (XLA, fixed-size cache) translates exactly as the default export."""
    sentences = copy_task.held_out[:8] + ["", "ka", "bal dor fen gim hut sel tam vin"]
    text, score, length = outputs(copy_task.translator(search=search, beam_size=3), sentences)
    jit = copy_task.translator(search=search, beam_size=3, jit_compile=True,
                               jit_max_rows=None)  # XLA at every batch size
    text_jit, score_jit, length_jit = outputs(jit, sentences)
    assert text_jit == text
    np.testing.assert_array_equal(length_jit, length)
    np.testing.assert_allclose(score_jit, score, rtol=1e-4, atol=1e-4)
    # Alone, each source is padded to a multiple of 8 pieces (fewer XLA compilations):
    # the extra masked positions change nothing.
    for i in (0, len(sentences) - 2, len(sentences) - 1):
        alone_text, alone_score, _ = outputs(jit, [sentences[i]])
        assert alone_text[0] == text[i]
        np.testing.assert_allclose(alone_score[0], score[i], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_dropping_finished_sentences_changes_no_output(copy_task, random_model, search):
    """`drop_finished` (the default) against sentences kept in the batch to the end, on
    sources of very different lengths (the trained model, whose outputs end at different
    steps, and random weights, which run to each sentence's bound)."""
    sentences = copy_task.held_out[:12] + BOUND_SOURCES
    for model in (copy_task.model, random_model):
        text, score, length = outputs(
            copy_task.translator(model, search=search, beam_size=3), sentences)
        kept_text, kept_score, kept_length = outputs(
            copy_task.translator(model, search=search, beam_size=3, drop_finished=False),
            sentences)
        assert len(set(length)) > 3, length  # sentences do finish at different steps
        assert text == kept_text
        np.testing.assert_array_equal(length, kept_length)
        np.testing.assert_allclose(score, kept_score, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_in_place_cache_changes_no_output(copy_task, random_model, search):
    """The time-major cache written in place (beam search's default, where it reorders an
    ancestry table; greedy search's with "all") against the cache grown by concatenation,
    with finished sentences dropped and kept, on sources that finish at different steps."""
    sentences = copy_task.held_out[:12] + BOUND_SOURCES
    for model in (copy_task.model, random_model):
        for drop_finished in (True, False):
            translators = [
                copy_task.translator(model, search=search, beam_size=3,
                                     drop_finished=drop_finished, in_place_cache=in_place)
                for in_place in ("all", "none")
            ]
            (text, score, length), (grown_text, grown_score, grown_length) = (
                outputs(translator, sentences) for translator in translators)
            assert text == grown_text
            np.testing.assert_array_equal(length, grown_length)
            np.testing.assert_allclose(score, grown_score, rtol=1e-4, atol=1e-4)


def loop_body_ops(concrete_function):
    """The op types in the bodies of every `While` of `concrete_function`'s graph, with the
    functions their nodes call (`If` branches and the like) counted inside."""
    library = {f.signature.name: f for f in concrete_function.graph.as_graph_def().library.function}

    def callees(node):
        names = [value.func.name for value in node.attr.values() if value.HasField("func")]
        return names + [f.name for value in node.attr.values() for f in value.list.func]

    def ops_in(function):
        found = []
        for node in function.node_def:
            found.append(node.op)
            for name in callees(node):
                found += ops_in(library[name])
        return found

    bodies = [library[node.attr["body"].func.name] for function in library.values()
              for node in function.node_def if node.op in ("While", "StatelessWhile")]
    bodies += [library[node.attr["body"].func.name]
               for node in concrete_function.graph.as_graph_def().node
               if node.op in ("While", "StatelessWhile")]
    assert bodies, "no search loop found"
    return [op for body in bodies for op in ops_in(body)]


@pytest.mark.slow
@pytest.mark.parametrize("stored_projection", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_search_loop_reads_no_variable(copy_task, search, dtype, stored_projection):
    """The step's weights (fused, scaled, cast to the compute dtype) are read once per
    search, outside the loop: no variable read, no embedding-table gather from a variable,
    in any step (the loop ran 44 `ReadVariableOp`s per step of the reference shape before),
    the stored projection kernel included."""
    from keras_transformer.model import with_dtype_policy

    model = copy_task.model if dtype == "float32" else with_dtype_policy(copy_task.model,
                                                                          dtype)
    translator = copy_task.translator(model, search=search, beam_size=3,
                                      stored_projection=stored_projection)
    ops = loop_body_ops(translator.translate.get_concrete_function())
    assert "MatMul" in ops  # the decoder step is in the loop
    reads = [op for op in ops if op in ("ReadVariableOp", "ResourceGather")]
    assert reads == []


def _transposes(translator, signature):
    """The `Transpose` nodes of a signature's graph, its function library included."""
    graph = getattr(translator, signature).get_concrete_function().graph.as_graph_def()
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    return [node for node in nodes if node.op == "Transpose"]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_stored_projection_spares_every_call_the_table_transpose(copy_task, dtype):
    """`stored_projection`: a tied model's pre-softmax kernel, the embedding table
    transposed, is a variable of its own in the compute dtype, so no call transposes the
    table; no translation, score or length changes."""
    from keras_transformer.model import with_dtype_policy

    model = copy_task.model if dtype == "float32" else with_dtype_policy(copy_task.model,
                                                                          dtype)
    plain = copy_task.translator(model, search="beam", beam_size=3)
    stored = copy_task.translator(model, search="beam", beam_size=3, stored_projection=True)
    table = model.get_layer("embedding").embeddings
    assert stored.projection_kernel.shape == (table.shape[1], table.shape[0])
    assert stored.projection_kernel.dtype == dtype
    assert not stored.projection_kernel.trainable
    assert not hasattr(plain, "projection_kernel")
    for signature in ("translate", "translate_greedy"):
        assert len(_transposes(plain, signature)) - len(_transposes(stored, signature)) == 1
    sentences = copy_task.held_out[:6]
    for signature in ("translate", "translate_greedy"):
        ours = getattr(stored, signature)(tf.constant(sentences))
        theirs = getattr(plain, signature)(tf.constant(sentences))
        for key in ("translation", "length"):
            np.testing.assert_array_equal(ours[key].numpy(), theirs[key].numpy())
        np.testing.assert_allclose(ours["score"].numpy(), theirs["score"].numpy(), rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("search", ["greedy", "beam", "greedy_uncached", "sample"])
def test_random_model_that_never_ends_stops_at_the_bound(copy_task, random_model, search):
    """END is impossible, so every output runs to min(source + extra, max_output_length)."""
    translator = copy_task.translator(random_model, search=search, beam_size=2)
    _, _, lengths = outputs(translator, BOUND_SOURCES)
    bounds = expected_bounds(copy_task.tokenizer, BOUND_SOURCES)
    np.testing.assert_array_equal(lengths, bounds)
    assert bounds.max() == DECODING["max_input_length"] + DECODING["extra_length"]  # truncated


@pytest.mark.slow
@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_trained_model_outputs_are_bounded(copy_task, search):
    sentences = copy_task.held_out[:8] + BOUND_SOURCES
    _, _, lengths = outputs(copy_task.translator(search=search), sentences)
    bounds = expected_bounds(copy_task.tokenizer, sentences)
    assert np.all((lengths >= 1) | (bounds == 0))  # only a sentence without text is empty
    assert np.all(lengths <= bounds)


# Small untrained models for the checks that need no trained weights (fast).
TINY_MODEL = dict(d_model=16, num_heads=2, ff_dim=32, num_layers=1, dropout=0.0)
TABLE = 12  # learned position table of the tiny models


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory):
    from keras_transformer.text import SubwordTokenizer, train_sentencepiece
    from tests.export.conftest import make_sentences

    path = train_sentencepiece(
        make_sentences(400, seed=3), tmp_path_factory.mktemp("small_vocab") / "t.model",
        vocab_size=60, byte_fallback=False, hard_vocab_limit=False,
    )
    return SubwordTokenizer(path)


def tiny_model(tokenizer, learned_positions=True, max_length=TABLE, bias=None, seed=5):
    """An untrained model; `bias` maps token ids to output-projection biases."""
    import keras

    from keras_transformer.model import build_transformer

    keras.utils.set_random_seed(seed)
    model = build_transformer(
        tokenizer.vocab_size, tie_embeddings=False, learned_positions=learned_positions,
        max_length=max_length, **TINY_MODEL,
    )
    if bias:
        projection = model.get_layer("output_projection")
        values = np.zeros(projection.bias.shape, "float32")
        for token, value in bias.items():
            values[token] = value
        projection.bias.assign(values)
    return model


def tiny_translator(tokenizer, model, **config):
    from keras_transformer.export import DecodingConfig, Translator

    return Translator(model, tokenizer, tokenizer, DecodingConfig(**for_search(config)))


NEVER_END = {END_ID: -1e4}
LONG_SENTENCE = " ".join(["bal dor fen gim hut"] * 8)


@pytest.mark.parametrize("name", ["max_input_length", "max_output_length"])
def test_learned_positions_past_the_table_are_refused_at_export(small_tokenizer, name):
    model = tiny_model(small_tokenizer)
    lengths = {"max_input_length": TABLE, "max_output_length": TABLE, name: TABLE + 1}
    with pytest.raises(ValueError, match=rf"{name}={TABLE + 1}.*{TABLE} positions") as error:
        tiny_translator(small_tokenizer, model, **lengths)
    assert f"--{name.replace('_', '-')} {TABLE}" in str(error.value)  # the fix


@pytest.mark.parametrize("search", ["greedy", "beam", "greedy_uncached"])
def test_learned_positions_up_to_the_table_decode_to_the_bound(small_tokenizer, search):
    """The limit is exact: a table of 12 positions serves 12 source and 12 target tokens."""
    model = tiny_model(small_tokenizer, bias=NEVER_END)
    translator = tiny_translator(
        small_tokenizer, model, search=search, beam_size=2, max_input_length=TABLE,
        max_output_length=TABLE, extra_length=100,
    )
    _, _, lengths = outputs(translator, [LONG_SENTENCE, "ka"])
    np.testing.assert_array_equal(lengths, [TABLE, TABLE])


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_xla_search_decodes_every_position_up_to_the_bound(small_tokenizer, search):
    """XLA's fixed cache holds as many positions as the batch can decode (the source's
    padded width + `extra_length`, at most `max_output_length`), not `max_output_length`:
    a model that never ends writes the last of them, and translates as the default export.
    (XLA clamps a write past a buffer's end: a cache one position too short would attend a
    wrong history, not fail.)"""
    model = tiny_model(small_tokenizer, learned_positions=False, bias=NEVER_END)
    # LONG_SENTENCE is cut to max_input_length, a multiple of XLA's width multiple (8): its
    # bound is exactly the cache's positions.
    settings = dict(search=search, beam_size=2, max_input_length=DECODING["max_input_length"],
                    extra_length=5, max_output_length=40)
    sentences = [["ka"], ["bal dor fen"], [LONG_SENTENCE], ["ka", "bal dor fen gim"]]
    default = tiny_translator(small_tokenizer, model, **settings)
    jit = tiny_translator(small_tokenizer, model, jit_compile=True, jit_max_rows=None,
                          **settings)
    for batch in sentences:
        text, score, length = outputs(default, batch)
        np.testing.assert_array_equal(length, expected_bounds(small_tokenizer, batch, 5, 40))
        text_jit, score_jit, length_jit = outputs(jit, batch)
        assert text_jit == text
        np.testing.assert_array_equal(length_jit, length)
        # Absolute: a cache one position short moves LONG_SENTENCE's score by ~6e-3 (its
        # last step attends itself in the place of the step before), XLA's sums ~1e-5.
        np.testing.assert_allclose(score_jit, score, rtol=0, atol=1e-3)


def test_sinusoidal_positions_have_no_table_limit(small_tokenizer):
    model = tiny_model(small_tokenizer, learned_positions=False, bias=NEVER_END)
    translator = tiny_translator(
        small_tokenizer, model, search="greedy", max_input_length=3 * TABLE,
        max_output_length=2 * TABLE, extra_length=100,
    )
    _, _, lengths = outputs(translator, [LONG_SENTENCE])
    np.testing.assert_array_equal(lengths, [2 * TABLE])


@pytest.mark.parametrize("search", ["greedy", "beam", "greedy_uncached", "sample"])
def test_reserved_tokens_are_never_produced_and_unk_only_when_allowed(small_tokenizer, search):
    # The model prefers PAD, then START, then UNK, to every real token.
    model = tiny_model(small_tokenizer, bias={PAD_ID: 30.0, START_ID: 25.0, UNK_ID: 20.0})
    sentences = ["ka lo mi", "bal dor", ""]
    for disable_unk, forbidden in ((True, [PAD_ID, START_ID, UNK_ID]), (False, [PAD_ID, START_ID])):
        translator = tiny_translator(
            small_tokenizer, model, search=search, beam_size=2, disable_unk=disable_unk,
            max_input_length=TABLE, max_output_length=TABLE,
        )
        tokens, lengths = search_tokens(translator, sentences, search)
        produced = np.concatenate([row[:n] for row, n in zip(tokens, lengths)])
        assert not np.isin(produced, forbidden).any(), (disable_unk, tokens)
        if not disable_unk:
            assert np.isin(produced, [UNK_ID]).any()  # allowed, and the model wants it
        assert translator.config.disable_unk is disable_unk


@pytest.mark.parametrize(
    "settings", [dict(temperature=0.0), dict(temperature=-1.0), dict(temperature=float("inf")),
                 dict(temperature=1e39), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.01)],
    ids=["temperature0", "temperature_negative", "temperature_inf", "temperature_past_float32",
         "top_k", "top_p0", "top_p_above_1"],
)
def test_invalid_sampling_settings_are_refused(settings):
    from keras_transformer.export import DecodingConfig

    with pytest.raises(ValueError, match=next(iter(settings))):
        DecodingConfig(search="sample", **settings)


@pytest.mark.parametrize("settings, match", [
    # Each had been accepted: a truthy string ran the early rule, NaN made every translation
    # empty, the others failed inside the graph at the first call without naming the field.
    (dict(early_stopping="exact"), "early_stopping"), (dict(alpha=float("nan")), "alpha"),
    (dict(alpha=None), "alpha"), (dict(alpha="0.6"), "alpha"), (dict(beam_size=2.5), "beam_size"),
    (dict(beam_size=True), "beam_size"), (dict(beam_size=None), "beam_size"),
    (dict(max_output_length=6.5), "max_output_length"), (dict(extra_length=2.5), "extra_length"),
    (dict(jit_compile=True, jit_max_rows=2.5), "jit_max_rows"),
    (dict(max_input_length=1), "max_input_length"),
    # Beam settings with another search were ignored silently (the CLI refuses them).
    (dict(search="greedy", beam_size=8, alpha=1.2), "apply to search='beam' only"),
    (dict(search="sample", early_stopping=False), "apply to search='beam' only"),
    # XLA for at most 8 rows never compiled a beam-16 search (one sentence is 16 rows): the
    # export needed the server's XLA flag for translate_greedy alone, and nothing said so.
    (dict(jit_compile=True, beam_size=16), "jit_max_rows=8 is below beam_size=16"),
    # Past int32 in the graph: every translation "" and unfinished, or a raw Range error.
    (dict(extra_length=2**31 - 1), "extra_length"), (dict(max_output_length=3 * 10**9),
                                                      "max_output_length"),
    (dict(max_input_length=2**21), "max_input_length"),
    # Past float32: PAD and START sampled (temperature), uniformly random bytes (top_p).
    (dict(search="sample", temperature=1e-45), "temperature"),
    (dict(search="sample", top_p=1e-45), "top_p"),
])
def test_decoding_settings_of_the_wrong_type_or_search_are_refused(settings, match):
    from keras_transformer.export import DecodingConfig

    with pytest.raises(ValueError, match=match):
        DecodingConfig(**settings)


def test_decoding_settings_accept_greedy_as_beam_one_and_numpy_numbers():
    from keras_transformer.export import DecodingConfig

    assert DecodingConfig(search="greedy", beam_size=1).beam_size == 1
    config = DecodingConfig(beam_size=np.int64(3), alpha=np.float32(1.5), jit_max_rows=None)
    # Kept as Python numbers: translator.json had recorded "3" (json's default=str).
    assert type(config.beam_size) is int and type(config.alpha) is float
    # --jit with sampling compiles the export's translate_greedy.
    DecodingConfig(search="sample", jit_compile=True)
    # Beam 8 under XLA from jit_max_rows=8 (one sentence), or at every batch size.
    DecodingConfig(beam_size=8, jit_compile=True, jit_max_rows=8)
    DecodingConfig(beam_size=8, jit_compile=True, jit_max_rows=None)
    DecodingConfig(beam_size=8)  # jit_max_rows says nothing without jit_compile
    DecodingConfig(search="sample", temperature=1e-3, top_p=1e-3)


def test_unknown_length_penalty_is_refused():
    from keras_transformer import decoding
    from keras_transformer.export import DecodingConfig

    with pytest.raises(ValueError, match="length_penalty_form must be one of .*'wu'"):
        DecodingConfig(length_penalty_form="wu")
    with pytest.raises(ValueError, match="length_penalty_form"):
        decoding.beam_search(lambda t, c, i: (None, c), {}, 1, 4, length_penalty_form="wu")


@pytest.fixture(scope="module")
def sampler(small_tokenizer):
    model = tiny_model(small_tokenizer, seed=9)
    return tiny_translator(small_tokenizer, model, search="sample", top_p=0.95,
                           max_input_length=TABLE, max_output_length=TABLE)


def seeded(translator, sentences, seeds):
    result = translator.translate_seeded(tf.constant(sentences), tf.constant(seeds, tf.int64))
    return [t.decode("utf-8") for t in result["translation"].numpy().tolist()]


def test_a_seeded_sample_does_not_depend_on_the_rest_of_the_batch(sampler):
    sentences = ["ka lo mi", "bal dor fen", "ka lo mi", "tu vo", "", "sel tam vin nip"]
    seeds = [7, 7, 8, 7, 7, 123]
    batch = seeded(sampler, sentences, seeds)
    for i, (sentence, seed) in enumerate(zip(sentences, seeds)):
        assert seeded(sampler, [sentence], [seed]) == [batch[i]], (sentence, seed)
    assert seeded(sampler, sentences[::-1], seeds[::-1]) == batch[::-1]
    # The seed matters: one sentence under many seeds gives several samples.
    assert len(set(seeded(sampler, ["ka lo mi"] * 12, list(range(12))))) > 1


def test_sentences_sharing_a_seed_are_sampled_independently(small_tokenizer):
    # The docs say to repeat one seed for every sentence to seed a whole request, but the
    # seed was each row's whole random stream: sentences sharing it drew the same number at
    # every step, so alike distributions gave the same tokens. Here every source gives
    # about the same distribution (four pieces far above the rest, END never): 30
    # different sentences under one seed came back as one or two translations.
    pieces = range(10, 14)
    model = tiny_model(small_tokenizer, bias={END_ID: -1e4, **{p: 8.0 for p in pieces}})
    sampler = tiny_translator(small_tokenizer, model, search="sample",
                              max_input_length=TABLE, max_output_length=TABLE)
    words = ["ka", "lo", "mi", "bal", "dor", "fen", "gim", "hut", "tu", "vo"]
    sentences = [f"{a} {b}" for a in words[:6] for b in words[6:]][:30]
    shared = seeded(sampler, sentences, [7] * len(sentences))
    assert len(set(shared)) > len(sentences) // 2, len(set(shared))
    # Seeds made from the sentences' own hashes do not cancel the mixing (an XOR did).
    hashes = tf.strings.to_hash_bucket_fast(tf.constant(sentences), 2**63 - 1).numpy()
    assert len(set(seeded(sampler, sentences, hashes.tolist()))) > len(sentences) // 2
    # Still a function of the sentence and its seed alone.
    assert seeded(sampler, sentences[3:4], [7]) == shared[3:4]
    assert seeded(sampler, sentences[::-1], [7] * len(sentences)) == shared[::-1]


def test_unseeded_sampling_does_not_replay_the_global_seed_it_was_traced_under(
        small_tokenizer):
    # `train()` sets Keras' global seed; a sampling export traced after it fixed the seed of
    # its "fresh random seed" op: every process loading the export (every `translate` run,
    # every server replica) drew the same samples on its n-th call.
    results = []
    for _ in range(2):
        model = tiny_model(small_tokenizer, seed=9)  # sets the global seed, as train() does
        translator = tiny_translator(small_tokenizer, model, search="sample",
                                     max_input_length=TABLE, max_output_length=TABLE)
        results.append(outputs(translator, ["ka lo mi", "bal dor fen", "tu vo"] * 4)[0])
    assert results[0] != results[1]


def test_unseeded_sampling_draws_a_new_sample_on_every_call(sampler):
    sentences = ["ka lo mi", "bal dor fen", "tu vo", "sel tam vin nip"] * 2
    first, _, _ = outputs(sampler, sentences)
    second, _, _ = outputs(sampler, sentences)
    assert first != second


def test_jit_leaves_sampling_uncompiled_and_its_cache_growing(small_tokenizer):
    """`--jit` compiles `translate_greedy` only in a sampling export: its `translate` had
    taken the fixed-size cache of the XLA search without being compiled (1.9x slower)."""
    model = tiny_model(small_tokenizer, seed=9)
    settings = dict(search="sample", top_p=0.95, max_input_length=TABLE,
                    max_output_length=TABLE)
    jit = tiny_translator(small_tokenizer, model, jit_compile=True, **settings)
    fixed_lengths = []
    step_function = jit._parts.step_function

    def recording(*args, fixed_length=False, **kwargs):
        fixed_lengths.append(fixed_length)
        return step_function(*args, fixed_length=fixed_length, **kwargs)

    jit._parts.step_function = recording
    sentences, seeds = ["ka lo mi", "bal dor fen gim", ""], [3, 4, 5]
    samples = seeded(jit, sentences, seeds)
    assert fixed_lengths == [False]
    plain = tiny_translator(small_tokenizer, model, **settings)
    assert samples == seeded(plain, sentences, seeds)


def test_metadata_answers_none_as_an_empty_string(small_tokenizer):
    # The docstring allows None values; the signature had answered the string "None".
    from keras_transformer.export import DecodingConfig, Translator

    translator = Translator(tiny_model(small_tokenizer), small_tokenizer, small_tokenizer,
                            DecodingConfig(max_input_length=TABLE, max_output_length=TABLE),
                            metadata={"source_lang": None, "data": "files"})
    answer = {k: v.numpy().decode() for k, v in translator.metadata().items()}
    assert answer == {"source_lang": "", "target_lang": "", "data": "files"}


def test_seeded_signature_only_in_sampling_exports(sampler, small_tokenizer):
    names = set(sampler.signatures())
    assert {"translate", "serving_default", "translate_greedy", "translate_seeded",
            "metadata"} == names
    text_spec, seed_spec = sampler.signatures()["translate_seeded"].structured_input_signature[0]
    assert (text_spec.name, text_spec.dtype, text_spec.shape.as_list()) == (
        "text", tf.string, [None])
    assert (seed_spec.name, seed_spec.dtype, seed_spec.shape.as_list()) == (
        "seed", tf.int64, [None])
    beam = tiny_translator(small_tokenizer, tiny_model(small_tokenizer), search="beam",
                           max_input_length=TABLE, max_output_length=TABLE)
    assert "translate_seeded" not in beam.signatures()
    with pytest.raises(tf.errors.InvalidArgumentError, match="one int64 per sentence"):
        seeded(sampler, ["ka", "lo"], [1])


def test_export_cli_sampling_flags_reach_the_translator(small_tokenizer, monkeypatch, capsys):
    """(The lead may move this to tests/test_cli.py.) `keras-transformer export --search
    sample --temperature --top-k --top-p --allow-unk` builds the matching DecodingConfig,
    and invalid values stop the command with the config's message."""
    import keras_transformer.export.run as run_module
    import keras_transformer.export.saved_model as saved_model
    from keras_transformer import cli
    from keras_transformer.export import DecodingConfig

    model = tiny_model(small_tokenizer)
    written = {}
    monkeypatch.setattr(cli, "_checkpoint_record", lambda run, requested: {
        "checkpoint": requested, "checkpoint_path": f"{run}/{requested}"})
    monkeypatch.setattr(run_module, "resolve_checkpoint",
                        lambda run, checkpoint: (checkpoint, f"{run}/{checkpoint}"))
    monkeypatch.setattr(run_module, "load_run",
                        lambda run, checkpoint, dtype_policy="float32": (
                            model, small_tokenizer, small_tokenizer, {}))
    monkeypatch.setattr(saved_model, "export_translator",
                        lambda translator, out, **kwargs: written.__setitem__("t", translator))
    base = ["export", "--model", "run", "--out", "out", "--max-input-length", str(TABLE),
            "--max-output-length", str(TABLE)]
    cli.main(base + ["--search", "sample", "--temperature", "0.7", "--top-k", "20",
                     "--top-p", "0.9", "--allow-unk"])
    config = written["t"].config
    assert (config.search, config.temperature, config.top_k, config.top_p, config.disable_unk) \
        == ("sample", 0.7, 20, 0.9, False)
    assert "translate_seeded" in written["t"].signatures()
    assert not cli.build_parser().parse_args(base).allow_unk  # UNK forbidden by default
    assert not config.jit_compile  # XLA only on request: stock servers run without it
    cli.main(base + ["--search", "greedy", "--jit"])
    assert written["t"].config.jit_compile and written["t"].config.jit_max_rows == 8
    cli.main(base + ["--search", "greedy", "--jit", "--jit-max-rows", "0"])
    assert written["t"].config.jit_max_rows is None  # XLA at every batch size
    cli.main(base)  # beam search stops as CTranslate2 does unless asked otherwise
    assert written["t"].config.early_stopping
    # The benchmarks time what an export runs by building `DecodingConfig.for_export`.
    assert written["t"].config == DecodingConfig.for_export(max_input_length=TABLE,
                                                            max_output_length=TABLE)
    # An export stores a tied projection's kernel unless asked not to; this model's
    # projection is a layer of its own, so there is nothing to store.
    assert written["t"].config.stored_projection
    assert not hasattr(written["t"], "projection_kernel")
    cli.main(base + ["--no-stored-projection"])
    assert not written["t"].config.stored_projection
    cli.main(base + ["--beam-stopping", "exact"])
    assert not written["t"].config.early_stopping
    assert written["t"].config.length_penalty_form == "gnmt"
    cli.main(base + ["--length-penalty-form", "power"])
    assert written["t"].config.length_penalty_form == "power"
    with pytest.raises(SystemExit):
        cli.main(base + ["--length-penalty-form", "wu"])
    with pytest.raises(SystemExit):
        cli.main(base + ["--beam-stopping", "never"])
    with pytest.raises(SystemExit, match="temperature"):
        cli.main(base + ["--search", "sample", "--temperature", "0"])
    with pytest.raises(SystemExit, match="top_p"):
        cli.main(base + ["--search", "sample", "--top-p", "0"])


@pytest.mark.parametrize("settings", [dict(temperature=0.7), dict(top_k=5), dict(top_p=0.9)],
                         ids=["temperature", "top_k", "top_p"])
@pytest.mark.parametrize("search", ["beam", "greedy"])
def test_sampling_settings_without_the_sampling_search_are_refused(settings, search):
    # They would be ignored: the translations would come from another search.
    from keras_transformer.export import DecodingConfig

    with pytest.raises(ValueError, match="search='sample'"):
        DecodingConfig(search=search, **settings)
    assert DecodingConfig(search="sample", **settings).search == "sample"


def test_translator_refuses_tokenizers_of_another_vocabulary(small_tokenizer):
    from keras_transformer.export import Translator
    from keras_transformer.model import build_transformer

    size = small_tokenizer.vocab_size
    small = dict(d_model=16, num_heads=2, ff_dim=32, num_layers=1, max_length=TABLE)
    with pytest.raises(ValueError, match=f"source tokenizer has {size} .* {size + 8}"):
        Translator(build_transformer(size + 8, **small), small_tokenizer, small_tokenizer)
    with pytest.raises(ValueError, match=f"target tokenizer has {size} .* {size - 4}"):
        Translator(build_transformer(size, target_vocab_size=size - 4, tie_embeddings=False,
                                     **small), small_tokenizer, small_tokenizer)

    class MethodSized:  # tensorflow_text's tokenizers have a vocab_size() method
        def vocab_size(self):
            return size + 8

    with pytest.raises(ValueError, match=f"source tokenizer has {size + 8} .* {size}"):
        Translator(build_transformer(size, **small), MethodSized(), small_tokenizer)


def test_translator_takes_a_list_of_sentences_and_a_decoding_config(small_tokenizer):
    from keras_transformer.export import Translator

    model = tiny_model(small_tokenizer)
    translator = tiny_translator(small_tokenizer, model, search="greedy",
                                 max_input_length=TABLE, max_output_length=TABLE)
    # A string is an iterable of characters: it would be translated letter by letter.
    with pytest.raises(TypeError, match="list of sentences"):
        translator("ka lo mi")
    assert len(translator(["ka lo mi"])) == 1
    # Items that are not text: TensorFlow's conversion error, naming no sentence, before.
    for items in ([None], ["ka", 1]):
        with pytest.raises(TypeError, match="Expected str or bytes sentences, got"):
            translator(items)
    assert len(translator([b"ka lo", "mi"])) == 2
    with pytest.raises(TypeError, match="DecodingConfig"):
        Translator(model, small_tokenizer, small_tokenizer, {"beam_size": 4})


@pytest.mark.slow
def test_a_huge_source_is_cut_before_it_is_tokenized(copy_task, monkeypatch):
    # A 5 MB request was tokenized whole (1.3 s holding a batch thread) to keep 24 pieces.
    translator = copy_task.translator(search="greedy")
    seen = tf.Variable(0, dtype=tf.int32)
    tokenize = translator.source_tokenizer.tokenize

    def spy(text):
        seen.assign(tf.maximum(seen, tf.reduce_max(tf.strings.length(text))))
        return tokenize(text)

    # The tokenizer is the copy task's, shared by every test: undone after this one.
    monkeypatch.setattr(translator.source_tokenizer, "tokenize", spy)
    head = "bal dor fen gim hut sel tam vin " * 8  # more than max_input_length pieces
    huge = head + "ka lo " * 200_000
    result = translator.translate(tf.constant([huge, head, "ka lo"], tf.string))
    cap = DECODING["max_input_length"] * 64  # bytes: 16 characters of 4 bytes a piece
    assert 0 < seen.numpy() <= cap
    assert result["truncated"].numpy().tolist() == [True, True, False]
    translations = result["translation"].numpy().tolist()
    assert translations[0] == translations[1]  # the pieces kept are the same
    # A cut inside a multi-byte character does not spoil the sentence.
    euros = translator.translate(tf.constant(["a" + "€" * cap, "a" + "€" * ((cap - 1) // 3)],
                                             tf.string))  # 1 + 3 n bytes: the cap splits one
    assert euros["translation"].numpy()[0] == euros["translation"].numpy()[1]
    assert euros["truncated"].numpy().tolist() == [True, True]
    # Bytes the normalization removes (whitespace runs, zero-width spaces) are no pieces: a
    # long source of few pieces is tokenized whole, not cut (the cut kept "ka ka ka").
    spaced = ("ka" + " " * 3000) * 3 + "lo mi"
    zero_width = ("ka" + "\u200b" * 3000) + " lo mi"
    blank_first = " " * (2 * cap) + "ka lo mi"  # the cut part alone has no text
    result = translator.translate(tf.constant(
        [spaced, zero_width, blank_first, "ka ka ka lo mi", "ka lo mi", "ka lo mi"], tf.string))
    translations = result["translation"].numpy().tolist()
    assert translations[:3] == translations[3:] and translations[2]
    assert result["truncated"].numpy().tolist() == [False] * 6

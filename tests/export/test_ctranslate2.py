"""`keras_transformer.export.ctranslate2_converter`: CTranslate2 as a correctness oracle.

A converted model must compute our model: the same log-probabilities for a given translation
(post-norm and pre-norm, tied and untied, sinusoidal and learned positions) and, on the tiny
trained copy model, the same greedy translation token for token; CTranslate2's beam search
is ours with CTranslate2's length penalty (`length_penalty_form="power"`).
"""

import json
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

ctranslate2 = pytest.importorskip(
    "ctranslate2", reason="ctranslate2 is not installed (pip install -e .[bench])")

from keras_transformer import decoding  # noqa: E402
from keras_transformer.export import ctranslate2_converter  # noqa: E402
from keras_transformer.model import TransformerParts, build_transformer  # noqa: E402
from keras_transformer.text import END_ID, PAD_ID, START_ID  # noqa: E402
from tests.export.conftest import flattened_copy  # noqa: E402

MAX_DECODING_LENGTH = 32
# float32 in both engines; different kernels and summation orders.
LOG_PROB_TOLERANCE = 1e-4


def _pieces(tokenizer, sentences):
    """Source pieces as CTranslate2 takes them (it appends `</s>` itself)."""
    ids = tokenizer.tokenize(tf.constant(sentences))
    pieces = tf.ragged.map_flat_values(tokenizer.id_to_piece, ids)
    return [[p.decode() for p in row] for row in pieces.to_list()]


def _ids(tokenizer, sentences, **kwargs):
    return tokenizer.tokenize(tf.constant(sentences), **kwargs).to_list()


def _search(model, tokenizer, sentences, search, **kwargs):
    """Our `search` (a `decoding` function) on `sentences`: token ids without END."""
    parts = TransformerParts(model)
    source = tokenizer.tokenize(tf.constant(sentences), add_end=True).to_tensor(PAD_ID)
    memory, memory_mask = parts.encode(source)
    cache = parts.initial_cache(memory, memory_mask, MAX_DECODING_LENGTH)
    result = search(parts.next_logits, cache, batch_size=len(sentences),
                    max_length=MAX_DECODING_LENGTH, start_id=START_ID, end_id=END_ID,
                    pad_id=PAD_ID, **kwargs)
    tokens, lengths = result.tokens.numpy(), result.lengths.numpy()
    # CTranslate2's hypotheses leave out END.
    return [[int(t) for t in row[:n] if t != END_ID] for row, n in zip(tokens, lengths)]


def _our_greedy(model, tokenizer, sentences):
    return _search(model, tokenizer, sentences, decoding.greedy_search)


@pytest.mark.slow
def test_ctranslate2_greedy_equals_ours_token_for_token(copy_task, tmp_path):
    path = ctranslate2_converter.convert(
        copy_task.model, copy_task.tokenizer, copy_task.tokenizer, tmp_path / "ct2")
    translator = ctranslate2.Translator(str(path), device="cpu", inter_threads=1,
                                        intra_threads=1)
    sentences = copy_task.held_out[:16]
    results = translator.translate_batch(
        _pieces(copy_task.tokenizer, sentences), beam_size=1,
        max_decoding_length=MAX_DECODING_LENGTH)
    theirs = [[int(i) for i in copy_task.tokenizer.piece_to_id(r.hypotheses[0]).numpy()]
              for r in results]
    ours = _our_greedy(copy_task.model, copy_task.tokenizer, sentences)
    assert theirs == ours
    # The copy model copies: the oracle is compared on real translations, not empty ones.
    assert sum(o == s for o, s in zip(ours, _ids(copy_task.tokenizer, sentences))) >= 12


def _our_beam(model, tokenizer, sentences, alpha, form):
    return _search(model, tokenizer, sentences, decoding.beam_search, beam_size=4, alpha=alpha,
                   early_stopping=True, length_penalty_form=form)


@pytest.mark.slow
def test_ctranslate2_beam_search_equals_ours_with_its_length_penalty(copy_task, tmp_path):
    """CTranslate2's beam search is ours with `early_stopping` and the "power" penalty, on
    a model unsure enough that the penalty's form changes translations. (At
    `length_penalty=0` CTranslate2 stops as soon as its best candidate ends: not compared.)"""
    tokenizer = copy_task.tokenizer
    model = flattened_copy(copy_task.model, 0.25)
    path = ctranslate2_converter.convert(model, tokenizer, tokenizer, tmp_path / "ct2")
    translator = ctranslate2.Translator(str(path), device="cpu", inter_threads=1,
                                        intra_threads=1)
    sentences = copy_task.held_out[:16]
    pieces = _pieces(tokenizer, sentences)
    source_ids = _ids(tokenizer, sentences)
    differ = 0
    for alpha in (0.6, 1.0, 3.0):
        # min_decoding_length=0: END may come first, as in ours (CTranslate2's Python
        # default, 1, forbids an empty translation).
        results = translator.translate_batch(pieces, beam_size=4, length_penalty=alpha,
                                             max_decoding_length=MAX_DECODING_LENGTH,
                                             min_decoding_length=0)
        theirs = [[int(i) for i in tokenizer.piece_to_id(r.hypotheses[0]).numpy()]
                  for r in results]
        ours = _our_beam(model, tokenizer, sentences, alpha, "power")
        mismatched = [i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b]
        # Float32 in both engines, different kernels: a mismatch may only be a near-tie of
        # the two hypotheses' normalized scores (ours computed for both).
        for i in mismatched:
            scores = [sum(_log_probs(model, [source_ids[i]], [hypothesis])[0])
                      / (len(hypothesis) + 1) ** alpha for hypothesis in (theirs[i], ours[i])]
            assert abs(scores[0] - scores[1]) < LOG_PROB_TOLERANCE, (alpha, i, scores)
        assert len(mismatched) <= 1, (alpha, mismatched)
        gnmt = _our_beam(model, tokenizer, sentences, alpha, "gnmt")
        differ += sum(a != b for a, b in zip(theirs, gnmt))
    assert differ > 0  # GNMT's penalty is another objective: this model tells them apart


@pytest.mark.slow
def test_translator_searches_with_the_configured_length_penalty(copy_task):
    from keras_transformer.export import DecodingConfig, Translator

    tokenizer = copy_task.tokenizer
    model = flattened_copy(copy_task.model, 0.25)
    sentences = copy_task.held_out[:16]
    for form in ("gnmt", "power"):
        translator = Translator(model, tokenizer, tokenizer, DecodingConfig(
            beam_size=4, alpha=3.0, length_penalty_form=form, disable_unk=False,
            max_output_length=MAX_DECODING_LENGTH))
        texts = [t.decode() for t in translator.translate(tf.constant(sentences))[
            "translation"].numpy()]
        expected = tokenizer.detokenize(tf.ragged.constant(
            _our_beam(model, tokenizer, sentences, 3.0, form), dtype=tf.int32)).numpy()
        assert texts == [t.decode() for t in expected], form


def _log_probs(model, source_ids, target_ids):
    """Our log-probability of each target token and of END, teacher-forced."""
    encoder = tf.ragged.constant([s + [END_ID] for s in source_ids]).to_tensor(PAD_ID)
    decoder = tf.ragged.constant([[START_ID] + t for t in target_ids]).to_tensor(PAD_ID)
    logits = model({"encoder_tokens": encoder, "decoder_tokens": decoder}, training=False)
    log_probs = tf.nn.log_softmax(logits).numpy()
    return [
        [float(log_probs[b, i, token]) for i, token in enumerate(target + [END_ID])]
        for b, target in enumerate(target_ids)
    ]


@pytest.mark.parametrize(
    "variant",
    [
        dict(norm_first=False),
        dict(norm_first=True),
        dict(norm_first=True, tie_embeddings=False, learned_positions=True, max_length=40),
        dict(norm_first=False, activation="gelu", layer_norm_epsilon=1e-5),
    ],
    ids=["post_norm", "pre_norm", "pre_norm_untied_learned", "post_norm_gelu_eps"],
)
def test_ctranslate2_scores_equal_ours(variant, copy_task, tmp_path):
    keras.utils.set_random_seed(3)
    tokenizer = copy_task.tokenizer
    model = build_transformer(tokenizer.vocab_size, d_model=16, num_heads=2, ff_dim=32,
                              num_layers=2, dropout=0.0, **variant)
    # Non-trivial norms: a converter that swapped gamma and beta or lost them would pass on
    # the initial ones (1 and 0).
    for weight in model.weights:
        if weight.path.endswith(("gamma", "beta")):
            weight.assign(np.random.default_rng(0).normal(1.0, 0.3, weight.shape).astype("float32"))
    # A learned table bounds the lengths (`convert` refuses bounds past it).
    bounds = min(variant.get("max_length", 128), 128)
    path = ctranslate2_converter.convert(
        model, tokenizer, tokenizer, tmp_path / "ct2",
        metadata={"decoding": {"max_input_length": bounds, "max_output_length": bounds}})
    translator = ctranslate2.Translator(str(path), device="cpu", intra_threads=1)
    sources, targets = copy_task.held_out[:4], copy_task.held_out[4:8]
    results = translator.score_batch(_pieces(tokenizer, sources), _pieces(tokenizer, targets))
    theirs = [r.log_probs for r in results]
    ours = _log_probs(model, _ids(tokenizer, sources), _ids(tokenizer, targets))
    for their_row, our_row in zip(theirs, ours):
        np.testing.assert_allclose(their_row, our_row, atol=LOG_PROB_TOLERANCE)


def test_vocabulary_is_the_pieces_in_id_order(copy_task):
    pieces = ctranslate2_converter.vocabulary(copy_task.tokenizer)
    assert pieces[:4] == ["<pad>", "<s>", "</s>", "<unk>"]
    assert len(pieces) == copy_task.tokenizer.vocab_size
    assert copy_task.tokenizer.piece_to_id(pieces).numpy().tolist() == list(range(len(pieces)))


@pytest.fixture(scope="module")
def copy_run(copy_task, tmp_path_factory):
    """The copy model as a run directory of `train` (final model, vocabulary, config) whose
    validation split is the held-out sentences (in an en -> de direction: a copy task)."""
    import json
    import shutil

    root = tmp_path_factory.mktemp("copy_run")
    run = root / "run"
    (run / "tokenizer").mkdir(parents=True)
    shutil.copyfile(copy_task.tokenizer.model_path, run / "tokenizer" / "tokenizer.model")
    copy_task.model.save(run / "model.keras")
    files = {}
    for split, sentences in (("train", copy_task.train[:50]), ("valid", copy_task.held_out)):
        files[split] = []
        for lang in ("en", "de"):
            path = root / f"{split}.{lang}"
            path.write_text("\n".join(sentences) + "\n")
            files[split].append(str(path))
    config = {"data": "files", "source_lang": "en", "target_lang": "de",
              "data_files": {"train": files["train"], "validation": files["valid"]}}
    (run / "config.json").write_text(json.dumps(config))
    return run


@pytest.mark.slow
def test_export_ctranslate2_checks_then_writes_what_translate_and_evaluate_take(
        copy_run, copy_task, tmp_path, capsys, monkeypatch):
    from keras_transformer import cli

    out = tmp_path / "ct2"
    monkeypatch.chdir(copy_run.parent)  # the run named by a relative path
    cli.main(["export-ctranslate2", "--model", copy_run.name, "--out", str(out),
              "--check-sentences", "20", "--beam-size", "3", "--alpha", "0.8"])
    printed = capsys.readouterr().out
    check = re.search(r"greedy check on 20 validation sentences: (\d+) of (\d+) translations "
                      "the same in both engines", printed)
    assert check and int(check[2]) >= 18 and int(check[1]) >= 0.9 * int(check[2]), printed
    record = json.loads((out / "keras_transformer.json").read_text())
    assert record["decoding"] == {"beam_size": 3, "length_penalty": 0.8,
                                  "max_input_length": 128, "max_output_length": 128}
    assert (record["checkpoint"], record["source_lang"], record["target_lang"]) == (
        "final", "en", "de")
    # What was converted and how it was checked, readable from anywhere (the path was
    # relative to the shell's directory; the check's outcome and the version were not kept).
    assert record["checkpoint_path"] == str((copy_run / "model.keras").resolve())
    assert record["run_dir"] == str(copy_run.resolve())
    assert record["check"] == {"sentences": 20, "compared": int(check[2]), "same": int(check[1])}
    assert record["ctranslate2"] == ctranslate2.__version__
    assert record["positions"] == {"source": 1024, "target": 1024}
    assert not [p.name for p in tmp_path.iterdir() if p.name != "ct2"]  # no staging left

    source, output = tmp_path / "in.en", tmp_path / "out.de"
    source.write_text("\n".join(copy_task.held_out[:6]) + "\n")
    loaded = []
    translator_class = ctranslate2.Translator

    def recording(*args, **kwargs):  # which compute type reaches CTranslate2
        loaded.append(kwargs.get("compute_type"))
        return translator_class(*args, **kwargs)

    monkeypatch.setattr(ctranslate2, "Translator", recording)
    cli.main(["translate", "--export", str(out), "--input", str(source), "--output",
              str(output), "--compute-type", "int8"])
    assert loaded == ["int8"]
    # Beam 3 of the record, in int8: what the Python translator gives with these settings.
    from keras_transformer.export.ctranslate2_translator import CTranslate2Translator

    expected = CTranslate2Translator(out, compute_type="int8")(copy_task.held_out[:6])
    assert output.read_text().splitlines() == expected
    assert sum(t == s for t, s in zip(expected, copy_task.held_out)) >= 4  # real copies
    capsys.readouterr()
    cli.main(["evaluate", "--export", str(out), "--split", "validation", "--limit", "10"])
    printed = capsys.readouterr().out
    assert "Evaluating on files en->de [validation]" in printed, printed
    assert float(re.search(r"BLEU \(cased, detokenized\): ([\d.]+)", printed)[1]) > 80

    # A directory that is not empty is refused before the model loads.
    with pytest.raises(SystemExit, match="exists and is not an empty directory"):
        cli.main(["export-ctranslate2", "--model", str(tmp_path / "no_run"), "--out", str(out)])


@pytest.mark.slow
def test_export_ctranslate2_refuses_to_skip_its_check_unless_told(copy_run, tmp_path, capsys):
    import shutil

    from keras_transformer import cli

    run = tmp_path / "moved_run"  # its validation files gone
    shutil.copytree(copy_run, run)
    config = json.loads((run / "config.json").read_text())
    config["data_files"]["validation"] = [str(tmp_path / "gone.en"), str(tmp_path / "gone.de")]
    (run / "config.json").write_text(json.dumps(config))
    out = tmp_path / "new" / "ct2"  # its parent is created
    with pytest.raises(SystemExit, match="cannot be read .* or convert unchecked with "
                       "--check-sentences 0"):
        cli.main(["export-ctranslate2", "--model", str(run), "--out", str(out)])
    assert not out.exists()
    cli.main(["export-ctranslate2", "--model", str(run), "--out", str(out),
              "--check-sentences", "0"])
    assert "not checked against our model (--check-sentences 0)" in capsys.readouterr().out
    assert (out / "model.bin").is_file()
    assert json.loads((out / "keras_transformer.json").read_text())["check"] == {"sentences": 0}


@pytest.mark.slow
def test_convert_run_replaces_an_empty_directory_and_a_stale_staging_one(copy_run, tmp_path):
    from keras_transformer.textfiles import partial_path

    out = tmp_path / "ct2"
    out.mkdir()  # empty: taken
    link = tmp_path / "link"
    link.symlink_to(out)
    staging = partial_path(out)  # what a killed process of this same id left
    staging.mkdir()
    (staging / "model.bin").write_text("half")
    path, check = ctranslate2_converter.convert_run(copy_run, link, checkpoint="final")
    assert path == out and check is None and (out / "model.bin").stat().st_size > 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2", "link"]


def test_a_check_that_compared_nothing_or_disagrees_refuses_the_conversion():
    check = ctranslate2_converter._check_agreement
    with pytest.raises(ValueError, match="None of the check's greedy translations ended"):
        check({"compared": 0, "same": 0, "examples": []})
    with pytest.raises(ValueError, match="differ from ours in 2 of 10 sentences"):
        check({"compared": 10, "same": 8, "examples": [("a", "b", "c")]})
    check({"compared": 10, "same": 9, "examples": [("a", "b", "c")]})  # float rounding


@pytest.mark.slow
def test_a_conversion_that_is_not_faithful_is_refused_and_nothing_is_written(
        copy_run, copy_task, tmp_path, monkeypatch):
    # A converter bug: the norms' gamma and beta swapped.
    def swapped(spec, read, prefix):
        spec.gamma, spec.beta = read(f"{prefix}/beta"), read(f"{prefix}/gamma")

    monkeypatch.setattr(ctranslate2_converter, "_set_layer_norm", swapped)
    out = tmp_path / "ct2"
    with pytest.raises(ValueError, match=r"differ from ours in \d+ of 20 sentences") as error:
        ctranslate2_converter.convert_run(copy_run, out, check_sentences=copy_task.held_out[:20])
    assert "SRC: " in str(error.value) and "CTRANSLATE2: " in str(error.value)
    assert list(tmp_path.iterdir()) == []


def test_export_ctranslate2_without_ctranslate2_says_how_to_install_it(tmp_path, monkeypatch):
    import sys

    from keras_transformer import cli

    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import fails
    with pytest.raises(SystemExit, match=r"pip install 'keras-transformer\[ctranslate2\]'"):
        cli.main(["export-ctranslate2", "--model", str(tmp_path), "--out", str(tmp_path / "o")])


@pytest.mark.slow
def test_a_compute_type_is_refused_for_a_savedmodel(exported, tmp_path):
    from keras_transformer import cli

    source = tmp_path / "in.txt"
    source.write_text("ka lo\n")
    for command in (["translate", "--input", str(source)],
                    ["evaluate", "--src", str(source), "--ref", str(source)]):
        with pytest.raises(SystemExit, match="--compute-type is a setting of CTranslate2"):
            cli.main([*command, "--export", str(exported), "--compute-type", "int8"])


def test_a_missing_or_half_export_is_named_as_such(tmp_path):
    # A mistyped --export said "is neither a SavedModel nor a base directory" (with
    # --compute-type: "is not" a CTranslate2 model); a CTranslate2 model.bin without its
    # record was called no SavedModel.
    from keras_transformer import cli
    from keras_transformer.export import latest_version_dir

    source = tmp_path / "in.txt"
    source.write_text("ka lo\n")
    missing = tmp_path / "ctranslat2"
    with pytest.raises(FileNotFoundError, match="ctranslat2 does not exist"):
        latest_version_dir(missing)
    for extra in ([], ["--compute-type", "int8"]):
        with pytest.raises(SystemExit, match="ctranslat2 does not exist"):
            cli.main(["translate", "--input", str(source), "--export", str(missing), *extra])
    half = tmp_path / "half"
    half.mkdir()
    (half / "model.bin").write_bytes(b"\0")
    with pytest.raises(FileNotFoundError, match="model.bin without keras_transformer.json"):
        latest_version_dir(half)
    for extra in ([], ["--compute-type", "int8"]):
        with pytest.raises(SystemExit, match="model.bin without keras_transformer.json"):
            cli.main(["translate", "--input", str(source), "--export", str(half), *extra])
    # A whole CTranslate2 directory, given where a SavedModel is needed, is called one.
    (half / "keras_transformer.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="half is a CTranslate2 model"):
        latest_version_dir(half)

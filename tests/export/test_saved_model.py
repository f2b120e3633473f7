"""The exported SavedModel: layout, signatures, fresh-process loading, saved_model_cli, inputs
that must not break it, and versioned directories."""

import ast
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import saved_model_pb2

from keras_transformer.export import ExportedTranslator, export_translator, latest_version_dir
from tests.export.conftest import COPY_DIRECTION, DECODING

REPO = pathlib.Path(__file__).resolve().parents[2]
VENV_BIN = pathlib.Path(sys.executable).parent
SIGNATURES = ("translate", "serving_default", "translate_greedy")
OUTPUT_DTYPES = {
    "translation": types_pb2.DT_STRING,
    "score": types_pb2.DT_FLOAT,
    "length": types_pb2.DT_INT32,
    "truncated": types_pb2.DT_BOOL,
    "unfinished": types_pb2.DT_BOOL,
}
# A subprocess that may import only tensorflow and tensorflow_text: a meta-path hook makes
# any import of this package fail, and the child reports what it imported.
FRESH_PROCESS_SCRIPT = r"""
import json, sys

class RefuseProjectImports:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "keras_transformer":
            raise ImportError(f"{name} was imported while serving the SavedModel")
        return None

sys.meta_path.insert(0, RefuseProjectImports())
import tensorflow as tf
import tensorflow_text  # noqa: F401  (SentencePiece ops)

path, sentences = sys.argv[1], json.loads(sys.argv[2])
loaded = tf.saved_model.load(path)
text = tf.constant(sentences, tf.string)

def lists(outputs):
    return {key: [v.decode("utf-8") if isinstance(v, bytes) else v
                  for v in value.numpy().tolist()] for key, value in outputs.items()}

result = {name: lists(loaded.signatures[name](text=text))
          for name in ("translate", "serving_default", "translate_greedy")}
result["function_attribute"] = lists(loaded.translate(text))
assert "keras_transformer" not in sys.modules
result["keras_transformer_modules"] = [m for m in sys.modules if m.startswith("keras_transformer")]
print("RESULT " + json.dumps(result))
"""


def version_dir(base):
    return latest_version_dir(base)


def signature_defs(saved_model_dir):
    """The signature defs as TF Serving reads them, from `saved_model.pb`."""
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((pathlib.Path(saved_model_dir) / "saved_model.pb").read_bytes())
    (meta_graph,) = proto.meta_graphs
    assert "serve" in meta_graph.meta_info_def.tags
    return meta_graph.signature_def


def in_process(copy_task, sentences, search="beam"):
    from tests.export.conftest import EXPORT_BEAM_SIZE

    translator = copy_task.translator(search=search, beam_size=EXPORT_BEAM_SIZE)
    outputs = translator.translate(tf.constant(sentences, tf.string))
    return (
        [t.decode("utf-8") for t in outputs["translation"].numpy().tolist()],
        outputs["score"].numpy(),
        outputs["length"].numpy(),
    )


def child_env():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    env.pop("PYTHONPATH", None)
    return env


@pytest.mark.slow
def test_layout_signatures_and_assets(exported):
    saved_model_dir = version_dir(exported)
    assert saved_model_dir == exported / "1"
    definitions = signature_defs(saved_model_dir)
    assert set(SIGNATURES) <= set(definitions)
    for name in SIGNATURES:
        definition = definitions[name]
        assert set(definition.inputs) == {"text"}
        text = definition.inputs["text"]
        assert text.dtype == types_pb2.DT_STRING
        assert [d.size for d in text.tensor_shape.dim] == [-1]
        assert set(definition.outputs) == set(OUTPUT_DTYPES)
        for key, dtype in OUTPUT_DTYPES.items():
            assert definition.outputs[key].dtype == dtype, (name, key)
            assert [d.size for d in definition.outputs[key].tensor_shape.dim] == [-1]
    assets = list((saved_model_dir / "assets").glob("*.model"))
    assert len(assets) == 1 and assets[0].stat().st_size > 0
    record = json.loads((saved_model_dir / "assets.extra" / "translator.json").read_text())
    assert record["decoding"]["search"] == "beam"
    assert record["decoding"]["max_input_length"] == DECODING["max_input_length"]
    assert record["task"] == "copy"  # the metadata argument
    # The Translator's metadata (the direction), which a batching server cannot ask the
    # `metadata` signature for, was missing from the record.
    assert {key: record.get(key) for key in COPY_DIRECTION} == COPY_DIRECTION
    # A None value (the signature answers "") is not recorded: `null` had stood for it,
    # which readers of the record took as the value instead of falling back.
    assert "domain" not in record
    assert record["tensorflow"] == tf.__version__


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_moved_export_loads_in_a_fresh_process_without_this_package(
    exported, copy_task, tmp_path
):
    sentences = copy_task.held_out[:6] + ["", "ka"]
    completed = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS_SCRIPT, str(exported / "1"), json.dumps(sentences)],
        cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=170,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    (line,) = [l for l in completed.stdout.splitlines() if l.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    assert result["keras_transformer_modules"] == []
    translations, scores, lengths = in_process(copy_task, sentences)
    for name in ("translate", "serving_default", "function_attribute"):
        assert result[name]["translation"] == translations, name
        np.testing.assert_array_equal(result[name]["length"], lengths)
        np.testing.assert_allclose(result[name]["score"], scores, rtol=1e-4, atol=1e-4)
    greedy, _, greedy_lengths = in_process(copy_task, sentences, search="greedy")
    assert result["translate_greedy"]["translation"] == greedy
    np.testing.assert_array_equal(result["translate_greedy"]["length"], greedy_lengths)
    # The model learned to copy: the served translations are the sources.
    assert sum(t == s for t, s in zip(translations[:6], sentences[:6])) >= 4


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_saved_model_cli_show_reads_the_signatures(exported):
    completed = subprocess.run(
        [str(VENV_BIN / "saved_model_cli"), "show", "--dir", str(exported / "1"), "--all"],
        env=child_env(), capture_output=True, text=True, timeout=110,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    out = completed.stdout
    for name in SIGNATURES:
        assert f"signature_def['{name}']" in out
    assert "inputs['text'] tensor_info:" in out
    assert re.search(r"outputs\['length'\] tensor_info:\s+dtype: DT_INT32\s+shape: \(-1\)", out)
    for flag in ("truncated", "unfinished"):
        assert re.search(rf"outputs\['{flag}'\] tensor_info:\s+dtype: DT_BOOL\s+shape: \(-1\)",
                         out)
    assert re.search(r"outputs\['score'\] tensor_info:\s+dtype: DT_FLOAT\s+shape: \(-1\)", out)
    assert re.search(r"outputs\['translation'\] tensor_info:\s+dtype: DT_STRING", out)


def parse_cli_strings(stdout, key):
    """The byte strings of `Result for output key <key>:` in saved_model_cli's stdout."""
    match = re.search(rf"Result for output key {key}:\n(\[.*?\])\n", stdout + "\n", re.S)
    assert match, stdout
    literals = re.findall(r"b'(?:[^'\\]|\\.)*'|b\"(?:[^\"\\]|\\.)*\"", match.group(1))
    return [ast.literal_eval(literal).decode("utf-8") for literal in literals]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_saved_model_cli_session_loader_runs_translate(exported, copy_task):
    """The TF1 session loader (what TF Serving uses) restores the variables and runs the
    search; `export/saved_model_cli.sh` registers the tf-text ops first."""
    sentences = copy_task.held_out[:3]
    completed = subprocess.run(
        ["bash", str(REPO / "export" / "saved_model_cli.sh"), "run",
         "--dir", str(exported / "1"), "--tag_set", "serve", "--signature_def", "translate",
         "--input_exprs", f"text={json.dumps(sentences)}"],
        env=dict(child_env(), PYTHON=sys.executable), capture_output=True, text=True,
        timeout=170,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    translations = parse_cli_strings(completed.stdout, "translation")
    assert translations == in_process(copy_task, sentences)[0]


@pytest.mark.timeout(300)
def test_warmup_requests_parse_as_tf_servings_and_run_in_the_session_loader(exported):
    """Nothing wrote `assets.extra/tf_serving_warmup_requests`: a server's first request
    paid 0.8 s of graph optimization (a `--jit` export's, 2.4-3.9 s per shape). Its records
    must parse as TF Serving's `PredictionLog` and run as the server replays them."""
    import tensorflow_text  # noqa: F401
    from tensorflow_serving.apis import prediction_log_pb2

    saved_model_dir = version_dir(exported)
    path = saved_model_dir / "assets.extra" / "tf_serving_warmup_requests"
    records = [prediction_log_pb2.PredictionLog.FromString(record.numpy())
               for record in tf.data.TFRecordDataset(str(path))]
    requests = [record.predict_log.request for record in records]
    assert {request.model_spec.signature_name for request in requests} == set(SIGNATURES)
    # One sentence a request: a server whose max_batch_size is smaller than a warm-up batch
    # would refuse it, and fail to load the version.
    assert {len(request.inputs["text"].string_val) for request in requests} == {1}
    assert len(requests) == 2 * len(SIGNATURES)  # a short and a longer sentence
    assert all(set(request.inputs) == {"text"} for request in requests)
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"],
                                                          str(saved_model_dir))
        for request in requests:
            signature = meta_graph.signature_def[request.model_spec.signature_name]
            text = tf.make_ndarray(request.inputs["text"])
            translations = session.run(signature.outputs["translation"].name,
                                       {signature.inputs["text"].name: text})
            assert len(translations) == len(text) and text.dtype == object


HOSTILE_INPUTS = {
    "empty": b"",
    "whitespace": b" \t \n  ",
    "very_long": ("ka " * 5000).encode(),
    "cyrillic": "Собака бежит по траве.".encode(),
    "cjk": "犬が草の上を走っている。".encode(),
    "arabic": "كلب يجري".encode(),
    "emoji": "🐕‍🦺 🏃🏽‍♀️ ❤️".encode(),
    "invalid_utf8": b"ka \xff\xfe lo \xc3 mi \xed\xa0\x80",
    "control": b"ka\x00lo\x07mi",
}


@pytest.fixture(scope="module")
def served(exported):
    return ExportedTranslator(exported)


@pytest.fixture(scope="module")
def loaded(exported):
    import tensorflow_text  # noqa: F401

    return tf.saved_model.load(str(exported / "1"))


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("signature", ["translate", "translate_greedy"])
def test_hostile_inputs_get_bounded_outputs(loaded, copy_task, signature):
    function = loaded.signatures[signature]
    empty = function(text=tf.constant([], tf.string))
    assert {k: v.shape.as_list() for k, v in empty.items()} == {
        "translation": [0], "score": [0], "length": [0], "truncated": [0], "unfinished": [0]}
    names = list(HOSTILE_INPUTS)
    outputs = function(text=tf.constant([HOSTILE_INPUTS[n] for n in names], tf.string))
    bound = min(DECODING["max_input_length"] + DECODING["extra_length"],
                DECODING["max_output_length"])
    lengths = outputs["length"].numpy()
    assert lengths.shape == (len(names),)
    blank = [names.index("empty"), names.index("whitespace")]  # no text: no translation
    assert np.all(lengths[blank] == 0) and np.all(np.delete(lengths, blank) >= 1), dict(
        zip(names, lengths))
    assert np.all(lengths <= bound), dict(zip(names, lengths))
    pieces = copy_task.tokenizer.tokenize([HOSTILE_INPUTS[n] for n in names]).row_lengths()
    assert outputs["truncated"].numpy().tolist() == [
        int(p) + 1 > DECODING["max_input_length"] for p in pieces]  # END counts
    assert outputs["truncated"].numpy()[names.index("very_long")]
    # A translation flagged unfinished stopped at its own bound (no END before it).
    bounds = [min(min(int(p) + 1, DECODING["max_input_length"]) + DECODING["extra_length"],
                  DECODING["max_output_length"]) for p in pieces]
    for name, unfinished, length, limit in zip(names, outputs["unfinished"].numpy(), lengths,
                                                bounds):
        assert not unfinished or length == limit, (name, length, limit)
    # ... and one that reached its bound without END is flagged (the longest input's is).
    assert outputs["unfinished"].numpy()[names.index("very_long")] == (
        lengths[names.index("very_long")] == bounds[names.index("very_long")])
    assert not outputs["unfinished"].numpy()[blank].any()
    assert np.all(np.isfinite(outputs["score"].numpy()))
    for name, translation in zip(names, outputs["translation"].numpy().tolist()):
        translation.decode("utf-8")  # valid UTF-8 whatever came in
    # One at a time gives the same as in the batch (no input disturbs its neighbours).
    for i, name in enumerate(names):
        alone = function(text=tf.constant([HOSTILE_INPUTS[name]]))
        assert alone["translation"].numpy()[0] == outputs["translation"].numpy()[i], name


@pytest.mark.timeout(120)
@pytest.mark.parametrize("signature", ["translate", "translate_greedy"])
def test_text_of_another_rank_than_a_batch_is_refused_by_name(loaded, signature):
    # Nothing checks a request's rank against the signature: a scalar failed in a
    # strided_slice, a (2, 2) batch in a shape error, a (B, 1) batch was flattened.
    function = loaded.signatures[signature]
    for text in (tf.constant("ka lo"), tf.constant([["ka", "lo"], ["mi", "nu"]]),
                 tf.constant([["ka"]])):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"Shape of tensor text \[.*\] is not compatible with "
                                 r"expected shape \[\?\]"):
            function(text=text)
    assert function(text=tf.constant(["ka"]))["translation"].shape == (1,)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_long_input_is_truncated_to_max_input_length(served, copy_task):
    long_text = "ka lo " * 3000
    tokenizer = copy_task.tokenizer
    ids = tokenizer.tokenize([long_text], max_length=DECODING["max_input_length"], add_end=True)
    assert int(ids.row_lengths()[0]) == DECODING["max_input_length"]
    prefix = tokenizer.detokenize(ids.to_tensor()).numpy()[0].decode()  # the kept text
    assert len(prefix) < 200
    long_result, prefix_result = served.translate([long_text, prefix])
    assert long_result.pop("truncated") and not prefix_result.pop("truncated")
    assert long_result == prefix_result


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_versions_are_numbered_and_never_overwritten(copy_task, tmp_path, monkeypatch):
    translator = copy_task.translator(search="greedy")
    base = tmp_path / "models" / "translator"
    first = export_translator(translator, base)
    second = export_translator(translator, base)
    assert (first, second) == (base / "1", base / "2")
    assert latest_version_dir(base) == second
    assert ExportedTranslator(base).version == 2
    # A greedy export has no separate greedy signature.
    names = {n for n in signature_defs(second) if not n.startswith("__")}  # no init op
    assert names == {"translate", "serving_default", "metadata"}
    with pytest.raises(FileExistsError):
        export_translator(translator, base, version=1)
    # A version directory is not a base directory: `base/2/1` would never be read.
    with pytest.raises(ValueError, match="not a model's base directory"):
        export_translator(translator, second)
    assert sorted(p.name for p in base.iterdir()) == ["1", "2"]
    assert not [p for p in second.iterdir() if p.name.isdigit() or p.name.startswith(".tmp")]

    # A killed export's staging directory (a whole SavedModel) stayed for ever: the next
    # export removes those of processes no longer running.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = base / f".tmp-3-{dead.pid}"
    (stale / "variables").mkdir(parents=True)
    third = export_translator(translator, base)
    assert third == base / "3" and not stale.exists()
    import shutil

    shutil.rmtree(third)

    # A save that fails half-way leaves neither a version nor its staging directory.
    def failing_save(obj, export_dir, signatures=None, **kwargs):
        pathlib.Path(export_dir, "variables").mkdir(parents=True)
        raise RuntimeError("disk full")

    monkeypatch.setattr(tf.saved_model, "save", failing_save)
    with pytest.raises(RuntimeError, match="disk full"):
        export_translator(translator, base)
    assert sorted(p.name for p in base.iterdir()) == ["1", "2"]
    assert not list(base.glob(".tmp-*"))

    # Another export took the same version while this one saved: it failed with "[Errno
    # 39] Directory not empty: '.tmp-3-PID' -> '3'", which said nothing of what happened.
    def racing_save(obj, export_dir, signatures=None, **kwargs):
        pathlib.Path(export_dir, "variables").mkdir(parents=True)
        (base / "3" / "variables").mkdir(parents=True)  # the other export's
    monkeypatch.setattr(tf.saved_model, "save", racing_save)
    with pytest.raises(FileExistsError, match="another export wrote .*3.* nothing was overwritten"):
        export_translator(translator, base)
    assert sorted(p.name for p in (base / "3").iterdir()) == ["variables"]
    assert not list(base.glob(".tmp-*"))


@pytest.fixture(scope="module")
def sampling_export(copy_task, tmp_path_factory):
    translator = copy_task.translator(search="sample", temperature=1.5, top_p=0.95)
    return translator, export_translator(translator, tmp_path_factory.mktemp("sampling") / "t")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sampling_export_takes_one_seed_per_sentence_in_saved_model_cli(
    sampling_export, copy_task
):
    """`translate_seeded(text: string[-1], seed: int64[-1])` runs in the TF1 session loader
    (TF Serving's) and gives what the in-process Translator gives for the same seeds."""
    translator, saved_model_dir = sampling_export
    definition = signature_defs(saved_model_dir)["translate_seeded"]
    assert set(definition.inputs) == {"text", "seed"}
    assert definition.inputs["seed"].dtype == types_pb2.DT_INT64
    assert [d.size for d in definition.inputs["seed"].tensor_shape.dim] == [-1]
    assert set(definition.outputs) == set(OUTPUT_DTYPES)
    sentences, seeds = copy_task.held_out[:3], [11, 11, 12]
    completed = subprocess.run(
        ["bash", str(REPO / "export" / "saved_model_cli.sh"), "run",
         "--dir", str(saved_model_dir), "--tag_set", "serve",
         "--signature_def", "translate_seeded",
         "--input_exprs", f"text={json.dumps(sentences)};seed={json.dumps(seeds)}"],
        env=dict(child_env(), PYTHON=sys.executable), capture_output=True, text=True,
        timeout=230,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    expected = translator.translate_seeded(tf.constant(sentences), tf.constant(seeds, tf.int64))
    assert parse_cli_strings(completed.stdout, "translation") == [
        t.decode("utf-8") for t in expected["translation"].numpy().tolist()]
    # Reloaded: a sentence alone gives what it gives inside the batch.
    import tensorflow_text  # noqa: F401

    seeded = tf.saved_model.load(str(saved_model_dir)).signatures["translate_seeded"]
    batch = seeded(text=tf.constant(sentences), seed=tf.constant(seeds, tf.int64))
    alone = seeded(text=tf.constant(sentences[2:]), seed=tf.constant(seeds[2:], tf.int64))
    assert alone["translation"].numpy()[0] == batch["translation"].numpy()[2]
    # Seeds of another rank are refused as `text` is (a (B, 1) column had been flattened).
    with pytest.raises(tf.errors.InvalidArgumentError, match="Shape of tensor seed"):
        seeded(text=tf.constant(sentences), seed=tf.constant([[s] for s in seeds], tf.int64))


def warmup_signature_names(saved_model_dir):
    from tensorflow_serving.apis import prediction_log_pb2

    path = pathlib.Path(saved_model_dir) / "assets.extra" / "tf_serving_warmup_requests"
    return sorted(prediction_log_pb2.PredictionLog.FromString(record.numpy())
                  .predict_log.request.model_spec.signature_name
                  for record in tf.data.TFRecordDataset(str(path)))


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("search", ["sample", "greedy_uncached"])
def test_a_jit_export_warms_up_the_signatures_xla_does_not_compile(copy_task, tmp_path,
                                                                    search):
    """A `--jit` export carried no warm-up file, since its compiled signatures fail on a
    server without the XLA flag; but with `--search sample` or `greedy_uncached` only
    `translate_greedy` compiles, and `translate` paid its first request's optimization."""
    saved_model_dir = export_translator(
        copy_task.translator(search=search, jit_compile=True), tmp_path / search)
    expected = {"sample": ["serving_default", "translate", "translate_seeded"],
                "greedy_uncached": ["serving_default", "translate"]}[search]
    assert warmup_signature_names(saved_model_dir) == sorted(expected * 2)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sampling_export_warms_up_translate_seeded_too(sampling_export):
    """The warm-up file covered the signatures taking `text` alone: a sampling export's
    `translate_seeded(text, seed)` paid ~1 s of graph optimization on its first request.
    Its requests carry one int64 seed per sentence and run as the server replays them."""
    import tensorflow_text  # noqa: F401
    from tensorflow_serving.apis import prediction_log_pb2

    _, saved_model_dir = sampling_export
    path = saved_model_dir / "assets.extra" / "tf_serving_warmup_requests"
    requests = [prediction_log_pb2.PredictionLog.FromString(record.numpy()).predict_log.request
                for record in tf.data.TFRecordDataset(str(path))]
    seeded = [r for r in requests if r.model_spec.signature_name == "translate_seeded"]
    assert len(seeded) == 2 and all(set(r.inputs) == {"text", "seed"} for r in seeded)
    assert {r.model_spec.signature_name for r in requests} == set(
        signature_defs(saved_model_dir)) - {"metadata", "__saved_model_init_op"}
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"],
                                                          str(saved_model_dir))
        for request in seeded:
            signature = meta_graph.signature_def["translate_seeded"]
            text, seed = (tf.make_ndarray(request.inputs[name]) for name in ("text", "seed"))
            assert seed.dtype == np.int64 and seed.shape == text.shape == (1,)
            translations = session.run(signature.outputs["translation"].name,
                                       {signature.inputs["text"].name: text,
                                        signature.inputs["seed"].name: seed})
            assert len(translations) == 1

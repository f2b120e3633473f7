"""The benchmark scripts run end to end on tiny shapes (their figures are not checked here:
timings belong in benchmarks/RESULTS.md, never in tests)."""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Each value of each option at least once: our loss and optimizer, XLA for both models,
# and the skip-padding model, which is compiled without XLA when XLA is asked for.
@pytest.mark.parametrize("loss,optimizer,jit,skip", [
    ("own", "own", "false", True), ("same", "same", "true", False),
    ("same", "same", "true", True)])
def test_train_vs_keras_hub_prints_a_ratio(loss, optimizer, jit, skip, capsys):
    pytest.importorskip("keras_hub")
    script = _load("train_vs_keras_hub")
    script.main(["--steps", "2", "--warmup", "1", "--d-model", "16", "--heads", "2",
                 "--ff-dim", "32", "--layers", "1", "--vocab-size", "50", "--batch-size", "4",
                 "--length", "8", "--loss", loss, "--optimizer", optimizer, "--jit-compile", jit]
                + (["--skip-padding"] if skip else []))
    out = capsys.readouterr().out
    xla = jit.capitalize()  # as the compiled models report it
    ours = "False" if skip else xla  # a model skipping padding is compiled without XLA
    assert (f"loss: {loss}, optimizer: {optimizer}, XLA: keras_transformer {ours}, "
            f"keras_hub {xla}, ours skips padding: {'yes' if skip else 'no'}") in out, out
    assert re.search(r"batches 4x8 \(\d+% padding\)", out), out
    assert re.search(r"ratio keras_transformer / keras_hub: \d+\.\d\dx", out), out
    ours = "FusedAdam" if optimizer == "own" else "Adam"
    assert re.search(rf"\| keras_transformer \| {ours} \| [\d,]+ \| [\d,]+ \|", out), out
    assert re.search(r"\| keras_hub \| Adam \| [\d,]+ \| [\d,]+ \|", out), out


@pytest.mark.slow
def test_train_throughput_measures_a_preset_with_a_cooldown():
    # The `multi30k` preset has `lr_cooldown`, whose schedule needs the run's length.
    script = _load("train_throughput")
    result = script.measure("tiny", None, steps=2, warmup=1, overrides=("lr_cooldown=0.3",))
    # The overrides come back as the config read them (JSON values: a number here).
    assert result["tokens_per_second"] > 0 and result["overrides"] == {"lr_cooldown": 0.3}


def test_train_throughput_refuses_settings_it_would_not_measure():
    # Each precision is measured in a child process, whose error was lost behind a bare
    # CalledProcessError: an unknown field, data settings (it measures Multi30K's batches:
    # KeyError 'fr') and a precision (its own --precisions: "multiple values").
    script = _load("train_throughput")
    for item, message in (("bogus=1", "Unknown TrainingConfig field"),
                          ("data=files", "Multi30K"), ("source_lang=fr", "Multi30K"),
                          ("precision=mixed_bfloat16", "--precisions"),
                          ("subword_nbest=4", "subword samples")):
        with pytest.raises(SystemExit, match=message):
            script.main(["--preset", "tiny", "--set", item])
    with pytest.raises(SystemExit, match="^Unknown preset"):
        script.main(["--preset", "bogus"])


def test_profile_train_step_sums_op_events_of_the_compute_threads():
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    script = _load("profile_train_step")
    xspace = xplane_pb2.XSpace()
    plane = xspace.planes.add(name="/host:CPU")
    for key, name in enumerate(["ExecutorState::Process", "dense/MatMul:_MklMatMul",
                                "Mul", "MemoryAllocation"], start=1):
        plane.event_metadata[key].name = name
    compute = plane.lines.add(name="tf_Compute/123")
    # A work item (1 us) wrapping two ops, then a memory event: only the ops count.
    for key, picoseconds in [(1, 10**6), (2, 6 * 10**5), (3, 2 * 10**5), (2, 10**5), (4, 5)]:
        compute.events.add(metadata_id=key, duration_ps=picoseconds)
    python = plane.lines.add(name="python")  # not a compute thread
    python.events.add(metadata_id=3, duration_ps=10**9)
    times = script.op_times(xspace)
    assert times.keys() == {"_MklMatMul", "Mul"}
    assert times["_MklMatMul"] == pytest.approx((0.7, 2))
    assert times["Mul"] == pytest.approx((0.2, 1))


@pytest.mark.slow
def test_profile_train_step_prints_the_op_table(capsys):
    script = _load("profile_train_step")
    script.main(["--preset", "tiny", "--precision", "float32", "--steps", "2", "--warmup", "1",
                 "--top", "3"])
    out = capsys.readouterr().out
    assert re.search(r"wall [\d.]+ ms per step, op time [\d.]+ ms per step, \d+ ops per step",
                     out), out
    rows = re.findall(r"^\| (\S+) \| [\d.]+ \| [\d.]+% \| \d+ \|$", out, re.MULTILINE)
    # The step's matrix products lead the table; which kind (MatMul or the attention's
    # Einsum) is first at these tiny shapes varies from run to run.
    assert len(rows) == 3 and any("MatMul" in row or "Einsum" in row for row in rows), out
    assert re.search(r"^\| \d+ other types \|", out, re.MULTILINE), out


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny trained run (2 epochs, 2 kept checkpoints, averaged) on toy fr-en pairs, with
    a test set of its own called `news`."""
    from keras_transformer.training import get_preset
    from keras_transformer.training.averaging import average_run
    from keras_transformer.training.trainer import train
    from tests.data.conftest import toy_pairs, write_lines

    tmp_path = tmp_path_factory.mktemp("tiny_run")
    files = {}
    for name, size, seed in (("train", 64, 0), ("val", 6, 1), ("news", 5, 2)):
        pairs = toy_pairs(size, seed)
        files[name] = [str(write_lines(tmp_path / f"{name}.fr", [p[0] for p in pairs])),
                       str(write_lines(tmp_path / f"{name}.en", [p[1] for p in pairs]))]
    config = get_preset("tiny").replace(
        data="files", data_files={"train": files["train"], "validation": files["val"],
                                  "news": files["news"]},
        source_lang="fr", target_lang="en", vocab_size=290, epochs=2, keep_checkpoints=2,
        bleu_sentences=0)
    train(config, tmp_path / "run", verbose=0, report_padding=False)
    average_run(tmp_path / "run", last=2)
    return tmp_path / "run"


@pytest.mark.slow
def test_choose_on_validation_compares_checkpoints_alphas_and_stopping(tiny_run, capsys):
    script = _load("choose_on_validation")
    script.main([str(tiny_run), "--checkpoints", "final,averaged", "--alphas", "0.6,1.0",
                 "--beam-size", "2", "--batch-size", "4", "--beam-stopping", "exact,early",
                 "--length-penalty-forms", "gnmt,power", "--limit", "3"])
    out = capsys.readouterr().out
    rows = re.findall(r"^\| (final|averaged) \| 2 \| (gnmt|power) \| (0\.6|1\.0) \| "
                      r"(exact|early) \| (\d+\.\d\d) \| \d+ \|$", out, re.M)
    assert len(rows) == 16, out
    assert {row[1] for row in rows} == {"gnmt", "power"}
    assert {row[3] for row in rows} == {"exact", "early"}
    best = max(rows, key=lambda row: float(row[4]))
    # The flags export what was scored: beam 2, not the export's default of 4.
    flags = f"--alpha {best[2]} --beam-stopping {best[3]} --beam-size 2"
    if best[1] == "power":
        flags += " --length-penalty-form power"
    assert f"chosen on validation: --checkpoint {best[0]} {flags} (" in out
    with pytest.raises(SystemExit, match="exact and/or early"):
        script.main([str(tiny_run), "--checkpoints", "final", "--beam-stopping", "soon"])
    with pytest.raises(SystemExit, match="gnmt and/or power"):
        script.main([str(tiny_run), "--checkpoints", "final", "--length-penalty-forms", "wu"])


@pytest.mark.slow
def test_choose_on_validation_averages_the_last_k_epochs_on_the_side(tiny_run, capsys):
    # "averaged-K": the final model with the mean of the last K epoch checkpoints; the run's
    # own averaged.keras (the fixture's last-2 average) is left as it was.
    import numpy as np

    from keras_transformer.export.run import load_run

    averaged_file = tiny_run / "checkpoints" / "averaged.keras"
    before = averaged_file.read_bytes()
    script = _load("choose_on_validation")

    def weights(checkpoint):
        return script._load(str(tiny_run), checkpoint)[0].get_weights()

    def same(a, b):
        return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))

    final, averaged = load_run(tiny_run, "final")[0].get_weights(), weights("averaged")
    last_1, last_2 = weights("averaged-1"), weights("averaged-2")
    assert same(last_1, final)  # the last epoch alone is the final model
    assert same(last_2, averaged)  # what the fixture averaged
    assert not same(last_1, last_2)
    with pytest.raises(SystemExit, match="kept 2 epoch checkpoint"):
        script._load(str(tiny_run), "averaged-3")
    capsys.readouterr()
    script.main([str(tiny_run), "--checkpoints", "averaged-2", "--alphas", "0.6",
                 "--beam-size", "2", "--batch-size", "4"])
    out = capsys.readouterr().out
    assert re.search(r"^\| averaged-2 \| 2 \| gnmt \| 0\.6 \| early \| \d+\.\d\d \| \d+ \|$", out,
                     re.M), out
    assert re.search(r"chosen on validation: --checkpoint averaged --alpha 0\.6 "
                     r"--beam-stopping early --beam-size 2 \(\d+\.\d\d\), "
                     rf"after `keras-transformer average --model {re.escape(str(tiny_run))} "
                     r"--last 2`", out), out
    assert averaged_file.read_bytes() == before


@pytest.mark.slow
def test_choose_on_validation_checks_every_checkpoint_before_translating(
        tiny_run, tmp_path, capsys):
    # Its default (best,averaged) ended in a raw FileNotFoundError after the `best` rows
    # were computed, on any run not averaged yet; too few epochs kept, a stale average, a
    # missing run: the same, the rows computed until then lost.
    script = _load("choose_on_validation")
    for checkpoints, message in (("final,averaged-3", "kept 2 epoch checkpoint"),
                                 ("final,best2", "checkpoint must be one of")):
        with pytest.raises(SystemExit, match=message):
            script.main([str(tiny_run), "--checkpoints", checkpoints, "--alphas", "0.6",
                         "--beam-size", "2", "--limit", "2"])
        assert "validation BLEU" not in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no_run: no such run directory"):
        script.main([str(tmp_path / "no_run"), "--checkpoints", "final"])
    # averaged-K needs the epoch checkpoints, not the final model (`average` falls back to
    # checkpoints/last.keras, as here: a run killed before its end).
    import shutil

    copy = tmp_path / "unfinished"
    shutil.copytree(tiny_run, copy)
    (copy / "model.keras").unlink()
    (copy / "model.keras.json").unlink(missing_ok=True)
    assert len(script._load(str(copy), "averaged-2")[0].get_weights()) > 0
    stale = tmp_path / "stale"
    shutil.copytree(tiny_run, stale)
    (stale / "checkpoints" / "epoch-003.weights.npz").write_bytes(
        (stale / "checkpoints" / "epoch-002.weights.npz").read_bytes())
    with pytest.raises(SystemExit, match="averaged"):
        script.main([str(stale), "--checkpoints", "averaged", "--limit", "2"])


@pytest.mark.slow
def test_choose_on_validation_greedy_scores_each_checkpoint_once_in_its_language(
        tiny_run, monkeypatch, capsys):
    # --beam-size 1 decoded the same greedy output once per alpha and stopping rule, then
    # recommended beam flags; BLEU was sacreBLEU's 13a whatever the language (a Chinese
    # target scored 0 for every setting, so the "choice" was the first row).
    script = _load("choose_on_validation")
    script.main([str(tiny_run), "--checkpoints", "final,last", "--beam-size", "1",
                 "--alphas", "0.6,1.0", "--beam-stopping", "exact,early", "--limit", "2"])
    out = capsys.readouterr().out
    rows = re.findall(r"^\| (final|last) \| greedy \| (\d+\.\d\d) \| \d+ \|$", out, re.M)
    assert [row[0] for row in rows] == ["final", "last"], out
    assert re.search(r"chosen on validation: --checkpoint (final|last) --search greedy "
                     r"\(\d+\.\d\d\)", out), out

    import keras_transformer.export as export

    reference = "我们今天去公园散步吧"
    monkeypatch.setattr(script, "_validation_pairs",
                        lambda config, limit, data_dir=None, tfds_dir=None: (
                            ["a b", "c d"], [reference] * 2, "files fr->zh [validation]", "zh"))
    monkeypatch.setattr(export, "translate_by_length",
                        lambda sources, batch_size, translator: ["我们今天去公园散步了"] * 2)
    script.main([str(tiny_run), "--checkpoints", "final", "--beam-size", "1"])
    bleu = float(re.search(r"^\| final \| greedy \| (\d+\.\d\d) \|", capsys.readouterr().out,
                           re.M).group(1))
    assert bleu > 50.0  # the zh tokenizer; 13a scores 0.00


@pytest.mark.slow
def test_decode_speed_times_the_runs_own_test_set(tiny_run, capsys):
    # It translated Multi30K's English test_2016 and scored against German whatever the run.
    _load("decode_speed").main(["--run", str(tiny_run), "--checkpoint", "final", "--limit", "2",
                                "--latency-sentences", "1", "--max-output-length", "8"])
    out = capsys.readouterr().out
    assert "2 sentences of files fr->en [news]" in out, out
    assert len(re.findall(r"^\| (uncached|cached) [^|]+ \| \d+\.\d \| \d+\.\dx \| \d+ \| "
                          r"\d+\.\d\d \|$", out, re.M)) == 3, out


def test_finished_row_share():
    share = _load("decode_vs_ctranslate2").finished_row_share
    assert share([2, 4, 4, 2], batch_size=2) == 0.25  # each batch wastes 2 of 8 row-steps
    assert share([2, 4, 4, 2], batch_size=2, sort=True) == 0.0
    assert share([3, 3, 3], batch_size=32) == 0.0
    assert share([], batch_size=4) == 0.0


@pytest.mark.slow
def test_decode_threads_times_each_setting_in_its_own_process(tiny_run, capsys):
    script = _load("decode_threads")
    assert script.main([str(tiny_run), "--settings", "1x1,2x1", "--limit", "6",
                        "--batch-size", "3", "--latency-sentences", "2", "--beam-size", "2",
                        "--callers", "2", "--onednn", "off,on"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^\| (\d) \| (\d) \| (on|off) \| (\d+\.\d) \| (\d+) \| (\d+\.\d) \| "
                      r"(\d+) \| \d+\.\d \| \d+\.\d \|$", out, re.M)
    # Each setting in each mode, the mode as the measuring process's TensorFlow reports it.
    assert [row[:3] for row in rows] == [("1", "1", "off"), ("1", "1", "on"),
                                         ("2", "1", "off"), ("2", "1", "on")], out
    assert all(float(row[3]) > 0 and float(row[5]) > 0 for row in rows), out


def test_decode_threads_rejects_bad_settings():
    script = _load("decode_threads")
    assert script.parse_settings("2x1,1X2") == [(2, 1), (1, 2)]
    for bad in ("2", "0x1", "2x", "axb", "2x1x1"):
        with pytest.raises(SystemExit, match="INTRAxINTER"):
            script.parse_settings(bad)
    assert script.parse_onednn("on, OFF,default") == ["on", "off", "default"]
    with pytest.raises(SystemExit, match="on, off or default"):
        script.parse_onednn("yes")


@pytest.mark.slow
def test_decode_vs_ctranslate2_side_by_side_with_concurrent_callers(tiny_run):
    pytest.importorskip("ctranslate2")
    # A process of its own: the script sets TensorFlow's thread pools before they start.
    completed = subprocess.run(
        [sys.executable, str(BENCHMARKS / "decode_vs_ctranslate2.py"), str(tiny_run),
         "--checkpoint", "final", "--limit", "3", "--batch-size", "3",
         "--latency-sentences", "1", "--beam-size", "2", "--threads", "1",
         "--inter-threads", "2", "--callers", "2", "--compare-keep-finished",
         "--compare-jit", "--compare-growing-cache", "--in-place-greedy", "--compare-bf16",
         "--compare-exact-stopping", "--length-penalty-form", "power",
         # The tiny model's translations never end: both engines stop them at 8 tokens
         # (ours otherwise at the source's length + 50, CTranslate2 at this bound).
         "--max-output-length", "8"],
        capture_output=True, text=True, timeout=600,
        # Without a choice of allocator (this process's import of keras_transformer set one):
        # the script times TensorFlow's default allocator, the one TF Serving runs.
        env={**{k: v for k, v in os.environ.items() if k != "TF_CPU_ALLOCATOR_USE_BFC"},
             "PYTHONPATH": str(BENCHMARKS.parent)})
    out = completed.stdout
    assert completed.returncode == 0, completed.stderr[-3000:]
    # The run's own test set (its first), in its direction: it translated Multi30K's
    # English test_2016 and scored against German whatever the run was trained on.
    first = (tiny_run.parent / "news.fr").read_text().splitlines()[0]
    assert f"first sentence: {first!r}" in out, out
    assert "3 sentences of files fr->en [news]" in out, out
    assert "1 intra-op thread(s), 2 inter-op, 2 caller(s)" in out, out
    assert "our length penalty: power, alpha 0.6" in out, out
    # TensorFlow's own allocator, or oneDNN's where oneDNN is on by default (AVX-512 VNNI or
    # BF16 CPUs), whatever the variable says; never keras_transformer's choice of BFC.
    allocator = re.search(r"TensorFlow CPU allocator: (\w+) \(TF_CPU_ALLOCATOR_USE_BFC=false, "
                          r"oneDNN (on|off)\)", out)
    assert allocator, out
    if allocator.group(2) == "off":
        assert allocator.group(1) == "system", out
    assert re.search(r"ours \(greedy\): ", out), out
    engines = re.findall(r"^\| (beam 2|greedy) \| ([^|]+) \| \d+\.\d \| \d+\.\d \| \d+ \| "
                         r"\d+\.\d\d \| ([^|]*) \|$", out, re.M)
    assert len(engines) == 16, out  # 8 engines, bfloat16 + XLA among them
    same = {(search, engine.strip()): column.strip() for search, engine, column in engines}
    # Each engine's translations counted against the default export's (the bfloat16
    # export's for bfloat16 + XLA). Not required equal here: the tiny model's output is
    # noise whose near-ties other kernels may break differently; the translator tests check
    # that these exports translate alike on a trained model.
    for search in ("beam 2", "greedy"):
        assert same[(search, "SavedModel")] == "", out
        for engine in ("finished kept", "XLA (--jit)", "growing cache", "bfloat16",
                       "exact stopping"):
            column = same[(search, f"SavedModel, {engine}")]
            assert re.fullmatch(r"SavedModel: [0-3]/3", column), out
        assert re.fullmatch(r"SavedModel, bfloat16: [0-3]/3",
                            same[(search, "SavedModel, bfloat16 + XLA")]), out
        assert re.fullmatch(r"SavedModel: [0-3]/3", same[(search, "CTranslate2")]), out
    # The stopping rule is beam search's alone: greedy runs the same graph, kernel for kernel.
    assert same[("greedy", "SavedModel, exact stopping")] == "SavedModel: 3/3", out
    assert re.search(r"^\| beam 2, exact stopping \| \d+\.\d\dx \| \d+\.\d\dx \| "
                     r"\d+\.\d\dx \|$", out, re.M), out
    assert re.search(r"^\| greedy, growing cache \| \d+\.\d\dx \| \d+\.\d\dx \| \d+\.\d\dx \|$",
                     out, re.M), out
    assert re.search(r"^\| greedy, XLA \| \d+\.\d\dx \| \d+\.\d\dx \| \d+\.\d\dx \|$", out,
                     re.M), out
    # bfloat16 computes another function, timed like the others.
    assert re.search(r"^\| beam 2, bfloat16 \| \d+\.\d\dx \| \d+\.\d\dx \| \d+\.\d\dx \|$",
                     out, re.M), out
    assert re.search(r"^\| greedy, bfloat16 \+ XLA \| \d+\.\d\dx \| \d+\.\d\dx \| "
                     r"\d+\.\d\dx \|$", out, re.M), out
    assert re.search(r"^\| beam 2 \| \d+\.\d\dx \| \d+\.\d\dx \| \d+\.\d\dx \|$", out, re.M), out


def test_decode_vs_ctranslate2_conversion_check_compares_translations_not_only_bleu():
    # The check passed two engines whose BLEU was equally near zero (a run's own model
    # scored on another language pair, or a conversion gone wrong): CTranslate2's greedy
    # translations must be ours.
    check = _load("decode_vs_ctranslate2").conversion_check
    same = ["a b", "c d", "e f", "g h"]
    assert check(same, same, 0.05, 0.06, bleu_tolerance=0.1, min_same=0.9) is None
    failed = check(same, ["x", "y", "e f", "z"], 0.05, 0.06, bleu_tolerance=0.1, min_same=0.9)
    assert failed and "1 of 4" in failed and "90%" in failed
    assert "BLEU" in check(same, same[:3] + ["g"], 30.0, 29.0, bleu_tolerance=0.1, min_same=0.5)


def test_decode_vs_ctranslate2_counts_the_translations_an_engine_shares():
    script = _load("decode_vs_ctranslate2")
    assert script._same_as(["a", "b", "c"], ["a", "x", "c"], "SavedModel") == "SavedModel: 2/3"
    with pytest.raises(ValueError):  # lists that do not pair up
        script._same_as(["a"], ["a", "b"], "SavedModel")


def test_compare_exports_alternates_and_keeps_each_ones_translations():
    script = _load("compare_exports")
    calls = []

    def engine(name, suffix):
        def translate(batch):
            calls.append(name)
            return [sentence + suffix for sentence in batch]
        return translate

    batches = [["a", "b"], ["c"]]
    times, outputs = script.compare([engine("A", ""), engine("B", "!")], batches, repeats=2)
    # One warm-up call each, then whole passes over the batches in turn: A B A B.
    assert calls == ["A", "B"] + ["A", "A", "B", "B"] * 2
    assert [len(seconds) for seconds in times] == [2, 2]
    assert outputs == [["a", "b", "c"], ["a!", "b!", "c!"]]
    assert script.spread([1.0, 2.0, 3.0]) == 1.0


@pytest.mark.slow
def test_compare_exports_times_two_exports_of_one_model(tiny_run, tmp_path):
    from keras_transformer.export import DecodingConfig, Translator, export_translator
    from keras_transformer.export.run import load_run
    from tests.data.conftest import toy_pairs, write_lines

    model, source_tokenizer, target_tokenizer, _ = load_run(tiny_run, "final")
    exports = []
    for name, drop in (("dropped", True), ("kept", False)):
        config = DecodingConfig(beam_size=2, max_output_length=12, drop_finished=drop)
        exports.append(str(export_translator(
            Translator(model, source_tokenizer, target_tokenizer, config), tmp_path / name)))
    sources = write_lines(tmp_path / "sources.fr", [pair[0] for pair in toy_pairs(7, 3)])
    completed = subprocess.run(
        [sys.executable, str(BENCHMARKS / "compare_exports.py"), *exports, "--sources",
         str(sources), "--batch-size", "3", "--repeats", "2"],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(BENCHMARKS.parent)})
    assert completed.returncode == 0, completed.stderr[-3000:]
    out = completed.stdout
    assert "7 sentences in batches of 3 (input order), 1 intra-op thread(s)" in out, out
    rows = re.findall(r"^\| (translate|translate_greedy) \| \d+\.\d \| \d+\.\d \| \d\.\d{3} \| "
                      r"\d+% \| \d+% \| (\d+) \|$", out, re.M)
    # Dropping finished sentences changes no translation.
    assert rows == [("translate", "0"), ("translate_greedy", "0")], out


@pytest.mark.slow
def test_encoder_share_times_both_encoders_and_both_searches(tiny_run, tmp_path):
    from tests.data.conftest import toy_pairs, write_lines

    sources = write_lines(tmp_path / "sources.fr", [pair[0] for pair in toy_pairs(7, 3)])
    # A process of its own: it sets TensorFlow's thread pools before they start.
    completed = subprocess.run(
        [sys.executable, str(BENCHMARKS / "encoder_share.py"), str(tiny_run), "--checkpoint",
         "final", "--sources", str(sources), "--batch-size", "3", "--repeats", "1"],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(BENCHMARKS.parent)})
    assert completed.returncode == 0, completed.stderr[-3000:]
    out = completed.stdout
    assert "7 sentences in batches of 3, 1 thread, best of 1 alternating passes" in out, out
    for order in ("input order", "sorted by length"):
        assert re.search(rf"^{order}: \d+\.\d% of the source positions are padding$", out,
                         re.M), out
    rows = re.findall(r"^\| (.+?) \| \d+\.\d\d \| \d+\.\d% \| \d+\.\d% \|$", out, re.M)
    parts = ["tokenize", "tokenize + encoder + memory keys/values, every position",
             "tokenize + encoder + memory keys/values, real tokens only",
             "greedy call (as exported)", "beam-4 call (as exported)"]
    assert rows == parts * 2, out


@pytest.mark.slow
def test_bucket_padding_prints_an_epochs_padding_per_spacing(capsys):
    from keras_transformer.data import find_local_multi30k

    if find_local_multi30k() is None:
        pytest.skip("no local copy of Multi30K")
    script = _load("bucket_padding")
    script.main(["--preset", "quick", "--growths", "1.25,1.05", "--limit", "2000",
                 "--set", "vocab_size=1000"])
    out = capsys.readouterr().out
    rows = re.findall(r"^\| (1\.25|1\.05) \| (\d+) \| (\d+) \| (\d+\.\d)% \| (\d\.\d{3}) \|$",
                      out, re.M)
    assert [row[0] for row in rows] == ["1.25", "1.05"], out
    (_, coarse_buckets, _, coarse, reference), (_, fine_buckets, _, fine, relative) = rows
    assert int(fine_buckets) > int(coarse_buckets) and reference == "1.000"
    # Finer buckets: less padding, so fewer padded positions per real token.
    assert float(fine) < float(coarse) and float(relative) < 1.0, out
    assert "growth 1.05: --set bucket_boundaries=[8,9,10," in out, out
    with pytest.raises(SystemExit):
        script.main(["--growths", "1.0"])
    with pytest.raises(SystemExit):
        script.main(["--set", "vocab_size"])


def test_decoding_scripts_read_multi30k_where_the_package_finds_it(tmp_path, monkeypatch):
    # No machine-specific path: KERAS_TRANSFORMER_MULTI30K_DIR (or shared/data/multi30k
    # beside the repository) as for training, through `multi30k_lines`.
    from keras_transformer.data import multi30k_lines
    from keras_transformer.data.multi30k import ENV_VAR, _file_names
    from tests.data.conftest import write_lines

    for name in _file_names():
        write_lines(tmp_path / name, [f" {name} line {i} " for i in range(3)])
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    assert _load("encoder_share")._read(None, 2) == [
        "test_2016_flickr.en.gz line 0", "test_2016_flickr.en.gz line 1"]
    # compare_exports sets the allocator variable at import (setdefault): set here first,
    # so that monkeypatch restores it after the test.
    monkeypatch.setenv("TF_CPU_ALLOCATOR_USE_BFC", "false")
    assert _load("compare_exports").read_sources(None, limit=1) == [
        "test_2016_flickr.en.gz line 0"]
    assert multi30k_lines("train", "de") == [f"train.de.gz line {i}" for i in range(3)]
    assert multi30k_lines("val", "en", limit=1, local_dir=tmp_path) == ["val.en.gz line 0"]
    with pytest.raises(Exception, match="missing file"):
        multi30k_lines("train", "en", local_dir=tmp_path / "missing")
    # One side is all it reads: the other language's file need not be there.
    one_side = tmp_path / "one_side"
    one_side.mkdir()
    write_lines(one_side / "test_2016_flickr.de.gz", ["Ein Satz."])
    assert multi30k_lines("test", "de", local_dir=one_side) == ["Ein Satz."]
    with pytest.raises(Exception, match=r"missing file\(s\) test_2016_flickr\.en\.gz \("):
        multi30k_lines("test", "en", local_dir=one_side)


def test_skip_padding_times_both_models_on_the_same_batches(capsys):
    from keras_transformer.data import find_local_multi30k

    if find_local_multi30k() is None:
        pytest.skip("no local copy of Multi30K")
    script = _load("skip_padding")
    script.main(["--preset", "tiny", "--steps", "2", "--warmup", "1", "--batch-size", "4",
                 "--length", "8", "--precision", "float32"])
    out = capsys.readouterr().out
    assert re.search(r"tiny, float32, padded batches \(4x8, \d+% padding\), 2 timed", out), out
    assert re.search(r"^\| False \| [\d,]+ \|$", out, re.M), out
    assert re.search(r"^\| True \| [\d,]+ \|$", out, re.M), out
    assert re.search(r"ratio skip_padding / every position: \d+\.\d\dx", out), out
    with pytest.raises(SystemExit):
        script.main(["--set", "d_model"])


def test_int8_matmul_prints_a_row_per_shape(capsys):
    script = _load("int8_matmul")
    script.main(["--chain", "2", "--repeats", "1", "--shapes", "4x16x8,2x8x4"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert len(rows) == 3, rows  # the header and one row per shape
    assert re.match(r"\| 4 x 16 x 8 \| [\d.]+ \(\d+\) \| [\d.]+ \([\d.]+x\) \| 0\.\d+ \|$",
                    rows[1]), rows


def test_projection_forms_compute_one_product_and_time_each_form(capsys):
    # Session 53's benchmark had no test: a form computing another product (a transpose
    # missed) would have been timed against the others as if it were the same work.
    import numpy as np
    import tensorflow as tf

    script = _load("projection_forms")
    rng = np.random.default_rng(1)
    x = tf.constant(rng.standard_normal((3, script.WIDTH)).astype("float32"))
    kernel = tf.constant(rng.standard_normal((script.WIDTH, script.OUTPUTS)).astype("float32"))
    bias = tf.constant(rng.standard_normal((script.OUTPUTS,)).astype("float32"))
    expected = x.numpy() @ kernel.numpy() + bias.numpy()
    for form in script.FORMS:
        got = script.project(form, x, kernel, tf.transpose(kernel), bias).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3, err_msg=form)
    script.main(["--rows", "1,3", "--layers", "2", "--steps", "2", "--repeats", "1",
                 "--forms", "fused,sparse"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert rows[0] == "| rows | fused | sparse |", rows
    assert [row.split(" | ")[0] for row in rows[1:]] == ["| 1", "| 3"], rows
    assert all(re.match(r"\| \d+ \| [\d.]+ us \| [\d.]+ us \|$", row) for row in rows[1:]), rows
    with pytest.raises(SystemExit, match="unknown form"):
        script.main(["--forms", "fused,dense"])
    right = script.project

    def wrong(form, x, kernel, kernel_t, bias):  # one form broadcasting row 0
        y = right(form, x, kernel, kernel_t, bias)
        return tf.repeat(y[:1], tf.shape(y)[0], axis=0) if form == "sparse" else y

    script.project = wrong
    with pytest.raises(SystemExit, match="sparse computes another product"):
        script.main(["--rows", "3", "--layers", "1", "--steps", "1", "--repeats", "1",
                     "--forms", "fused,sparse"])


@pytest.mark.slow
def test_profile_decoder_profiles_times_and_compares_two_executors(tiny_run, tmp_path):
    # profile_decoder.py had no test. Two processes (it sets TensorFlow's thread pools): a
    # profiled export, then one traced for the single-threaded executor timed beside it.
    from keras_transformer.data import find_local_multi30k

    if find_local_multi30k() is None:
        pytest.skip("no local copy of Multi30K (the script times test_2016's sentences)")
    common = [sys.executable, str(BENCHMARKS / "profile_decoder.py"), "--run", str(tiny_run),
              "--checkpoint", "final", "--work-dir", str(tmp_path), "--max-output-length", "4",
              "--batch-size", "2", "--repeats", "1", "--trace-repeats", "1", "--beam-size", "2"]
    env = {**os.environ, "PYTHONPATH": str(BENCHMARKS.parent)}
    first = subprocess.run(common + ["--name", "base"], capture_output=True, text=True,
                           timeout=600, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    out = first.stdout
    # (a) the step's ops, for beam and greedy; (b) step stats per signature and batch.
    assert len(re.findall(r"^## \(a\) ops per decoding step, (beam 2|greedy): \d+ nodes", out,
                          re.M)) == 2, out
    assert len(re.findall(r"^## \(b\) step stats, translate(_greedy)?, batch [12]: \d+ steps",
                          out, re.M)) == 4, out
    assert re.search(r"^  MatMul|^  _MklNativeFusedMatMul|^  _MklMatMul", out, re.M), out
    assert len(re.findall(r"^  translate(_greedy)? +[12] +[\d.]+ ±", out, re.M)) == 4, out
    second = subprocess.run(common + ["--name", "single", "--skip-profile", "--executor-type",
                                      "SINGLE_THREADED_EXECUTOR", "--compare",
                                      str(tmp_path / "base")],
                            capture_output=True, text=True, timeout=600, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    rows = re.findall(r"^  translate(?:_greedy)? +[12] +[\d.]+ ±\s*\d+%\s+[\d.]+ ±\s*\d+%\s+"
                      r"[\d.]+$", second.stdout, re.M)
    assert len(rows) == 4, second.stdout  # both exports and their ratio, per signature/batch
    # The traced export names the executor in its function calls; the default one does not.
    graphs = {name: (tmp_path / name / "beam" / "1" / "saved_model.pb").read_bytes()
              for name in ("base", "single")}
    assert b"SINGLE_THREADED_EXECUTOR" in graphs["single"]
    assert b"SINGLE_THREADED_EXECUTOR" not in graphs["base"]

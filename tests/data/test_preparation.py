"""The data report and the epoch size: counted once in a streaming pass, exact, cached."""

import json

import pytest
import tensorflow as tf

from keras_transformer.data import (
    batch_plan,
    count_batches,
    make_translation_dataset,
    open_source,
)
from keras_transformer.data.preparation import (
    REPORT_FILENAME,
    DataReport,
    prepare_data_report,
    scan_split,
)
from keras_transformer.data.readers import DataError
from keras_transformer.text import train_tokenizers
from keras_transformer.training import get_preset

from tests.data.conftest import write_lines


@pytest.fixture(scope="module")
def toy_tokenizer(toy_corpus, tmp_path_factory):
    tokenizer, _ = train_tokenizers(
        toy_corpus["splits"]["train"], "fr", "en", vocab_size=300,
        output_dir=tmp_path_factory.mktemp("tok"), hard_vocab_limit=False)
    return tokenizer


def test_count_batches_example():
    assert count_batches([3, 4, 9, 9, 9], [8], [2, 2]) == 3
    assert count_batches([3, 4, 9, 9, 9], [8], [2, 2], drop_remainder=True) == 2
    assert count_batches([1] * 10, [], [4]) == 3
    # From a histogram: the number of examples of each length, not one entry per example.
    assert count_batches([3, 4, 9], [8], [2, 2], counts=[1, 1, 3]) == 3
    assert count_batches([0, 1], [], [4], counts=[0, 10]) == 3


def test_counting_a_split_holds_no_array_of_its_size(toy_corpus, toy_tokenizer, monkeypatch):
    # The histogram of lengths was expanded to one int64 per pair (and again by the
    # bucketing), 16 bytes a pair: 1.6 GB for 100 million, where memory should stay flat.
    from keras_transformer.data import preparation

    def refused(*args, **kwargs):
        raise AssertionError("an array of one entry per pair")

    source = open_source("files", toy_corpus["files"])
    expected = scan_split(source, "train", toy_tokenizer, toy_tokenizer, 8, {"batch_size": 7})
    monkeypatch.setattr(preparation.np, "repeat", refused)
    assert scan_split(source, "train", toy_tokenizer, toy_tokenizer, 8,
                      {"batch_size": 7})[1] == expected[1]


def test_counting_a_large_split_tells_its_progress(toy_corpus, toy_tokenizer, tmp_path,
                                                  monkeypatch):
    # The counting pass printed nothing until its report: on a corpus of tens of millions
    # of pairs, many silent minutes after the vocabulary's line.
    from keras_transformer.data import preparation

    monkeypatch.setattr(preparation, "_SCAN_CHUNK", 8)
    monkeypatch.setattr(preparation, "_SCAN_PROGRESS_EVERY", 32)
    source = open_source("files", toy_corpus["files"])
    messages = []
    report, _ = scan_split(source, "train", toy_tokenizer, toy_tokenizer, 8, {"batch_size": 7},
                           log=messages.append)
    read = report.to_dict()["read"]
    assert read > 64 and len(messages) == read // 32, messages
    assert messages[0].startswith("Counting the train split: 32 pairs so far")
    assert scan_split(source, "train", toy_tokenizer, toy_tokenizer, 8,
                      {"batch_size": 7})[0] == report  # silent without a log
    messages.clear()
    config = get_preset("tiny").replace(data="files", data_files=toy_corpus["files"])
    prepare_data_report(source, config, toy_tokenizer, toy_tokenizer, tmp_path,
                        log=messages.append)
    assert any(m.startswith("Counting the train split") for m in messages)


@pytest.mark.parametrize("batching", [
    dict(batch_size=7),
    dict(tokens_per_batch=64),
    dict(tokens_per_batch=64, batch_multiple=2, drop_remainder=True),
], ids=["fixed", "token_budget", "replicas_drop_remainder"])
def test_counted_batches_equal_the_pipeline(toy_corpus, toy_tokenizer, batching):
    source = open_source("files", toy_corpus["files"])
    max_length = 8  # some toy pairs are longer: dropped, and counted
    report, counted = scan_split(source, "train", toy_tokenizer, toy_tokenizer, max_length,
                                 batching)
    assert report.dropped["too_long"] > 0 and report.kept + report.dropped["too_long"] == 96
    dataset = make_translation_dataset(
        source.dataset("train"), toy_tokenizer, toy_tokenizer, "fr", "en",
        max_length=max_length, drop_long=True, seed=3, num_batches=counted, **{
            k: v for k, v in batching.items()})
    batches = list(dataset)
    assert len(batches) == counted
    assert sum(int(b[1].shape[0]) for b in batches) <= report.kept
    if not batching.get("drop_remainder"):
        assert sum(int(b[1].shape[0]) for b in batches) == report.kept
    # A wrong count is not silently accepted.
    wrong = make_translation_dataset(
        source.dataset("train"), toy_tokenizer, toy_tokenizer, "fr", "en",
        max_length=max_length, drop_long=True, num_batches=counted + 1, **batching)
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match=rf"expected to contain {counted + 1} elements"):
        list(wrong)


def test_report_is_saved_printed_and_reused(toy_corpus, toy_tokenizer, tmp_path, monkeypatch):
    config = get_preset("tiny").replace(
        data="files", data_files=toy_corpus["files"], source_lang="fr", target_lang="en",
        max_length=8, drop_long_pairs=True, train_subset=None)
    source = open_source("files", {"train": toy_corpus["files"]["train"],
                                   "validation": toy_corpus["files"]["val"]})
    report = prepare_data_report(source, config, toy_tokenizer, toy_tokenizer, tmp_path)
    saved = json.loads((tmp_path / REPORT_FILENAME).read_text())
    assert saved["splits"]["train"]["read"] == 96
    assert saved["splits"]["validation"]["read"] == 16
    assert saved["batches"] == report.batches and report.batches["train"] > 0
    assert "train: 96 pairs read" in str(report) and "too_long" in str(report)
    # A resumed run reads the report instead of counting again ...
    monkeypatch.setattr("keras_transformer.data.preparation.scan_split",
                        lambda *a, **k: pytest.fail("counted again"))
    assert prepare_data_report(source, config, toy_tokenizer, toy_tokenizer, tmp_path) == report
    # ... unless what the counts depend on changed.
    monkeypatch.undo()
    recounted = prepare_data_report(source, config.replace(max_length=16), toy_tokenizer,
                                    toy_tokenizer, tmp_path)
    assert recounted.splits["train"]["dropped"]["too_long"] == 0


def test_all_pairs_too_long_is_an_error(toy_corpus, toy_tokenizer, tmp_path):
    long = write_lines(tmp_path / "long.fr", ["le chat noir mange ici vite"] * 3)
    long_en = write_lines(tmp_path / "long.en", ["the black cat eats here fast"] * 3)
    source = open_source("files", {"train": [long, long_en]})
    with pytest.raises(DataError, match="No usable sentence pair") as error:
        scan_split(source, "train", toy_tokenizer, toy_tokenizer, 3, dict(batch_size=2))
    # ... with what to do (the audit: a validation split whose pairs are all too long).
    longest = max(len(toy_tokenizer.tokenize(["le chat noir mange ici vite"])[0]),
                  len(toy_tokenizer.tokenize(["the black cat eats here fast"])[0])) + 1
    assert (f"every pair is longer than max_length=3 tokens (the longest: {longest})"
            in str(error.value))
    assert f"--set max_length={longest}" in str(error.value)
    assert "drop_long_pairs=false" in str(error.value)


def test_truncation_instead_of_dropping_keeps_every_pair(toy_corpus, toy_tokenizer):
    source = open_source("files", toy_corpus["files"])
    report, _ = scan_split(source, "train", toy_tokenizer, toy_tokenizer, 8,
                           dict(batch_size=8), drop_long=False)
    assert report.kept == 96 and report.dropped["too_long"] == 0
    # The pairs cut are counted (the `tiny` preset's setting): as many as dropping drops.
    dropping, _ = scan_split(source, "train", toy_tokenizer, toy_tokenizer, 8,
                             dict(batch_size=8))
    assert report.truncated == dropping.dropped["too_long"] > 0
    assert f"{report.truncated:,} cut to max_length" in str(report)
    assert "cut to max_length" not in str(dropping)


def test_batch_plan_matches_pipeline_defaults():
    boundaries, sizes = batch_plan(32, tokens_per_batch=256)
    assert boundaries == [8, 10, 12, 15, 18, 22, 27] and len(sizes) == len(boundaries) + 1
    assert batch_plan(32, batch_size=10, batch_multiple=4) == ([], [8])


def test_padding_report_measures_the_runs_own_bucket_edges(toy_corpus, toy_tokenizer):
    """The trainer's "Padding per batch" line is about the batches the run trains on."""
    from keras_transformer.data import default_bucket_boundaries, padding_fraction
    from keras_transformer.training.trainer import padding_report

    pairs = open_source("files", toy_corpus["files"]).dataset("train")
    edges = (4, 5, 6, 7, 8, 9, 10)
    config = get_preset("tiny").replace(
        source_lang="fr", target_lang="en", max_length=16, tokens_per_batch=64,
        batch_size=None, bucket_boundaries=edges)

    def bucketed(boundaries):
        return padding_fraction(make_translation_dataset(
            pairs, toy_tokenizer, toy_tokenizer, "fr", "en", max_length=16,
            tokens_per_batch=64, bucket_boundaries=boundaries, seed=config.seed,
            cache=False), num_batches=5)

    report = padding_report(config, pairs, toy_tokenizer, toy_tokenizer, num_batches=5)
    assert report.with_bucketing == pytest.approx(bucketed(list(edges)))
    # The default edges (from 8 up) give these short pairs other batches.
    assert bucketed(default_bucket_boundaries(16)) > bucketed(list(edges)) + 0.05
    assert report.without_bucketing > report.with_bucketing


def test_bad_data_found_while_counting_is_a_data_error(toy_corpus, toy_tokenizer, tmp_path):
    # Counting reads the split through tf.data, which turned the reader's DataError into a
    # TensorFlow InvalidArgumentError: a screen of traceback where the reader's one line
    # (file, line, byte) was meant. Training reads a validation split first this way.
    from keras_transformer.data import DataError

    bad_fr, bad_en = tmp_path / "valid.fr", tmp_path / "valid.en"
    bad_fr.write_bytes(b"un chien\ncaf\xe9\n")
    bad_en.write_text("a dog\ncafe\n")
    source = open_source("files", {"train": toy_corpus["files"]["train"],
                                   "validation": [str(bad_fr), str(bad_en)]})
    with pytest.raises(DataError, match=r"valid\.fr:2: invalid UTF-8"):
        scan_split(source, "validation", toy_tokenizer, toy_tokenizer, 16, dict(batch_size=2))


def test_a_corpus_edited_between_runs_is_counted_again(toy_corpus, toy_tokenizer, tmp_path):
    # The same paths with other contents: a stale report would give the pipeline a wrong
    # batch count (an epoch cut short, or validation's cardinality failing every retry).
    import shutil

    train = [str(tmp_path / "train.fr"), str(tmp_path / "train.en")]
    for copy, original in zip(train, toy_corpus["files"]["train"]):
        shutil.copy(original, copy)
    config = get_preset("tiny").replace(
        data="files", data_files={"train": train}, source_lang="fr", target_lang="en",
        max_length=16, train_subset=None)
    source = open_source("files", {"train": train})
    first = prepare_data_report(source, config, toy_tokenizer, toy_tokenizer, tmp_path)
    assert first.splits["train"]["read"] == 96
    for path in train:  # keep half the lines of both sides
        lines = open(path, encoding="utf-8").read().splitlines()
        write_lines(path, lines[:48])
    again = prepare_data_report(source, config, toy_tokenizer, toy_tokenizer, tmp_path)
    assert again.splits["train"]["read"] == 48
    assert again.batches["train"] < first.batches["train"]


def test_a_report_cut_short_by_a_kill_is_counted_again(toy_corpus, toy_tokenizer, tmp_path):
    # A process killed while writing data_report.json left half a JSON file, and every
    # later start failed on it ("Expecting value", naming no file).
    config = get_preset("tiny").replace(
        data="files", data_files=toy_corpus["files"], source_lang="fr", target_lang="en",
        max_length=16, train_subset=None)
    source = open_source("files", {"train": toy_corpus["files"]["train"]})
    (tmp_path / REPORT_FILENAME).write_text('{"source": {"data": "fi')
    report = prepare_data_report(source, config, toy_tokenizer, toy_tokenizer, tmp_path)
    assert report.splits["train"]["read"] == 96
    assert DataReport.load(tmp_path / REPORT_FILENAME) == report
    assert sorted(p.name for p in tmp_path.iterdir()) == [REPORT_FILENAME]


def test_a_test_set_edited_after_the_start_does_not_block_resuming(
        toy_corpus, toy_tokenizer, tmp_path):
    # Test sets are not counted in the report nor trained on, yet their digests were kept
    # with the training files': a corrected test file refused the run's resume with "its
    # content is not what the run's vocabulary and trained epochs were made from".
    import shutil

    test = [shutil.copy(path, tmp_path / f"news.{path.rsplit('.', 1)[1]}")
            for path in toy_corpus["files"]["test"]]
    files = {"train": toy_corpus["files"]["train"], "news": test}
    config = get_preset("tiny").replace(
        data="files", data_files=files, source_lang="fr", target_lang="en", max_length=16,
        train_subset=None)
    source = open_source("files", files)
    first = prepare_data_report(source, config, toy_tokenizer, toy_tokenizer, tmp_path)
    write_lines(test[1], ["a corrected line"] * 12)
    again = prepare_data_report(source, config, toy_tokenizer, toy_tokenizer, tmp_path,
                                resuming=True)
    assert again.splits == first.splits and again.batches == first.batches


def test_a_report_counted_under_older_reading_rules_is_counted_again(toy_corpus, toy_tokenizer,
                                                                   tmp_path):
    # The reader now drops sides of characters the tokenizers remove: a run resumed with a
    # report counted before had more batches on record than a pass gives (the validation
    # set's cardinality assertion failed at the end of its pass).
    import json

    from keras_transformer.data.preparation import REPORT_FILENAME

    source = open_source("files", toy_corpus["files"])
    config = get_preset("tiny").replace(data="files", data_files=toy_corpus["files"])
    report = prepare_data_report(source, config, toy_tokenizer, toy_tokenizer, tmp_path)
    path = tmp_path / REPORT_FILENAME
    older = json.loads(path.read_text())
    older["fingerprint"].pop("reader_rules", None)  # the older rules had none
    for split in older["splits"].values():
        split["kept"] += 5  # what the older rules had kept
    path.write_text(json.dumps(older))
    again = prepare_data_report(source, config, toy_tokenizer, toy_tokenizer, tmp_path,
                                resuming=True)
    assert again.splits == report.splits


def test_the_report_of_a_train_subset_says_the_rest_was_not_read():
    # `--preset tiny` reads 1,000 pairs of a 1,500-pair corpus: the report said "1,003 pairs
    # read, 1,000 kept", and nothing of the 500 pairs never read.
    from keras_transformer.data.preparation import DataReport
    from keras_transformer.data.readers import SplitReport

    counts = SplitReport(origin="train.tsv", read=1003, kept=1000).to_dict()
    source = {"data": "tsv", "source_lang": "en", "target_lang": "ru"}
    report = DataReport(source=source, splits={"train": counts, "validation": counts},
                        batches={"train": 125, "validation": 10},
                        fingerprint={"train_subset": 1000}, digests={})
    train_line, validation_line = str(report).splitlines()[1:]
    assert "first 1,000 kept pairs only (train_subset)" in train_line
    assert "train_subset" not in validation_line
    report.fingerprint = {"train_subset": None}
    assert "train_subset" not in str(report)
    report.fingerprint = {"train_subset": 5000}  # more than the corpus holds: all was read
    assert "train_subset" not in str(report)

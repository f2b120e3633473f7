"""Tests of train_sentencepiece: reserved ids, determinism, no leaked files."""

import sentencepiece as spm

from keras_transformer.text import END_ID, PAD_ID, START_ID, UNK_ID, train_sentencepiece


def test_reserved_ids(small_model_path):
    sp = spm.SentencePieceProcessor(model_file=str(small_model_path))
    assert (PAD_ID, START_ID, END_ID, UNK_ID) == (0, 1, 2, 3)
    assert sp.pad_id() == PAD_ID and sp.id_to_piece(PAD_ID) == "<pad>"
    assert sp.bos_id() == START_ID and sp.id_to_piece(START_ID) == "<s>"
    assert sp.eos_id() == END_ID and sp.id_to_piece(END_ID) == "</s>"
    assert sp.unk_id() == UNK_ID and sp.id_to_piece(UNK_ID) == "<unk>"
    assert sp.get_piece_size() == 2000
    # Ordinary text never produces a reserved id, so 0 can mean padding downstream.
    ids = sp.encode("A man in a blue shirt. Ein Mann im blauen Hemd.")
    assert ids and min(ids) > UNK_ID


def test_deterministic_and_writes_only_the_model(tmp_path, train_sentences):
    subset = train_sentences[::8]
    first = train_sentencepiece(subset, tmp_path / "a" / "x.model", vocab_size=600)
    second = train_sentencepiece(iter(subset), tmp_path / "b" / "x.model", vocab_size=600)
    assert first.read_bytes() == second.read_bytes()
    # Trained from an in-memory iterator: no vocab or temp files next to the model.
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["x.model", "x.model"]


def test_trains_from_files(tmp_path, train_sentences):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(train_sentences[::8]) + "\n", encoding="utf-8")
    from_file = train_sentencepiece(str(corpus), tmp_path / "f.model", vocab_size=600)
    from_list = train_sentencepiece(train_sentences[::8], tmp_path / "l.model", vocab_size=600)
    assert from_file.read_bytes() == from_list.read_bytes()


def test_a_vocabulary_the_corpus_cannot_fill_is_a_clear_error(tmp_path):
    # SentencePiece raises a RuntimeError ("Vocabulary size too high (8000). Please set it
    # to a value <= N."): a user with a small corpus meets it with the presets' 8000.
    import pytest

    with pytest.raises(ValueError, match=r"vocab_size=8000.*--set vocab_size=N") as error:
        train_sentencepiece(["A dog runs.", "Ein Hund rennt."] * 20, tmp_path / "x.model",
                            vocab_size=8000)
    assert "<=" in str(error.value)  # SentencePiece's bound, kept
    assert not (tmp_path / "x.model").exists()


def test_a_vocabulary_too_small_for_the_characters_is_a_clear_error(tmp_path):
    # SentencePiece's RuntimeError ("smaller than required_chars. 10 vs 275. ... decrease
    # character_coverage with --character_coverage option", an option `train` has not)
    # reached the user as a traceback. The advice is a larger vocabulary, not a smaller one.
    import pytest

    with pytest.raises(ValueError, match=r"vocab_size=10 .*need 275.*larger.*--set vocab_size=N"):
        train_sentencepiece(["A dog runs.", "Ein Hund rennt."] * 20, tmp_path / "x.model",
                            vocab_size=10, byte_fallback=True)
    assert not (tmp_path / "x.model").exists()


def test_a_corpus_of_lines_all_longer_than_the_limit_is_a_clear_error(tmp_path):
    # Paragraph-aligned text: SentencePiece skips lines past `max_sentence_length` bytes,
    # and with none left failed with "[!sentences_.empty()]".
    import pytest

    long_lines = [("Ein Hund rennt durch den Schnee. " * 200).strip()] * 5
    with pytest.raises(ValueError, match=r"(?s)longer than 4192 bytes.*split"):
        train_sentencepiece(long_lines, tmp_path / "x.model", vocab_size=300)
    assert not (tmp_path / "x.model").exists()
    # An empty corpus is not one of long lines.
    for empty in ([], ["", "  "]):
        with pytest.raises(ValueError, match=r"no text") as error:
            train_sentencepiece(empty, tmp_path / "x.model", vocab_size=300)
        assert "4192" not in str(error.value)


def test_sentences_left_out_for_their_length_are_counted_in_a_warning(tmp_path):
    # 300 paragraphs and 40 short lines trained on the short lines alone, without a word.
    import pytest

    paragraph = ("Ein Hund rennt durch den Schnee. " * 200).strip()
    short = ["A dog runs.", "Ein Hund rennt."] * 20
    with pytest.warns(UserWarning, match=r"3 of the 43 training sentences .*4192 bytes"):
        train_sentencepiece([paragraph] * 3 + short, tmp_path / "x.model", vocab_size=290,
                            hard_vocab_limit=False)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train_sentencepiece(short, tmp_path / "y.model", vocab_size=290, hard_vocab_limit=False)


def test_a_write_that_fails_leaves_the_previous_model_whole(tmp_path, train_sentences,
                                                            monkeypatch):
    # The model was written in place: a kill or a full disk during the write left a
    # truncated tokenizer.model that no later run could read.
    import errno
    import pathlib

    import pytest

    subset = train_sentences[::8]
    path = train_sentencepiece(subset, tmp_path / "tokenizer.model", vocab_size=600)
    before = path.read_bytes()

    def half_then_full_disk(self, data):
        with open(self, "wb") as f:
            f.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pathlib.Path, "write_bytes", half_then_full_disk)
    with pytest.raises(OSError, match="No space"):
        train_sentencepiece(subset, path, vocab_size=600)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.model"]  # no partial file

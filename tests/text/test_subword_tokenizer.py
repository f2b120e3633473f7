"""Tests of SubwordTokenizer: round trip, special ids, robustness, SavedModel asset."""

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.text import END_ID, PAD_ID, START_ID, SubwordTokenizer, normalize

from tests.text.conftest import read_lines


@pytest.mark.parametrize("lang", ["en", "de"])
def test_round_trip_on_validation_split(tokenizer, lang):
    sentences = read_lines("val", lang)
    assert len(sentences) == 1014
    ids = tokenizer.tokenize(tf.constant(sentences))
    decoded = [s.decode("utf-8") for s in tokenizer.detokenize(ids).numpy()]
    mismatches = [(s, d) for s, d in zip(sentences, decoded) if d != normalize(s)]
    assert not mismatches, mismatches[:3]
    # Subwords, not characters: a real vocabulary compresses the text.
    assert ids.flat_values.shape[0] < 0.5 * sum(len(s) for s in sentences)


def test_special_tokens_and_truncation(tokenizer):
    text = tf.constant(["A little girl climbing into a wooden playhouse."])
    plain = tokenizer.tokenize(text)
    full = tokenizer.tokenize(text, add_start=True, add_end=True)
    np.testing.assert_array_equal(
        full.to_list()[0], [START_ID] + plain.to_list()[0] + [END_ID]
    )
    cut = tokenizer.tokenize(text, max_length=5, add_end=True).to_list()[0]
    assert cut == plain.to_list()[0][:4] + [END_ID]
    assert tokenizer.truncate(plain, 3).to_list()[0] == plain.to_list()[0][:3]
    with pytest.raises(ValueError, match="max_length=2"):
        tokenizer.tokenize(text, max_length=2, add_start=True, add_end=True)


def test_detokenize_dense_stops_at_first_end(tokenizer):
    dog = tokenizer.tokenize(tf.constant(["A dog."])).to_list()[0]
    cat = tokenizer.tokenize(tf.constant(["A cat."])).to_list()[0]
    width = len(dog) + len(cat) + 4
    rows = [
        [START_ID] + dog + [END_ID] + cat,  # text after END is ignored
        dog + [PAD_ID] * 2,  # no END: read to the end, padding dropped
        [START_ID, END_ID],  # empty output
    ]
    dense = tf.constant([r + [PAD_ID] * (width - len(r)) for r in rows], tf.int32)
    out = tokenizer.detokenize(dense).numpy().tolist()
    assert out == [b"A dog.", b"A dog.", b""]
    ragged = tf.ragged.constant(rows, dtype=tf.int32)
    assert tokenizer.detokenize(ragged).numpy().tolist() == out


def test_vocab_and_pieces(tokenizer):
    assert tokenizer.vocab_size == 2000
    pieces = tokenizer.id_to_piece(tf.constant([PAD_ID, START_ID, END_ID, 3]))
    assert pieces.numpy().tolist() == [b"<pad>", b"<s>", b"</s>", b"<unk>"]
    ids = tokenizer.piece_to_id(tf.constant(["<s>", "</s>"]))
    assert ids.numpy().tolist() == [START_ID, END_ID]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   \t ",
        "日本語のテキストです",
        "Привет, мир",
        "مرحبا بالعالم",
        "emoji 😀👍🏽 here",
        "A dog " * 2000,
    ],
    ids=["empty", "whitespace", "japanese", "cyrillic", "arabic", "emoji", "long"],
)
def test_robust_round_trip(tokenizer, text):
    ids = tokenizer.tokenize(tf.constant([text]))
    # Byte fallback: characters never seen in training still round-trip exactly.
    assert tokenizer.detokenize(ids).numpy()[0].decode("utf-8") == normalize(text)
    if not text.strip():
        assert ids.to_list() == [[]]


def test_invalid_utf8_is_replaced(tokenizer):
    ids = tokenizer.tokenize(tf.constant([b"caf\xc3 ok \xff\xfe!", b"fine"]))
    out = tokenizer.detokenize(ids).numpy().tolist()
    # Invalid bytes become U+FFFD, which the nmt_nfkc rule turns into whitespace.
    assert out == [b"caf ok !", b"fine"]
    assert out[0].decode("utf-8") == normalize(b"caf\xc3 ok \xff\xfe!")


def test_survives_kernel_cache_clearing(small_model_path):
    fresh = SubwordTokenizer(small_model_path)
    text = tf.constant(["Ein Hund rennt."])
    expected = fresh.tokenize(text).to_list()
    # set_seed clears the eager kernel cache, which used to delete the SentencePiece
    # resource owned by the kernel.
    tf.random.set_seed(0)
    assert fresh.tokenize(text).to_list() == expected
    ds = tf.data.Dataset.from_tensor_slices(["Ein Hund rennt."]).batch(1)
    tf.random.set_seed(1)
    ids = next(iter(ds.map(lambda s: fresh.tokenize(s).to_tensor())))
    assert ids.numpy().tolist() == expected


def test_save_and_load(tokenizer, tmp_path):
    path = tokenizer.save(tmp_path / "vocab")
    assert path.name == "tokenizer.model"
    assert path.read_bytes() == pathlib.Path(tokenizer.model_path).read_bytes()
    reloaded = SubwordTokenizer.load(tmp_path / "vocab")
    text = tf.constant(["Ein Mann schläft."])
    assert reloaded.tokenize(text).to_list() == tokenizer.tokenize(text).to_list()
    with pytest.raises(FileNotFoundError):
        SubwordTokenizer.load(tmp_path / "missing")


class _TokenizerModule(tf.Module):
    """The shape of the exported Translator: a tf.Module holding the tokenizer."""

    def __init__(self, tokenizer):
        super().__init__()
        self.tokenizer = tokenizer

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def encode(self, text):
        return {"ids": self.tokenizer.tokenize(text, add_end=True).to_tensor()}

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
    def decode(self, ids):
        return {"text": self.tokenizer.detokenize(ids)}


# Runs in a fresh interpreter that imports only tensorflow and tensorflow_text: the TF2
# loader, then the TF1 session loader through saved_model_cli's own entry point
# (`saved_model_cli` cannot load tf-text's ops unless tensorflow_text is imported first).
_FRESH_PROCESS_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import tensorflow as tf
    import tensorflow_text  # registers the SentencePiece ops, nothing else
    path, sentences = sys.argv[1], json.loads(sys.argv[2])
    loaded = tf.saved_model.load(path)
    ids = loaded.signatures["serving_default"](text=tf.constant(sentences))["ids"]
    text = loaded.signatures["decode"](ids=ids)["text"]
    print(json.dumps({"ids": ids.numpy().tolist(),
                      "text": [t.decode("utf-8") for t in text.numpy()]}))
    assert "tensorflow_text" in sys.modules and "keras_transformer" not in sys.modules
    from tensorflow.python.tools import saved_model_cli
    sys.argv = ["saved_model_cli", "run", "--dir", path, "--tag_set", "serve",
                "--signature_def", "decode", "--input_exprs",
                "ids=" + json.dumps(ids.numpy().tolist())]
    saved_model_cli.main()
    """
)


@pytest.mark.slow
def test_saved_model_asset_in_fresh_process(tokenizer, small_model_path, tmp_path):
    module = _TokenizerModule(tokenizer)
    saved = tmp_path / "saved"
    tf.saved_model.save(
        module,
        str(saved),
        signatures={"serving_default": module.encode, "decode": module.decode},
    )
    assets = saved / "assets" / "tokenizer.model"
    assert assets.read_bytes() == small_model_path.read_bytes()
    moved = tmp_path / "moved" / "export"
    shutil.move(str(saved), str(moved))
    assert not saved.exists()

    sentences = ["Zwei Hunde spielen im Schnee.", "A girl in a red coat."]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, "-c", _FRESH_PROCESS_SCRIPT, str(moved), __import__("json").dumps(sentences)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    payload = __import__("json").loads(lines[0])
    expected_ids = tokenizer.tokenize(tf.constant(sentences), add_end=True).to_tensor()
    assert payload["ids"] == expected_ids.numpy().tolist()
    assert payload["text"] == sentences
    # saved_model_cli prints the decoded byte strings after the TF1 session run.
    cli_output = "\n".join(lines[1:])
    assert "Result for output key text" in cli_output
    assert "Zwei Hunde spielen im Schnee." in cli_output

    # The asset of the export is a complete tokenizer on its own.
    from_assets = SubwordTokenizer.load(moved / "assets")
    assert from_assets.tokenize(tf.constant(sentences)).to_list() == (
        tokenizer.tokenize(tf.constant(sentences)).to_list()
    )


def test_a_vocabulary_with_sentencepieces_default_ids_is_refused(tmp_path):
    # SentencePiece's defaults (unk 0, <s> 1, </s> 2, no padding) were accepted: unknown
    # characters became the padding id and the commonest piece, at id 3, was banned as UNK.
    import sentencepiece as spm

    sentences = ["A dog runs in the snow.", "Two dogs play.", "A man walks."] * 30
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), vocab_size=26,
                                   model_prefix=str(tmp_path / "defaults"))
    with pytest.raises(ValueError, match=r"other roles \(pad_id=-1, unk_id=0\): this package "
                                         r"needs pad_id=0, bos_id=1.*--pad_id=0 --bos_id=1"):
        SubwordTokenizer(tmp_path / "defaults.model")

"""An in-graph SentencePiece tokenizer whose model file travels as a SavedModel asset."""

import hashlib
import os
import pathlib
import shutil

import tensorflow as tf
from tensorflow_text.python.ops.sentencepiece_tokenizer import (
    gen_sentencepiece_tokenizer,
)

from keras_transformer.text.special_tokens import END_ID, PAD_ID, START_ID, UNK_ID

# The file name `save()` writes and `load()` looks for in a directory.
MODEL_FILENAME = "tokenizer.model"


# The characters Python's `str.isspace` names (`str.strip` removes them), in RE2's syntax:
# the tab to the carriage return, the four separators U+001C-U+001F, U+0085, and Unicode's
# separators (`\p{Z}`: spaces, U+2028, U+2029).
_WHITESPACE = r"[\t-\r\x1c-\x1f\x85\p{Z}]"


def strip_whitespace(text):
    """`text` (a string tensor) stripped of leading and trailing whitespace in the graph,
    as Python's `str.strip()` strips training sentences (`data.readers.keep_pair`).

    Under `nmt_nfkc` the tokenizer's rule strips nearly all of them (U+0085 aside); under
    `nfkc` or `identity`
    a request's `"...\\n"` or a leading ideographic space would otherwise be tokenized
    into pieces training never saw. Bytes that are not UTF-8 are kept as they are.
    """
    return tf.strings.regex_replace(text, f"^{_WHITESPACE}+|{_WHITESPACE}+$", "")


class _SentencepieceModel(tf.saved_model.experimental.TrackableResource):
    """The SentencePiece processor resource, recreated from the model asset's bytes.

    `SentencepieceOp` takes the serialized model as a graph *attribute*, not as a tensor
    input, so the bytes must be known when the creating function is traced: they are
    read from the asset file in Python and the traced creator embeds them. The asset
    keeps the `.model` file itself next to the graph (`<savedmodel>/assets/`), where
    `SubwordTokenizer.load` and people find it.
    """

    def __init__(self, asset, model_proto):
        super().__init__()
        # Tracking the asset here makes every SavedModel that saves the resource also
        # copy the model file into its `assets/` directory.
        self._asset = asset
        self._model_proto = model_proto
        _ = self.resource_handle  # Creates the resource eagerly.

    def _create_resource(self):
        # Without a shared_name the resource belongs to the op's kernel and is deleted
        # with it, and eager kernels are dropped whenever the kernel cache is cleared
        # (`tf.random.set_seed` does it): every later call would fail with "Resource
        # ... does not exist". A name derived from the model bytes keeps the resource in
        # the resource manager for the process; equal models share one processor.
        digest = hashlib.sha256(self._model_proto).hexdigest()[:20]
        return gen_sentencepiece_tokenizer.sentencepiece_op(
            model=self._model_proto, shared_name=f"keras_transformer_sentencepiece_{digest}"
        )


def check_reserved_ids(model_proto, model_path="the model"):
    """Raises ValueError unless a SentencePiece model gives the reserved ids their roles:
    `PAD_ID` padding, `START_ID` `<s>`, `END_ID` `</s>`, `UNK_ID` unknown.

    SentencePiece's own defaults (unknown 0, `<s>` 1, `</s>` 2, no padding) had been
    accepted: an unknown character became id 0, which the model masks as padding, and the
    commonest piece at id 3 could never be produced (decoding bans UNK).
    """
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_proto=model_proto)
    roles = {"pad_id": (processor.pad_id(), PAD_ID), "bos_id": (processor.bos_id(), START_ID),
             "eos_id": (processor.eos_id(), END_ID), "unk_id": (processor.unk_id(), UNK_ID)}
    wrong = {name: have for name, (have, want) in roles.items() if have != want}
    if wrong:
        found = ", ".join(f"{name}={value}" for name, value in wrong.items())
        raise ValueError(
            f"{model_path} gives the reserved ids other roles ({found}): "
            "this package needs pad_id=0, bos_id=1, eos_id=2, unk_id=3. Train the vocabulary "
            "with keras_transformer.text.train_sentencepiece, or SentencePiece with "
            "--pad_id=0 --bos_id=1 --eos_id=2 --unk_id=3.")


class SubwordTokenizer(tf.Module):
    """SentencePiece tokenize/detokenize as TensorFlow ops, savable inside a SavedModel.

    The `.model` file is held as a `tf.saved_model.Asset`: any `tf.Module` that keeps the
    tokenizer as an attribute and is saved with `tf.saved_model.save` gets the file in
    `<savedmodel>/assets/`, and its `tf.function`s run after loading in a process that
    imports only `tensorflow` and `tensorflow_text` (TF2 `tf.saved_model.load`, TF1
    session loaders such as `saved_model_cli run`, TF Serving), also after the directory
    was moved.

    Input text is transcoded from UTF-8 to UTF-8 with invalid bytes replaced by U+FFFD,
    then normalized by SentencePiece with the model's own rule (see
    `keras_transformer.text.normalization`), so `detokenize(tokenize(s)) == normalize(s,
    rule)`; `rule` is `nmt_nfkc` unless the vocabulary was trained with another.

    Args:
        model_path: str or path-like, a SentencePiece `.model` file trained with the
            reserved ids (`0` pad, `1` start, `2` end, `3` unk), e.g. by
            `train_sentencepiece`.
        name: str, name of the module. Defaults to `None`.

    Example:

    >>> from keras_transformer.text import train_tokenizers
    >>> pairs = {"en": ["A dog runs.", "Two dogs play in the snow."] * 20,
    ...          "de": ["Ein Hund rennt.", "Zwei Hunde spielen im Schnee."] * 20}
    >>> _ = train_tokenizers(pairs, vocab_size=290, output_dir="vocab")
    >>> tokenizer = SubwordTokenizer("vocab/tokenizer.model")
    >>> ids = tokenizer.tokenize(tf.constant(["A dog runs."]), add_end=True)
    >>> tokenizer.detokenize(ids).numpy()
    array([b'A dog runs.'], dtype=object)
    """

    def __init__(self, model_path, name=None):
        super().__init__(name=name)
        model_path = os.fspath(model_path)
        with open(model_path, "rb") as f:
            model_proto = f.read()
        check_reserved_ids(model_proto, model_path)
        self.model_asset = tf.saved_model.Asset(model_path)
        self._model = _SentencepieceModel(self.model_asset, model_proto)
        self._vocab_size = int(
            gen_sentencepiece_tokenizer.sentencepiece_vocab_size_op(
                self._model.resource_handle
            )
        )

    @property
    def vocab_size(self):
        """int, number of ids, reserved and byte pieces included."""
        return self._vocab_size

    @property
    def model_path(self):
        """str, the path of the `.model` file this tokenizer was built from."""
        return self.model_asset.asset_path.numpy().decode("utf-8")

    def tokenize(self, strings, max_length=None, add_start=False, add_end=False):
        """Converts strings to ids.

        Args:
            strings: string tensor `(B,)` (or a list of str), UTF-8; invalid bytes become
                U+FFFD instead of failing.
            max_length: int or None, the longest id sequence returned, special tokens
                included: text ids are cut to `max_length - add_start - add_end`.
                Defaults to `None` (no truncation).
            add_start: bool, prepend `START_ID`. Defaults to `False`.
            add_end: bool, append `END_ID`. Defaults to `False`.

        Returns:
            int32 `tf.RaggedTensor` `(B, None)`; an empty or whitespace-only string gives
            an empty row (or only the requested special tokens).
        """
        strings = tf.convert_to_tensor(strings, dtype=tf.string)
        strings = tf.strings.unicode_transcode(
            strings,
            input_encoding="UTF-8",
            output_encoding="UTF-8",
            errors="replace",
            replacement_char=0xFFFD,
        )
        values, row_splits = gen_sentencepiece_tokenizer.sentencepiece_tokenize_op(
            self._model.resource_handle,
            strings,
            nbest_size=0,
            alpha=1.0,
            add_bos=False,
            add_eos=False,
            reverse=False,
            out_type=tf.int32,
            Tsplits=tf.int64,
        )
        ids = tf.RaggedTensor.from_row_splits(values, row_splits, validate=False)
        return self.add_special_tokens(ids, max_length, add_start, add_end)

    @staticmethod
    def add_special_tokens(ids, max_length=None, add_start=False, add_end=False):
        """Cuts text ids to leave room for START/END, then adds them (as `tokenize` does).

        Args:
            ids: int32 `tf.RaggedTensor` `(B, None)` of text ids.
            max_length: int or None, see `tokenize`.
            add_start: bool, prepend `START_ID`. Defaults to `False`.
            add_end: bool, append `END_ID`. Defaults to `False`.

        Returns:
            int32 `tf.RaggedTensor` `(B, None)`.
        """
        num_special = int(add_start) + int(add_end)
        if max_length is not None:
            if max_length <= num_special:
                raise ValueError(
                    f"max_length={max_length} leaves no room for text next to "
                    f"{num_special} special token(s)."
                )
            ids = ids[:, : max_length - num_special]
        batch = ids.nrows()
        pieces = []
        if add_start:
            pieces.append(tf.RaggedTensor.from_tensor(tf.fill([batch, 1], START_ID)))
        pieces.append(ids)
        if add_end:
            pieces.append(tf.RaggedTensor.from_tensor(tf.fill([batch, 1], END_ID)))
        if len(pieces) > 1:
            ids = tf.concat(pieces, axis=1)
        return ids

    def detokenize(self, ids):
        """Converts ids back to text.

        Each row is read up to its first `END_ID`; `PAD_ID` and `START_ID` are dropped.
        This is what a decoder output `(B, T)` padded after END needs.

        Args:
            ids: int32 (or int64) dense tensor `(B, T)` or `tf.RaggedTensor` `(B, None)`.

        Returns:
            string tensor `(B,)` of normalized text.
        """
        if isinstance(ids, tf.RaggedTensor):
            ids = tf.cast(ids, tf.int32)
        else:
            ids = tf.cast(tf.convert_to_tensor(ids), tf.int32)
        # Running count of ENDs: a position is kept while no END came before or at it.
        before_end = tf.equal(tf.cumsum(tf.cast(tf.equal(ids, END_ID), tf.int32), axis=1), 0)
        keep = before_end & tf.not_equal(ids, PAD_ID) & tf.not_equal(ids, START_ID)
        ids = tf.ragged.boolean_mask(ids, keep)
        return gen_sentencepiece_tokenizer.sentencepiece_detokenize_op(
            self._model.resource_handle,
            ids.flat_values,
            ids.row_splits,
            add_bos=False,
            add_eos=False,
            reverse=False,
        )

    def id_to_piece(self, ids):
        """Maps ids (any shape, dense) to their pieces (`"▁dog"`, `"<s>"`, `"<0xF0>"`)."""
        ids = tf.cast(tf.convert_to_tensor(ids), tf.int32)
        flat = gen_sentencepiece_tokenizer.sentencepiece_id_to_string_op(
            self._model.resource_handle, tf.reshape(ids, [-1])
        )
        return tf.reshape(flat, tf.shape(ids))

    def piece_to_id(self, pieces):
        """Maps pieces (any shape, dense) to ids; unknown pieces give `UNK_ID`."""
        pieces = tf.convert_to_tensor(pieces, dtype=tf.string)
        flat = gen_sentencepiece_tokenizer.sentencepiece_string_to_id_op(
            self._model.resource_handle, tf.reshape(pieces, [-1])
        )
        return tf.reshape(flat, tf.shape(pieces))

    @staticmethod
    def truncate(ids, max_length):
        """Keeps the first `max_length` ids of each row of a ragged or dense `(B, T)`."""
        return ids[:, :max_length]

    def save(self, directory, filename=MODEL_FILENAME):
        """Copies the `.model` file to `directory/filename` and returns that path.

        Args:
            directory: str or path-like, created if missing.
            filename: str. Defaults to `"tokenizer.model"`.

        Returns:
            The `pathlib.Path` of the copy.
        """
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / filename
        source = pathlib.Path(self.model_path)
        if source.resolve() != target.resolve():
            shutil.copyfile(source, target)
        return target

    @classmethod
    def load(cls, path, name=None):
        """Builds a tokenizer from a `.model` file or a directory holding one.

        Args:
            path: str or path-like: a `.model` file, or a directory with
                `tokenizer.model` or exactly one `*.model` file (a SavedModel's
                `assets/` directory works too).
            name: str, module name. Defaults to `None`.

        Returns:
            A `SubwordTokenizer`.
        """
        path = pathlib.Path(path)
        if path.is_dir():
            if (path / MODEL_FILENAME).is_file():
                path = path / MODEL_FILENAME
            else:
                candidates = sorted(path.glob("*.model"))
                if len(candidates) != 1:
                    raise FileNotFoundError(
                        f"Expected {MODEL_FILENAME} or exactly one *.model file in "
                        f"{path}, found {[c.name for c in candidates]}."
                    )
                path = candidates[0]
        if not path.is_file():
            raise FileNotFoundError(f"No SentencePiece model at {path}.")
        return cls(path, name=name)

"""Fixtures of the export tests: a tiny Transformer trained for real on a copy task.

The task: "sentences" of 2-6 made-up words, translated to themselves. A 2-layer model of
width 64 learns it in ~30 s on 2 CPU cores, so greedy and beam outputs are real sentences
that the tests can compare exactly with the source. Trained once per test session (all
modules of this directory share it) and exported once.
"""

import random
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

# Made-up words: short, so the 300-piece vocabulary holds most of them as single pieces.
WORDS = (
    "ka lo mi nu pe ra si tu vo xe bal dor fen gim hut jel kor lam nip pos rub sel tam vin"
).split()
MIN_WORDS, MAX_WORDS = 2, 6
NUM_TRAIN = 3000
NUM_HELD_OUT = 40
# SentencePiece pieces, the 4 reserved ids and 256 byte-fallback pieces included.
VOCAB_SIZE = 300
MODEL_KWARGS = dict(d_model=64, num_heads=4, ff_dim=128, num_layers=2, dropout=0.0, max_length=64)
EPOCHS = 12
BATCH_SIZE = 64
LEARNING_RATE = 3e-3
# Decoding settings of the exported model (short bounds keep the searches cheap).
DECODING = dict(max_input_length=24, extra_length=6, max_output_length=32)
BEAM_SETTINGS = ("beam_size", "alpha", "length_penalty_form", "early_stopping")


def for_search(settings):
    """`DecodingConfig` settings without the beam ones unless the search is beam search
    (tests parametrized over searches give a beam size to all; the config refuses it)."""
    if settings.get("search", "beam") == "beam":
        return settings
    return {key: value for key, value in settings.items() if key not in BEAM_SETTINGS}
EXPORT_BEAM_SIZE = 3


def make_sentences(count, seed):
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(MIN_WORDS, MAX_WORDS)))
        for _ in range(count)
    ]


class CopyTask:
    """The trained tiny model, its tokenizer and sentences it has and has not seen."""

    def __init__(self, model, tokenizer, train, held_out):
        self.model = model
        self.tokenizer = tokenizer
        self.train = train
        self.held_out = held_out

    def translator(self, model=None, metadata=None, **config):
        from keras_transformer.export import DecodingConfig, Translator

        settings = for_search({**DECODING, **config})
        return Translator(model or self.model, self.tokenizer, self.tokenizer,
                          DecodingConfig(**settings), metadata=metadata)


def flattened_copy(model, factor):
    """A copy of post-norm `model` whose logits (but the projection's bias) are `factor`
    times smaller: the last decoder block's norm scaled, so the copy is unsure (beam
    search's length penalty then changes translations)."""
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    block = copy.get_layer("decoder").blocks[-1]
    assert not block.norm_first  # a pre-norm stack's final norm would undo the scaling
    for weight in (block._feed_forward_norm.gamma, block._feed_forward_norm.beta):
        weight.assign(weight * factor)
    return copy


def _train_copy_model(tokenizer, sentences):
    from keras_transformer.model import build_transformer

    source = tokenizer.tokenize(tf.constant(sentences), add_end=True)  # ragged, END last
    decoder_in = tokenizer.tokenize(tf.constant(sentences), add_start=True)  # START first
    inputs = {
        "encoder_tokens": source.to_tensor().numpy(),
        "decoder_tokens": decoder_in.to_tensor().numpy(),
    }
    labels = source.to_tensor().numpy()  # target + END: the copy of the source
    model = build_transformer(tokenizer.vocab_size, **MODEL_KWARGS)
    model.compile(
        optimizer=keras.optimizers.Adam(LEARNING_RATE),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0),
    )
    model.fit(inputs, labels, batch_size=BATCH_SIZE, epochs=EPOCHS, verbose=0)
    return model


@pytest.fixture(scope="session")
def copy_task(tmp_path_factory):
    from keras_transformer.text import SubwordTokenizer, train_sentencepiece

    keras.utils.set_random_seed(7)
    train = make_sentences(NUM_TRAIN, seed=0)
    held_out = [s for s in make_sentences(4 * NUM_HELD_OUT, seed=1) if s not in set(train)]
    path = train_sentencepiece(
        train, tmp_path_factory.mktemp("vocab") / "tokenizer.model", vocab_size=VOCAB_SIZE,
        hard_vocab_limit=False,
    )
    tokenizer = SubwordTokenizer(path)
    model = _train_copy_model(tokenizer, train)
    return CopyTask(model, tokenizer, train, held_out[:NUM_HELD_OUT])


@pytest.fixture(scope="session")
def random_model(copy_task):
    """Random weights, untied projection whose END bias is hugely negative: never ends."""
    from keras_transformer.model import build_transformer
    from keras_transformer.text import END_ID

    keras.utils.set_random_seed(11)
    model = build_transformer(
        copy_task.tokenizer.vocab_size, tie_embeddings=False, **MODEL_KWARGS
    )
    projection = model.get_layer("output_projection")
    bias = np.zeros(projection.bias.shape, "float32")
    bias[END_ID] = -1e4
    projection.bias.assign(bias)
    return model


# The `Translator(metadata=)` of the `exported` fixture: what its `metadata` signature says.
COPY_DIRECTION = {"source_lang": "ka", "target_lang": "ka", "data": "copy"}


@pytest.fixture(scope="session")
def exported(copy_task, tmp_path_factory):
    """The copy model exported with beam search, then *moved*: returns the new base dir.

    With the tied projection's kernel stored, as `keras-transformer export` stores it, so
    the loading tests (fresh process, session loader) restore that variable too."""
    from keras_transformer.export import export_translator

    translator = copy_task.translator(search="beam", beam_size=EXPORT_BEAM_SIZE,
                                      stored_projection=True,
                                      metadata={**COPY_DIRECTION, "domain": None})
    assert hasattr(translator, "projection_kernel")  # the copy model is tied
    written = tmp_path_factory.mktemp("export_written") / "translator"
    version_dir = export_translator(translator, written, metadata={"task": "copy"})
    assert version_dir == written / "1"
    moved = tmp_path_factory.mktemp("export_moved") / "translator"
    shutil.move(str(written), str(moved))
    assert not written.exists()
    return moved

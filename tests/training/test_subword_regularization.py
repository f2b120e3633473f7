"""Subword regularization in training: each epoch's segmentations are fixed by the seed and
the epoch, an epoch keeps its batch count, and a resumed run reads what an uninterrupted
one does."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.data import load_multi30k
from keras_transformer.text import train_tokenizers
from keras_transformer.training import get_preset
from keras_transformer.training import trainer
from keras_transformer.training.trainer import (
    make_epoch_train_dataset,
    segmentation_samplers,
    train,
)

PAIRS = 96


@pytest.fixture(scope="module")
def data(multi30k_tfds_dir, tmp_path_factory):
    pairs = load_multi30k("train", data_dir=multi30k_tfds_dir).take(PAIRS)
    texts = {"en": [], "de": []}
    for pair in pairs.as_numpy_iterator():
        for lang in texts:
            texts[lang].append(pair[lang].decode("utf-8"))
    tokenizers = train_tokenizers(texts, vocab_size=400,
                                  output_dir=tmp_path_factory.mktemp("vocab"))
    config = get_preset("tiny").replace(
        train_subset=PAIRS, steps_per_epoch=None, epochs=3, max_length=96,
        subword_nbest=8, subword_alpha=0.1)
    return config, pairs, tokenizers


def _epochs(dataset, steps):
    batches = [(inputs["encoder_tokens"].numpy(), inputs["decoder_tokens"].numpy(),
                labels.numpy()) for inputs, labels in dataset]
    return [batches[i:i + steps] for i in range(0, len(batches), steps)]


def _same(first, second):
    return len(first) == len(second) and all(
        all(np.array_equal(a, b) for a, b in zip(x, y)) for x, y in zip(first, second))


def test_epochs_draw_their_own_segmentations_and_a_resumed_run_reads_the_same(data):
    config, pairs, (source, target) = data
    samplers = segmentation_samplers(config, pairs, source, target, log=lambda _: None)
    dataset, steps = make_epoch_train_dataset(config, pairs, source, target, samplers=samplers)
    plain, plain_steps = make_epoch_train_dataset(config, pairs, source, target)
    assert steps == plain_steps  # the batch count of the best segmentations
    epochs = _epochs(dataset, steps)
    assert [len(epoch) for epoch in epochs] == [steps] * 3

    # A resumed run (another sampler, built again) reads epochs 1 and 2 as they were.
    again = segmentation_samplers(config, pairs, source, target, log=lambda _: None)
    resumed, _ = make_epoch_train_dataset(config, pairs, source, target, initial_epoch=1,
                                          samplers=again)
    resumed_epochs = _epochs(resumed, steps)
    assert _same(resumed_epochs[0], epochs[1]) and _same(resumed_epochs[1], epochs[2])

    # The sampled epochs hold the same sentences as the plain ones, segmented otherwise.
    plain_epoch = _epochs(plain, plain_steps)[0]
    decoded = lambda epoch: sorted(  # noqa: E731
        text for batch in epoch for text in target.detokenize(batch[2]).numpy().tolist())
    assert decoded(plain_epoch) == decoded(epochs[0])
    ids = lambda epoch: sorted(  # noqa: E731
        tuple(row[row > 0]) for batch in epoch for row in batch[2])
    assert ids(plain_epoch) != ids(epochs[0]) != ids(epochs[1])


def test_segmentation_samplers_off_by_default_and_bounded_in_memory(data, monkeypatch):
    config, pairs, (source, target) = data
    assert segmentation_samplers(config.replace(subword_nbest=1), pairs, source, target) is None
    messages = []
    samplers = segmentation_samplers(config, pairs, source, target, log=messages.append)
    assert [s.num_sentences for s in samplers] == [PAIRS, PAIRS]
    assert "the 8 best segmentations of 96 sentences" in messages[0]
    assert messages[0].endswith("(source)") and messages[1].endswith("(target)")
    monkeypatch.setattr(trainer, "CACHE_MAX_PAIRS", PAIRS - 1)
    with pytest.raises(ValueError, match="at most 95 pairs"):
        segmentation_samplers(config, pairs, source, target)


@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_a_run_trains_with_subword_sampling(tmp_path, multi30k_tfds_dir, capsys, strategy):
    # Under MirroredStrategy the dataset, the samplers' tensors with it, is distributed.
    config = get_preset("tiny").replace(
        epochs=1, steps_per_epoch=None, train_subset=PAIRS, bleu_sentences=0,
        subword_nbest=4)
    if strategy == "mirrored":
        strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    run = train(config, tmp_path / "run", data_dir=multi30k_tfds_dir, strategy=strategy,
                report_padding=False, verbose=0)
    assert "Subword sampling: the 4 best segmentations" in capsys.readouterr().out
    assert int(run.model.optimizer.iterations.numpy()) == PAIRS // 8


def test_config_rejects_bad_subword_settings():
    with pytest.raises(ValueError, match="subword_nbest"):
        get_preset("tiny").replace(subword_nbest=0)
    with pytest.raises(ValueError, match="subword_alpha"):
        get_preset("tiny").replace(subword_alpha=-0.5)


@pytest.mark.parametrize("sampled", [False, True], ids=["best", "sampled"])
def test_epochs_of_steps_per_epoch_follow_each_other_through_the_data(data, sampled):
    # `steps_per_epoch` shorter than a pass (epochs as checkpoint intervals on a large
    # corpus) started every epoch again at the top of a freshly shuffled pass: what lay
    # past the first `steps_per_epoch` batches of a pass was never trained on (read from a
    # file through a bounded shuffle buffer: the end of the file, never). Epochs are
    # consecutive slices of one stream of passes, and a resumed run reads the same slices.
    config, pairs, (source, target) = data
    config = config.replace(subword_nbest=8 if sampled else 1)
    _, per_pass = make_epoch_train_dataset(config.replace(subword_nbest=1), pairs, source,
                                           target)
    steps = per_pass // 3 + 1
    config = config.replace(steps_per_epoch=steps, epochs=4)
    samplers = (segmentation_samplers(config, pairs, source, target, log=lambda _: None)
                if sampled else None)
    dataset, got_steps = make_epoch_train_dataset(config, pairs, source, target,
                                                  samplers=samplers)
    assert got_steps == steps
    epochs = _epochs(dataset, steps)
    assert [len(epoch) for epoch in epochs] == [steps] * 4
    if not sampled:  # the first pass's batches hold every training pair once
        first_pass = [batch for epoch in epochs for batch in epoch][:per_pass]
        # (compared by their starts: a pair longer than `max_length` is cut)
        read = sorted(text[:40] for batch in first_pass
                      for text in target.detokenize(batch[2]).numpy().tolist())
        target_lang = trainer.run_languages(config)[1]
        expected = sorted(pair[target_lang][:40] for pair in pairs.as_numpy_iterator())
        assert len(read) == len(expected) == PAIRS and read == expected
    again = (segmentation_samplers(config, pairs, source, target, log=lambda _: None)
             if sampled else None)
    resumed, _ = make_epoch_train_dataset(config, pairs, source, target, initial_epoch=2,
                                          samplers=again)
    resumed_epochs = _epochs(resumed, steps)
    assert len(resumed_epochs) == 2
    assert _same(resumed_epochs[0], epochs[2]) and _same(resumed_epochs[1], epochs[3])
    # Resumed in a later pass (epoch 3 starts past the first pass's batches).
    assert 3 * steps > per_pass
    later, _ = make_epoch_train_dataset(config, pairs, source, target, initial_epoch=3,
                                        samplers=again)
    assert _same(_epochs(later, steps)[0], epochs[3])

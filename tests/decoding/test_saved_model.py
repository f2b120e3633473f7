"""The searches trace once with an unknown batch size and survive a SavedModel round trip."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.decoding import beam_search, greedy_search, sample
from tests.decoding.fake_models import HistoryModel

MAX_LENGTH = 12


class FakeTranslator(tf.Module):
    """String in, tokens out, like the exported `translate` signature, on a fake model."""

    def __init__(self):
        super().__init__()
        self.model = HistoryModel(vocab_size=9, max_length=MAX_LENGTH, seed=3, end_bias=0.4)

    def _inputs(self, text):
        source = tf.strings.length(text)  # (B,) a stand-in for the encoder
        batch_size = tf.shape(text)[0]
        max_lengths = tf.minimum(source + 2, MAX_LENGTH)  # per-example bound
        return self.model.initial_cache(source), batch_size, max_lengths

    @staticmethod
    def _outputs(result):
        return {"tokens": result.tokens, "score": result.scores, "length": result.lengths}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def greedy(self, text):
        cache, batch_size, max_lengths = self._inputs(text)
        return self._outputs(
            greedy_search(
                self.model.next_logits, cache, batch_size, MAX_LENGTH,
                max_lengths=max_lengths,
            )
        )

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def beam(self, text):
        cache, batch_size, max_lengths = self._inputs(text)
        return self._outputs(
            beam_search(
                self.model.next_logits, cache, batch_size, MAX_LENGTH, beam_size=3,
                alpha=0.6, max_lengths=max_lengths,
            )
        )

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def sample(self, text):
        cache, batch_size, max_lengths = self._inputs(text)
        return self._outputs(
            sample(
                self.model.next_logits, cache, batch_size, MAX_LENGTH, top_p=0.9,
                seed=tf.constant([3, 4]), max_lengths=max_lengths,
            )
        )


_TEXTS = [b"a", b"a longer sentence", b"mid size", b"", b"xyz"]
_METHODS = ["greedy", "beam", "sample"]


@pytest.fixture(scope="module")
def translator():
    return FakeTranslator()


@pytest.mark.parametrize("method", _METHODS)
def test_traces_once_for_any_batch_size(translator, method):
    function = getattr(translator, method)
    for batch in (_TEXTS[:1], _TEXTS, _TEXTS[:3]):
        outputs = function(tf.constant(batch))
        assert outputs["tokens"].shape == (len(batch), MAX_LENGTH)
    assert function.experimental_get_tracing_count() == 1
    concrete = function.get_concrete_function()
    assert concrete.structured_outputs["tokens"].shape.as_list() == [None, MAX_LENGTH]
    assert concrete.structured_outputs["score"].shape.as_list() == [None]


def test_saved_model_reload_gives_the_same_outputs(translator, tmp_path):
    texts = tf.constant(_TEXTS)
    before = {method: getattr(translator, method)(texts) for method in _METHODS}
    path = str(tmp_path / "fake_translator")
    tf.saved_model.save(translator, path)
    reloaded = tf.saved_model.load(path)
    for method in _METHODS:
        after = getattr(reloaded, method)(texts)
        for key in ("tokens", "length"):
            np.testing.assert_array_equal(after[key], before[method][key])
        np.testing.assert_allclose(after["score"], before[method]["score"], rtol=1e-6)
    # Bounds hold in the reloaded graph: at most len(text) + 2 tokens.
    lengths = reloaded.beam(texts)["length"].numpy()
    assert np.all(lengths <= np.array([len(t) for t in _TEXTS]) + 2)

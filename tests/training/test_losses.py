"""MaskedSparseCategoricalCrossentropy: exact values, padding invariance, serialization."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.training.losses import (
    MaskedSparseCategoricalCrossentropy,
    smoothed_cross_entropy_from_logits,
)

VOCAB_SIZE = 7


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    labels = np.array([[3, 5, 2, 0, 0], [6, 1, 4, 4, 2]], dtype="int32")
    logits = rng.normal(size=(2, 5, VOCAB_SIZE)).astype("float32")
    return labels, logits


def _reference_loss(labels, logits, smoothing, pad_id=0):
    """Plain NumPy: smoothed target q (pad gets 0, others share eps/(V-2)), H(q, p)."""
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    total, count = 0.0, 0
    for b in range(labels.shape[0]):
        for t in range(labels.shape[1]):
            if labels[b, t] == pad_id:
                continue
            q = np.full(VOCAB_SIZE, smoothing / (VOCAB_SIZE - 2))
            q[pad_id] = 0.0
            q[labels[b, t]] = 1.0 - smoothing
            assert np.isclose(q.sum(), 1.0)
            total += -(q * log_probs[b, t]).sum()
            count += 1
    return total / count


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3], ids=["no_smoothing", "0.1", "0.3"])
def test_matches_numpy_reference(smoothing):
    labels, logits = _batch()
    loss = MaskedSparseCategoricalCrossentropy(label_smoothing=smoothing)
    expected = _reference_loss(labels, logits, smoothing)
    np.testing.assert_allclose(float(loss(labels, logits)), expected, rtol=1e-5)


def _reference_gradient(labels, logits, smoothing, pad_id):
    """d loss / d logits in closed form: (softmax - q) / real tokens, 0 at padding."""
    shifted = logits - logits.max(-1, keepdims=True)
    probs = np.exp(shifted) / np.exp(shifted).sum(-1, keepdims=True)
    others = VOCAB_SIZE - (1 if pad_id is None else 2)
    q = np.full(logits.shape, smoothing / others)
    if pad_id is not None:
        q[..., pad_id] = 0.0
    np.put_along_axis(q, labels[..., None], 1.0 - smoothing, axis=-1)
    real = np.ones(labels.shape) if pad_id is None else (labels != pad_id).astype("float64")
    return (probs - q) * real[..., None] / real.sum()


@pytest.mark.parametrize("pad_id", [0, None], ids=["pad_0", "no_pad"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1], ids=["no_smoothing", "0.1"])
def test_gradient_is_softmax_minus_smoothed_target(smoothing, pad_id):
    import tensorflow as tf

    labels, logits = _batch()
    loss = MaskedSparseCategoricalCrossentropy(label_smoothing=smoothing, pad_id=pad_id)
    variable = tf.Variable(logits)
    with tf.GradientTape() as tape:
        value = loss(labels, variable)
    expected = _reference_gradient(labels, logits, smoothing, pad_id)
    np.testing.assert_allclose(tape.gradient(value, variable).numpy(), expected, atol=1e-7)


def test_from_probabilities_equals_from_logits():
    labels, logits = _batch()
    probs = keras.ops.softmax(logits, axis=-1)
    from_probs = MaskedSparseCategoricalCrossentropy(from_logits=False)(labels, probs)
    from_logits = MaskedSparseCategoricalCrossentropy()(labels, logits)
    np.testing.assert_allclose(float(from_probs), float(from_logits), rtol=1e-5)


def test_logits_at_padding_do_not_matter():
    labels, logits = _batch()
    loss = MaskedSparseCategoricalCrossentropy()
    changed = logits.copy()
    changed[labels == 0] = 100.0 * np.random.default_rng(1).normal(
        size=changed[labels == 0].shape
    )
    np.testing.assert_allclose(float(loss(labels, changed)), float(loss(labels, logits)), rtol=1e-6)


def test_extra_padding_columns_do_not_matter():
    labels, logits = _batch()
    loss = MaskedSparseCategoricalCrossentropy()
    padded_labels = np.pad(labels, ((0, 0), (0, 4)))
    padded_logits = np.concatenate(
        [logits, np.random.default_rng(2).normal(size=(2, 4, VOCAB_SIZE)).astype("float32")],
        axis=1,
    )
    np.testing.assert_allclose(
        float(loss(padded_labels, padded_logits)), float(loss(labels, logits)), rtol=1e-6
    )


def test_is_a_token_mean_not_a_sentence_mean():
    """Row 0 has 3 tokens, row 1 has 5: the batch value weights each token equally."""
    labels, logits = _batch()
    loss = MaskedSparseCategoricalCrossentropy()
    row0, row1 = float(loss(labels[:1], logits[:1])), float(loss(labels[1:], logits[1:]))
    np.testing.assert_allclose(float(loss(labels, logits)), (3 * row0 + 5 * row1) / 8, rtol=1e-5)


def test_all_padding_gives_zero_not_nan():
    labels = np.zeros((2, 3), "int32")
    logits = np.ones((2, 3, VOCAB_SIZE), "float32")
    assert float(MaskedSparseCategoricalCrossentropy()(labels, logits)) == 0.0


def test_bfloat16_logits_give_float32_loss():
    labels, logits = _batch()
    value = MaskedSparseCategoricalCrossentropy()(labels, keras.ops.cast(logits, "bfloat16"))
    assert keras.backend.standardize_dtype(value.dtype) == "float32"
    np.testing.assert_allclose(float(value), _reference_loss(labels, logits, 0.1), rtol=2e-2)


def test_serialization_round_trip():
    loss = MaskedSparseCategoricalCrossentropy(label_smoothing=0.2, pad_id=1, from_logits=False)
    restored = keras.losses.deserialize(keras.losses.serialize(loss))
    assert isinstance(restored, MaskedSparseCategoricalCrossentropy)
    assert restored.get_config() == loss.get_config()


def test_invalid_smoothing_raises():
    with pytest.raises(ValueError, match="label_smoothing"):
        MaskedSparseCategoricalCrossentropy(label_smoothing=1.0)


def test_per_timestep_sample_weights_of_shape_b_t_1_weigh_tokens():
    # Keras' per-timestep form `(B, T, 1)` broadcast against `(B, T)` to `(B, T, T)`: a
    # wrong loss (3.2101 against 4.1654 for the audit's batch) and no error.
    labels, logits = _batch()
    weights = np.array([[1, 0, 1, 0, 0], [0, 1, 1, 1, 0]], "float32")
    loss = MaskedSparseCategoricalCrossentropy(label_smoothing=0.1)
    expected = float(loss(labels, logits, sample_weight=weights))
    assert float(loss(labels, logits, sample_weight=weights[..., None])) == pytest.approx(
        expected, rel=1e-6)
    with pytest.raises(ValueError, match="sample_weight"):
        loss(labels, logits, sample_weight=np.ones((2, 5, 2), "float32"))
    # A scalar weighs every token alike (Keras' losses take one).
    assert float(loss(labels, logits, sample_weight=2.0)) == pytest.approx(
        float(loss(labels, logits)), rel=1e-6)


@pytest.mark.parametrize("pad_id", [-1, VOCAB_SIZE, True, 1.5])
def test_a_pad_id_outside_the_vocabulary_is_refused(pad_id):
    # pad_id=-1 (Keras' `ignore_class` habit) masked the last class in the loss while its
    # hand-written gradient smoothed it: gradients 0.011 off, nothing said.
    labels, logits = _batch()
    with pytest.raises(ValueError, match="pad_id"):
        MaskedSparseCategoricalCrossentropy(pad_id=pad_id)(labels, logits)


def test_a_computation_dtype_other_than_float32_is_refused_when_made():
    # `dtype="bfloat16"` was documented as the computation's dtype and failed at the first
    # batch ("cannot compute Mul ... expected float").
    with pytest.raises(ValueError, match="float32"):
        MaskedSparseCategoricalCrossentropy(dtype="bfloat16")
    MaskedSparseCategoricalCrossentropy(dtype="float32")
    MaskedSparseCategoricalCrossentropy(from_logits=False, dtype="float64")  # as before
    # A policy object had passed the check and failed at the first batch the same way.
    for policy in (keras.DTypePolicy("bfloat16"), keras.DTypePolicy("mixed_bfloat16")):
        with pytest.raises(ValueError, match="float32"):
            MaskedSparseCategoricalCrossentropy(dtype=policy)
    MaskedSparseCategoricalCrossentropy(dtype=keras.DTypePolicy("float32"))
    # Policy names, as Keras' own losses take them.
    MaskedSparseCategoricalCrossentropy(from_logits=False, dtype="mixed_float16")
    with pytest.raises(ValueError, match="float32"):
        MaskedSparseCategoricalCrossentropy(dtype="mixed_float16")


def test_two_classes_with_padding_leave_no_class_for_the_smoothing():
    # A vocabulary of padding and one class: the smoothing mass was divided by 0 (a NaN
    # loss at label_smoothing 0.1, a NaN gradient at 0).
    logits = tf.constant([[[0.3, -0.2], [0.1, 0.4]]])
    labels = tf.constant([[1, 1]])
    with pytest.raises(ValueError, match="label_smoothing"):
        smoothed_cross_entropy_from_logits(labels, logits, 0.1, pad_id=0)
    with tf.GradientTape() as tape:
        tape.watch(logits)
        loss = tf.reduce_sum(smoothed_cross_entropy_from_logits(labels, logits, 0.0, pad_id=0))
    assert np.isfinite(loss.numpy()) and np.all(np.isfinite(tape.gradient(loss, logits)))

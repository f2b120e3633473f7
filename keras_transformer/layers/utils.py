"""Small helpers shared by the layers."""


def clone_initializer(initializer):
    """A fresh initializer with the same config, so sublayers never share one instance."""
    return initializer.__class__.from_config(initializer.get_config())


def sublayer_connection(inputs, sublayer, norm, dropout, norm_first, training=None):
    """Residual connection, dropout and layer norm around one sub-layer.

    Post-norm (the paper, `norm_first=False`): `norm(x + dropout(sublayer(x)))`.
    Pre-norm (`norm_first=True`): `x + dropout(sublayer(norm(x)))`.

    Args:
        inputs: `(B, T, d_model)`.
        sublayer: callable on `(B, T, d_model)` returning `outputs` or a tuple whose first
            element is `outputs` (the rest, such as attention scores or a cache, is passed back).
        norm: the `LayerNormalization` of this sub-layer.
        dropout: the `Dropout` layer applied to the sub-layer output.
        norm_first: bool, pre-norm instead of post-norm.
        training: bool, whether dropout is active.

    Returns:
        `(outputs, extras)` where `extras` is the tuple of what the sub-layer returned after
        its outputs (empty for a single output).
    """
    result = sublayer(norm(inputs) if norm_first else inputs)
    outputs, extras = (result[0], tuple(result[1:])) if isinstance(result, tuple) else (result, ())
    outputs = inputs + dropout(outputs, training=training)
    return (outputs if norm_first else norm(outputs)), extras

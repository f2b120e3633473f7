"""Training-step throughput of our Transformer against the same-shape keras-hub model.

Both models are built in one process with the same shape: a shared vocabulary, one tied
embedding matrix (source, target and output projection), learned positions, `--layers`
encoder and decoder blocks of width `--d-model`, `--heads` heads, `--ff-dim` feed-forward
width, ReLU, post-norm, layer-norm epsilon 1e-5 and the same dropout. keras-hub's model is
`TokenAndPositionEmbedding` + `TransformerEncoder` x N + `TransformerDecoder` x N + the
embedding's reverse projection; ours is `build_transformer`. Both are compiled the same
way (Adam, sparse cross-entropy from logits ignoring padding) and train on identical
batches, alternating steps (the order flips every step), so a busy machine slows both
alike. The figure is real (non-padding) source + target tokens per second of
`train_on_batch`, after warm-up steps; the ratio is ours / keras-hub.

    .venv/bin/python benchmarks/train_vs_keras_hub.py                  # 3+3 layers, d 256
    .venv/bin/python benchmarks/train_vs_keras_hub.py --jit-compile true   # both under XLA
    .venv/bin/python benchmarks/train_vs_keras_hub.py --steps 3 --warmup 1 --d-model 32 \
        --ff-dim 64 --layers 1 --vocab-size 100                        # a quick check

Needs the `bench` extra (keras-hub). Time it on an otherwise idle machine.
"""

import argparse
import os
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# keras-hub's attention passes its Keras-masked inputs to EinsumDense, which warns once per
# layer that it drops the mask (the blocks use the mask before that, so nothing is lost).
warnings.filterwarnings("ignore", message=".*does not support masking.*")

import keras  # noqa: E402
import numpy as np  # noqa: E402

# Padding id of both models' inputs and of the labels (ignored by the loss).
PAD_ID = 0
# keras-hub's default layer-norm epsilon; ours is set to match.
LAYER_NORM_EPSILON = 1e-5
# The shortest sequence drawn for a batch row (a start or end token and one word).
MIN_LENGTH = 2


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=3, help="encoder and decoder blocks each")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ff-dim", type=int, default=1024)
    parser.add_argument("--vocab-size", type=int, default=8000,
                        help="shared vocabulary (the multi30k preset's size)")
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--length", type=int, default=32,
                        help="padded length of source and target batches")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per model")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per model first")
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--loss", choices=("same", "own"), default="same",
        help="same: both models use keras' SparseCategoricalCrossentropy(ignore_class=0), "
        "which compares the layers alone; own: ours trains with the loss our recipes use, "
        "MaskedSparseCategoricalCrossentropy(label_smoothing=0.1), keras-hub's keeps keras' "
        "(which has no label smoothing, so it does less work)")
    parser.add_argument(
        "--optimizer", choices=("same", "own"), default="same",
        help="same: both models use keras' Adam; own: ours uses the package's FusedAdam (one "
        "fused update kernel per variable, what `make_optimizer` gives our recipes), "
        "keras-hub's keeps keras' Adam")
    parser.add_argument(
        "--jit-compile", choices=("false", "true"), default="false",
        help="model.compile(jit_compile=...) for both models: true compiles each training step "
        "with XLA (the batches have one fixed shape, so it compiles once); false is what "
        "Keras' 'auto' gives on a CPU-only machine")
    parser.add_argument(
        "--skip-padding", action="store_true",
        help="ours with skip_padding=True: its stacks' per-token work on the real tokens only "
        "(keras-hub's computes every position); no XLA for ours then")
    return parser.parse_args(argv)


def make_batches(args, count):
    """`count` identical-for-both batches of random tokens, each row padded after its length.

    Returns:
        A list of `(inputs, labels)`: `inputs` a dict of int32 `(batch, length)` arrays,
        `labels` int32 `(batch, length)` (the decoder tokens shifted left).
    """
    rng = np.random.default_rng(args.seed)
    shape = (args.batch_size, args.length)
    positions = np.arange(args.length)[None, :]
    batches = []
    for _ in range(count):
        tokens = {}
        for name in ("encoder_tokens", "target"):
            lengths = rng.integers(MIN_LENGTH, args.length + 1, size=(args.batch_size, 1))
            ids = rng.integers(PAD_ID + 1, args.vocab_size, size=shape)
            tokens[name] = np.where(positions < lengths, ids, PAD_ID).astype("int32")
        target = tokens.pop("target")
        # The next target token at each position (teacher forcing), padding after the end.
        labels = np.concatenate([target[:, 1:], np.full((args.batch_size, 1), PAD_ID)], 1)
        labels = labels.astype("int32")
        inputs = {"encoder_tokens": tokens["encoder_tokens"], "decoder_tokens": target}
        batches.append((inputs, labels))
    return batches


def build_ours(args):
    from keras_transformer import build_transformer

    return build_transformer(
        vocab_size=args.vocab_size,
        d_model=args.d_model,
        num_heads=args.heads,
        ff_dim=args.ff_dim,
        num_layers=args.layers,
        dropout=args.dropout,
        tie_embeddings=True,
        learned_positions=True,
        max_length=args.length,
        layer_norm_epsilon=LAYER_NORM_EPSILON,
        skip_padding=args.skip_padding,
        name="keras_transformer",
    )


def build_keras_hub(args):
    import keras_hub

    encoder_tokens = keras.Input(shape=(None,), dtype="int32", name="encoder_tokens")
    decoder_tokens = keras.Input(shape=(None,), dtype="int32", name="decoder_tokens")
    # One tied embedding for source, target and the output projection, as in ours.
    embedding = keras_hub.layers.TokenAndPositionEmbedding(
        vocabulary_size=args.vocab_size,
        sequence_length=args.length,
        embedding_dim=args.d_model,
        tie_weights=True,
        mask_zero=True,
        name="embedding",
    )
    block_kwargs = dict(
        intermediate_dim=args.ff_dim,
        num_heads=args.heads,
        dropout=args.dropout,
        layer_norm_epsilon=LAYER_NORM_EPSILON,
    )
    memory = keras.layers.Dropout(args.dropout)(embedding(encoder_tokens))
    for index in range(args.layers):
        memory = keras_hub.layers.TransformerEncoder(name=f"encoder_{index}", **block_kwargs)(
            memory
        )
    hidden = keras.layers.Dropout(args.dropout)(embedding(decoder_tokens))
    for index in range(args.layers):
        hidden = keras_hub.layers.TransformerDecoder(name=f"decoder_{index}", **block_kwargs)(
            hidden, memory
        )
    logits = embedding.token_embedding(hidden, reverse=True)
    logits = keras.layers.Activation("linear", dtype="float32", name="logits")(logits)
    return keras.Model(
        {"encoder_tokens": encoder_tokens, "decoder_tokens": decoder_tokens},
        logits,
        name="keras_hub",
    )


def compile_model(model, args, own_loss=False, own_optimizer=False):
    if own_loss:
        from keras_transformer.training.losses import MaskedSparseCategoricalCrossentropy

        loss = MaskedSparseCategoricalCrossentropy(label_smoothing=0.1, pad_id=PAD_ID)
    else:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=PAD_ID)
    if own_optimizer:
        from keras_transformer.training.optimizers import FusedAdam

        optimizer = FusedAdam(args.learning_rate)
    else:
        optimizer = keras.optimizers.Adam(args.learning_rate)
    model.compile(optimizer=optimizer, loss=loss,
                  jit_compile=args.jit_compile == "true")
    return model


def real_tokens(inputs, labels):
    """Non-padding source and target tokens of a batch (the figure's numerator)."""
    return int(np.count_nonzero(inputs["encoder_tokens"])) + int(np.count_nonzero(labels))


def run(args):
    keras.utils.set_random_seed(args.seed)
    models = {"keras_transformer": build_ours(args), "keras_hub": build_keras_hub(args)}
    for name, model in models.items():
        ours = name == "keras_transformer"
        compile_model(model, args, own_loss=args.loss == "own" and ours,
                      own_optimizer=args.optimizer == "own" and ours)
    batches = make_batches(args, args.warmup + args.steps)
    seconds = dict.fromkeys(models, 0.0)
    tokens = positions = 0
    names = list(models)
    for step, (inputs, labels) in enumerate(batches):
        timed = step >= args.warmup
        # Alternate which model goes first, so neither always runs after the other.
        for name in names if step % 2 == 0 else names[::-1]:
            started = time.perf_counter()
            models[name].train_on_batch(inputs, labels)  # returns the loss: the step is done
            if timed:
                seconds[name] += time.perf_counter() - started
        if timed:
            tokens += real_tokens(inputs, labels)
            positions += inputs["encoder_tokens"].size + labels.size
    return {
        name: {
            "optimizer": type(models[name].optimizer).__name__,
            "parameters": models[name].count_params(),
            "tokens_per_second": tokens / seconds[name],
            "jit_compile": models[name].jit_compile,
            "padding": 1 - tokens / positions,
        }
        for name in models
    }


def main(argv=None):
    args = parse_args(argv)
    results = run(args)
    xla = ", ".join(f"{name} {row['jit_compile']}" for name, row in results.items())
    print(
        f"{args.layers}+{args.layers} layers, d_model {args.d_model}, {args.heads} heads, "
        f"ff {args.ff_dim}, vocab {args.vocab_size}, batches {args.batch_size}x{args.length} "
        f"({results['keras_hub']['padding']:.0%} padding), "
        f"{args.steps} timed steps after {args.warmup} warm-up steps, loss: {args.loss}, "
        f"optimizer: {args.optimizer}, XLA: {xla}, ours skips padding: "
        f"{'yes' if args.skip_padding else 'no'}"
    )
    print("| model | optimizer | parameters | real tokens/s (src+tgt) |")
    print("|---|---|---|---|")
    for name, row in results.items():
        print(f"| {name} | {row['optimizer']} | {row['parameters']:,} "
              f"| {row['tokens_per_second']:,.0f} |")
    ratio = (results["keras_transformer"]["tokens_per_second"]
             / results["keras_hub"]["tokens_per_second"])
    print(f"ratio keras_transformer / keras_hub: {ratio:.2f}x")


if __name__ == "__main__":
    main()

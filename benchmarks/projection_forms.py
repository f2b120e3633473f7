"""Which TensorFlow form of a decoding step's projection is fastest for a few rows?

A beam-4 step at batch 1 multiplies 4 rows by each of the decoder's kernels; those products
cost about twice greedy's 1-row ones (benchmarks/RESULTS.md, session 52). Here a chain of
`--layers` products `(rows, 256) @ (256, 768) + bias` (each followed by a slice back to 256
columns and a scale, so the chain continues) runs `--steps` times in a `tf.while_loop`, as
the step does, in each of these forms:

- `fused`: `MatMul` + `BiasAdd` (the decoder's form: `_MklNativeFusedMatMul` with oneDNN);
- `matmul_add`: `MatMul` + `AddV2`;
- `transposed`: the transposed kernel times the rows' transpose, transposed back;
- `kernel_t`: `MatMul(transpose_b=True)` on a kernel stored transposed;
- `batch`: `BatchMatMulV2` with a batch axis of 1; `einsum`: `Einsum`;
- `bmm3`: `BatchMatMulV3` on 2-D operands; `sparse`: `SparseMatMul` (Eigen, never oneDNN).

Printed: microseconds per chained layer (product, bias, slice and scale), median of the
alternating repetitions. The machine may be shared: read the forms against each other.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/projection_forms.py --rows 1,4,8,128
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

FORMS = ("fused", "matmul_add", "transposed", "kernel_t", "batch", "einsum", "bmm3", "sparse")
WIDTH, OUTPUTS = 256, 768  # d_model, the fused self-attention Q/K/V projection


def project(form, x, kernel, kernel_t, bias):
    """`x @ kernel + bias` in `form`."""
    if form == "fused":
        return tf.nn.bias_add(tf.matmul(x, kernel), bias)
    if form == "matmul_add":
        return tf.matmul(x, kernel) + bias
    if form == "transposed":
        return tf.transpose(tf.matmul(kernel_t, x, transpose_b=True)) + bias
    if form == "kernel_t":
        return tf.nn.bias_add(tf.matmul(x, kernel_t, transpose_b=True), bias)
    if form == "batch":
        return tf.linalg.matmul(x[None], kernel[None])[0] + bias
    if form == "einsum":
        return tf.einsum("nd,do->no", x, kernel) + bias
    if form == "bmm3":
        return tf.raw_ops.BatchMatMulV3(x=x, y=kernel, Tout=tf.float32) + bias
    if form == "sparse":
        return tf.raw_ops.SparseMatMul(a=x, b=kernel) + bias
    raise ValueError(f"unknown form {form!r}")


def chain(form, kernels, biases, steps):
    """A traced function: `steps` loop iterations of the chained projections."""
    transposed = [tf.transpose(kernel) for kernel in kernels]

    @tf.function
    def run(x):
        def body(i, x):
            for kernel, kernel_t, bias in zip(kernels, transposed, biases):
                x = project(form, x, kernel, kernel_t, bias)[:, :WIDTH] * 0.5
            return i + 1, x

        return tf.while_loop(lambda i, x: i < steps, body, (0, x))[1]

    return run


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,4,8,128", help="comma-separated row counts")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--forms", default=",".join(FORMS))
    args = parser.parse_args(argv)
    forms = args.forms.split(",")
    unknown = [form for form in forms if form not in FORMS]
    if unknown:
        raise SystemExit(f"unknown form(s) {', '.join(unknown)}: choose among "
                         f"{', '.join(FORMS)}")
    rng = np.random.default_rng(0)
    kernels = [tf.constant(rng.standard_normal((WIDTH, OUTPUTS)).astype("float32") * 0.05)
               for _ in range(args.layers)]
    biases = [tf.constant(rng.standard_normal((OUTPUTS,)).astype("float32"))
              for _ in range(args.layers)]
    print("| rows | " + " | ".join(forms) + " |")
    print("|---" * (len(forms) + 1) + "|")
    for rows in (int(r) for r in args.rows.split(",")):
        x = tf.constant(rng.standard_normal((rows, WIDTH)).astype("float32"))
        runs = {form: chain(form, kernels, biases, args.steps) for form in forms}
        expected = x.numpy() @ kernels[0].numpy() + biases[0].numpy()
        for form in forms:  # every form times the same product: each checked on its own
            got = project(form, x, kernels[0], tf.transpose(kernels[0]), biases[0]).numpy()
            if not np.allclose(got, expected, rtol=1e-4, atol=1e-3):
                raise SystemExit(f"{form} computes another product than x @ kernel + bias")
        for run in runs.values():
            run(x)  # trace and warm up
        times = {form: [] for form in forms}
        for _ in range(args.repeats):
            for form, run in runs.items():
                start = time.perf_counter()
                run(x).numpy()
                times[form].append(time.perf_counter() - start)
        per_layer = {form: np.median(t) / (args.steps * args.layers) * 1e6
                     for form, t in times.items()}
        print(f"| {rows} | " + " | ".join(f"{per_layer[f]:.1f} us" for f in forms) + " |",
              flush=True)


if __name__ == "__main__":
    main()

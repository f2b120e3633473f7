"""Could int8 matrix products speed up decoding? TensorFlow's quantized MatMul ops against
float32 MatMul on the decoding step's shapes, one thread.

CTranslate2's int8 mode is 1.6x its float32 (issue 10's table). TensorFlow's core int8
product that a stock model server links in is `QuantizedMatMul` (Eigen/gemmlowp, `quint8` x
`quint8`). Each timed function runs `--chain` products of one shape in a graph (the
activations quantized per call with their own min/max, as a decoding step would have to; the
weights quantized once), against the same chain of float32 `MatMul`s with the weights in a
variable. (The oneDNN `QuantizedMatMulWithBias` op, called directly with `quint8`
activations and `qint8` weights, gave products uncorrelated with the float32 ones here: it
is meant for Intel's graph-rewriting quantization tools, and is not timed.)

    PYTHONPATH=$PWD .venv/bin/python benchmarks/int8_matmul.py
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

# (rows, inner, outputs): greedy batch 32 and beam 4 x 32 rows; the vocabulary projection,
# the feed-forward layer's two products.
SHAPES = ((32, 256, 8000), (32, 256, 1024), (32, 1024, 256), (128, 256, 8000),
          (128, 256, 1024))


def _median_ms(function, argument, repeats):
    function(argument)  # trace
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function(argument)
        times.append(time.perf_counter() - start)
    return 1000 * float(np.median(times))


def _quantized_weights(weights, dtype, mode):
    limit = float(np.abs(weights).max())
    return tf.quantization.quantize(weights, -limit, limit, dtype, mode=mode)


def chains(weights, chain):
    """`{name: tf.function}`: `chain` products `x @ weights` two ways."""
    float_kernel = tf.Variable(weights)
    eigen_kernel, eigen_min, eigen_max = _quantized_weights(weights, tf.quint8, "MIN_FIRST")

    def quantized_rows(x):
        return tf.quantization.quantize(x, tf.reduce_min(x), tf.reduce_max(x), tf.quint8,
                                        mode="MIN_FIRST")

    @tf.function
    def float32(x):
        return tf.stack([tf.matmul(x + float(i), float_kernel) for i in range(chain)])

    @tf.function
    def quantized_eigen(x):
        outputs = []
        for i in range(chain):
            rows, low, high = quantized_rows(x + float(i))
            product, product_min, product_max = tf.raw_ops.QuantizedMatMul(
                a=rows, b=eigen_kernel, min_a=low, max_a=high, min_b=eigen_min,
                max_b=eigen_max, Toutput=tf.qint32)
            outputs.append(tf.quantization.dequantize(product, product_min, product_max,
                                                      mode="MIN_FIRST"))
        return tf.stack(outputs)

    return {"float32 MatMul": float32, "QuantizedMatMul (Eigen)": quantized_eigen}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chain", type=int, default=20, help="products per timed call")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES),
                        help="rowsxinnerxoutputs,...")
    args = parser.parse_args(argv)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:  # called in a process whose TensorFlow already runs (a test)
        print("TensorFlow was already initialized: its thread settings are kept.")
    rng = np.random.default_rng(0)
    print("| rows x inner x outputs | float32 ms (GFLOP/s) | QuantizedMatMul ms (speed-up) "
          "| int8 max abs error / max abs |")
    print("|---|---|---|---|")
    for shape in args.shapes.split(","):
        rows, inner, outputs = map(int, shape.split("x"))
        x = tf.constant(rng.standard_normal((rows, inner)), tf.float32)
        weights = (rng.standard_normal((inner, outputs)) * 0.05).astype("float32")
        functions = chains(weights, args.chain)
        times = {name: _median_ms(f, x, args.repeats) for name, f in functions.items()}
        exact = functions["float32 MatMul"](x).numpy()
        error = np.abs(functions["QuantizedMatMul (Eigen)"](x).numpy() - exact).max()
        base = times["float32 MatMul"]
        gflops = 2 * rows * inner * outputs * args.chain / base / 1e6
        eigen = times["QuantizedMatMul (Eigen)"]
        print(f"| {rows} x {inner} x {outputs} | {base:.2f} ({gflops:.0f}) | {eigen:.2f} "
              f"({base / eigen:.2f}x) | {error / np.abs(exact).max():.4f} |", flush=True)


if __name__ == "__main__":
    main()

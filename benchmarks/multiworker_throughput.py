"""Multi-worker training throughput on loopback: one worker vs two, one core each.

Starts 1, then 2, worker processes on 127.0.0.1 (MultiWorkerMirroredStrategy for 2, each
pinned to its own core and limited to one TensorFlow thread), trains a preset's model with
`model.fit` on synthetic token batches of a fixed per-worker shape (so the global batch
grows with the workers: weak scaling), and prints:

- tokens/s of all workers together and the step time, for 1 and 2 workers;
- the gradient bytes all-reduced per step (float32 gradients of every trainable variable)
  and what a ring all-reduce sends per worker per step, 2 (N - 1) / N of that: divide it by
  a network's bandwidth and compare with the step time to predict real machines.

    .venv/bin/python benchmarks/multiworker_throughput.py --preset quick --steps 30
    .venv/bin/python benchmarks/multiworker_throughput.py --preset tiny --steps 3 --warmup 1  # smoke

Run it alone on a quiet machine: both workers share this machine's cores.
"""

import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Bytes of one float32 gradient value.
_FLOAT32_BYTES = 4


def worker(args):
    """One worker: train `args.steps` steps after `args.warmup`, print a RESULT line (chief)."""
    if hasattr(os, "sched_setaffinity") and os.cpu_count():
        os.sched_setaffinity(0, {args.index % os.cpu_count()})
    from keras_transformer.training.strategy import select_strategy

    strategy = select_strategy("multi_worker" if args.workers > 1 else "default")

    import keras
    import numpy as np
    import tensorflow as tf

    from keras_transformer.model import build_transformer
    from keras_transformer.training import get_preset
    from keras_transformer.training.trainer import build_from_spec, compile_model

    config = get_preset(args.preset)
    keras.utils.set_random_seed(config.seed)
    vocab = config.vocab_size
    rng = np.random.default_rng(args.index)
    global_batch = args.batch_size * args.workers
    shape = (global_batch, args.length)
    inputs = {"encoder_tokens": rng.integers(4, vocab, shape).astype("int32"),
              "decoder_tokens": rng.integers(4, vocab, shape).astype("int32")}
    labels = rng.integers(4, vocab, shape).astype("int32")
    dataset = tf.data.Dataset.from_tensors((inputs, labels)).repeat()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = dataset.with_options(options)
    with strategy.scope():
        model = build_transformer(
            vocab_size=vocab, d_model=config.d_model, num_heads=config.num_heads,
            ff_dim=config.ff_dim, num_layers=config.num_layers,
            num_decoder_layers=config.num_decoder_layers, dropout=config.dropout,
            max_length=max(config.max_length, args.length))
        # Its two fits are the run a cooldown (`lr_cooldown`) would end.
        compile_model(model, config, total_steps=args.warmup + args.steps)
        build_from_spec(model, dataset.element_spec)
    model.fit(dataset, epochs=1, steps_per_epoch=args.warmup, verbose=0)
    started = time.time()
    model.fit(dataset, epochs=1, steps_per_epoch=args.steps, verbose=0)
    seconds = time.time() - started
    gradient_bytes = sum(int(np.prod(v.shape)) for v in model.trainable_variables) * _FLOAT32_BYTES
    if args.index == 0:
        tokens = 2 * global_batch * args.length * args.steps  # encoder + decoder tokens
        print("RESULT " + json.dumps({
            "workers": args.workers, "tokens_per_second": tokens / seconds,
            "step_seconds": seconds / args.steps, "gradient_bytes": gradient_bytes,
            "ring_bytes_per_worker": 2 * (args.workers - 1) / args.workers * gradient_bytes,
        }), flush=True)


def run_cluster(args, workers):
    """Starts `workers` processes of this script and returns the chief's RESULT."""
    from keras_transformer.training.launcher import free_ports, stop_processes
    from keras_transformer.training.strategy import make_tf_config

    addresses = [f"127.0.0.1:{p}" for p in free_ports(workers)]
    processes = []
    try:
        for index in range(workers):
            env = dict(os.environ, TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1")
            env.pop("TF_CONFIG", None)
            if workers > 1:
                env["TF_CONFIG"] = make_tf_config(addresses, index)
            command = [sys.executable, __file__, "--worker", "--index", str(index),
                       "--workers", str(workers), "--preset", args.preset,
                       "--steps", str(args.steps), "--warmup", str(args.warmup),
                       "--batch-size", str(args.batch_size), "--length", str(args.length)]
            processes.append(subprocess.Popen(
                command, env=env, text=True, stdout=subprocess.PIPE if index == 0 else
                subprocess.DEVNULL))
        out, _ = processes[0].communicate(timeout=args.timeout)
        for process in processes[1:]:
            process.wait(timeout=args.timeout)
        if any(p.returncode for p in processes):
            raise SystemExit(f"A worker failed: exit codes {[p.returncode for p in processes]}")
    finally:
        stop_processes(processes)
    line = next(l for l in out.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="quick")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per worker")
    parser.add_argument("--length", type=int, default=24, help="tokens per sentence")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    results = [run_cluster(args, workers) for workers in (1, 2)]
    print(f"| workers | tokens/s | step time | gradient bytes/step | ring bytes sent per "
          f"worker/step |  (preset {args.preset}, {args.batch_size}x{args.length} tokens per "
          "worker and side, loopback, 1 core per worker)")
    print("|---|---|---|---|---|")
    for result in results:
        print(f"| {result['workers']} | {result['tokens_per_second']:,.0f} | "
              f"{result['step_seconds'] * 1000:.0f} ms | {result['gradient_bytes'] / 1e6:.3f} MB"
              f" | {result['ring_bytes_per_worker'] / 1e6:.3f} MB |")
    speedup = results[1]["tokens_per_second"] / results[0]["tokens_per_second"]
    print(f"Two workers: {speedup:.2f}x the tokens/s of one. On real machines a step must also "
          f"carry {results[1]['ring_bytes_per_worker'] / 1e6:.3f} MB per worker over the "
          "network: at 10 Gbit/s (1.25 GB/s) that is "
          f"{results[1]['ring_bytes_per_worker'] / 1.25e9 * 1000:.1f} ms per step.")


if __name__ == "__main__":
    main()

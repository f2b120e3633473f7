"""Where a training step's time goes: TensorFlow op time per op type of `train_on_batch`.

Builds a preset's model on the Multi30K training pipeline (as `train_throughput.py` does),
takes `--warmup` steps, then traces `--steps` steps with TensorFlow's profiler and sums the
time of every op the executor ran, by op type. Prints the wall time per step, the summed op
time per step (more than the wall time when ops run side by side on the inter-op threads,
each of them possibly parallel inside), the ops per step and a Markdown table for
benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/profile_train_step.py --preset multi30k --precision auto
    .venv/bin/python benchmarks/profile_train_step.py --preset tiny --steps 3 --warmup 1

Time it on an otherwise idle machine.
"""

import argparse
import collections
import glob
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The preset's model and pipeline are built as train_throughput.py builds them.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Profiler events that wrap the ops of a step (the executor's work items, thread-pool
# bookkeeping, memory events), not ops themselves.
NOT_OPS = frozenset({
    "ExecutorState::Process", "ExecutorDoneCallback", "ParallelFor", "MemoryAllocation",
    "MemoryDeallocation", "ThreadpoolListener::StartRegion", "ThreadpoolListener::StopRegion",
    "ThreadpoolListener::Record",
})
# The profiler's threads that run a step's ops (`tf_Compute/...`); others are Python's or
# the intra-op pool's (whose events are bookkeeping only).
COMPUTE_THREAD_PREFIX = "tf_Compute"


def op_times(xspace):
    """`{op type: (total microseconds, count)}` over the compute threads of a trace."""
    totals = collections.defaultdict(lambda: [0.0, 0])
    for plane in xspace.planes:
        names = {key: meta.display_name or meta.name
                 for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            if not line.name.startswith(COMPUTE_THREAD_PREFIX):
                continue
            for event in line.events:
                name = names[event.metadata_id]
                if name in NOT_OPS:
                    continue
                op_type = name.rsplit(":", 1)[-1]  # "node:Type" or just "Type"
                totals[op_type][0] += event.duration_ps / 1e6
                totals[op_type][1] += 1
    return {op_type: tuple(value) for op_type, value in totals.items()}


def read_trace(log_dir):
    """The `XSpace` proto the profiler wrote under `log_dir`."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    paths = glob.glob(os.path.join(log_dir, "**", "*.xplane.pb"), recursive=True)
    if len(paths) != 1:
        raise RuntimeError(f"Expected one profiler trace under {log_dir}, found {paths}")
    xspace = xplane_pb2.XSpace()
    with open(paths[0], "rb") as file:
        xspace.ParseFromString(file.read())
    return xspace


def profile(preset, precision, steps, warmup, overrides=()):
    """`{"wall_ms", "ops": {type: (ms per step, ops per step)}, ...}` of `steps` traced steps."""
    import tensorflow as tf

    from train_throughput import preset_model

    with preset_model(preset, precision, warmup + steps, overrides) as (
            model, train_ds, policy, overrides), tempfile.TemporaryDirectory() as tmp:
        iterator = iter(train_ds.repeat())
        batches = [next(iterator) for _ in range(warmup + steps)]  # the pipeline untimed
        for inputs, labels in batches[:warmup]:
            model.train_on_batch(inputs, labels)
        log_dir = os.path.join(tmp, "trace")
        tf.profiler.experimental.start(log_dir)
        started = time.perf_counter()
        for inputs, labels in batches[warmup:]:
            model.train_on_batch(inputs, labels)
        wall = time.perf_counter() - started
        tf.profiler.experimental.stop()
        totals = op_times(read_trace(log_dir))
    return {
        "preset": preset, "precision": policy or "float32", "steps": steps,
        "overrides": overrides, "wall_ms": 1000 * wall / steps,
        "ops": {op_type: (micros / 1000 / steps, count / steps)
                for op_type, (micros, count) in totals.items()},
    }


def print_profile(result, top):
    ops = sorted(result["ops"].items(), key=lambda item: -item[1][0])
    total = sum(ms for ms, _ in result["ops"].values())
    count = sum(n for _, n in result["ops"].values())
    overrides = " ".join(f"{k}={v}" for k, v in result["overrides"].items()) or "-"
    print(f"preset {result['preset']} ({overrides}), {result['precision']}, "
          f"{result['steps']} traced steps: wall {result['wall_ms']:.1f} ms per step, "
          f"op time {total:.1f} ms per step, {count:.0f} ops per step")
    print("| op type | ms per step | share of op time | ops per step |")
    print("|---|---|---|---|")
    for op_type, (ms, n) in ops[:top]:
        print(f"| {op_type} | {ms:.2f} | {100 * ms / total:.1f}% | {n:.0f} |")
    rest = ops[top:]
    if rest:
        ms = sum(value[0] for _, value in rest)
        n = sum(value[1] for _, value in rest)
        print(f"| {len(rest)} other types | {ms:.2f} | {100 * ms / total:.1f}% | {n:.0f} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="multi30k")
    parser.add_argument("--precision", default="auto",
                        help="float32, mixed_bfloat16, ... or auto (this machine's choice)")
    parser.add_argument("--steps", type=int, default=20, help="traced steps")
    parser.add_argument("--warmup", type=int, default=5, help="untraced steps first")
    parser.add_argument("--top", type=int, default=25, help="op types listed")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a TrainingConfig field of the preset (repeatable)")
    args = parser.parse_args(argv)
    precision = None if args.precision == "float32" else args.precision
    print_profile(profile(args.preset, precision, args.steps, args.warmup, args.set), args.top)


if __name__ == "__main__":
    main()

"""The loss, its gradients and the logged values do not depend on how the batch is split."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

_SCRIPT = os.path.join(os.path.dirname(__file__), "distributed_step.py")


@pytest.fixture(scope="module", params=[("stand_in", "sgd"), ("transformer", "sgd"),
                                        ("transformer", "fused_adam")],
                ids=["stand_in", "transformer", "transformer-fused_adam"])
def results(request):
    """Runs `distributed_step.py` in a fresh process (it splits the CPU before TF starts),
    with the stand-in model and with the real `build_transformer` model, updated by SGD
    (the update is the gradient) or by the package's `FusedAdam`."""
    completed = subprocess.run(
        [sys.executable, _SCRIPT, *request.param], capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    line = next(l for l in completed.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def _assert_weights_close(a, b):
    for wa, wb in zip(a, b, strict=True):
        np.testing.assert_allclose(np.array(wa), np.array(wb), rtol=1e-5, atol=1e-6)


def _max_weight_difference(a, b):
    return max(np.max(np.abs(np.array(wa) - np.array(wb))) for wa, wb in zip(a, b))


def test_mirrored_step_equals_single_device_step(results):
    default, mirrored = results["default"], results["mirrored"]
    _assert_weights_close(mirrored["weights"], default["weights"])
    # `get_weights` reads one replica: the update must have reached the other one too.
    assert mirrored["replicas_agree"]


def test_mirrored_logs_report_global_token_means(results):
    default, mirrored = results["default"], results["mirrored"]
    for key in ("loss", "batch_loss", "accuracy", "batch_accuracy"):
        np.testing.assert_allclose(mirrored[key], default[key], rtol=1e-5, err_msg=key)


def test_naive_mean_of_means_would_differ(results):
    """The batch is built so a per-replica mean is wrong: proves the test above can fail."""
    if results["optimizer"] != "sgd":
        pytest.skip("Adam's first step is about lr * sign(gradient): a wrong gradient scale "
                    "hardly shows in the weights")
    default, naive = results["default"], results["naive_mirrored"]
    assert abs(naive["batch_loss"] - default["batch_loss"]) > 1e-2
    assert _max_weight_difference(naive["weights"], default["weights"]) > 1e-2

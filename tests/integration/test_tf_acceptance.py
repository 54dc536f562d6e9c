"""Acceptance: the reference MLP experiment reaches >= 97% test accuracy within 2 epochs (full
MNIST)."""

from __future__ import annotations

import time

import pytest

from dualtrain.records.record import read_run
from testkit.tf_runs import ROOT, run_cli  # importing tf_runs skips this module without TF


# mirrored at world 2 is asserted by parity_tests/test_convergence.py (same spec, shared run)
@pytest.mark.parametrize("strategy", [pytest.param("multi_worker", marks=pytest.mark.slow)])
def test_mnist_mlp_world2_reaches_97(tmp_path, strategy):
    out = tmp_path / "run"
    t0 = time.monotonic()
    proc = run_cli(
        "run",
        "--backend",
        "tf",
        "--config",
        str(ROOT / "configs" / "mnist_mlp.yaml"),
        "--world-size",
        "2",
        "--set",
        f"tf.strategy={strategy}",
        "--out",
        str(out),
        timeout=900,
    )
    seconds = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = read_run(out).summary
    print(
        f"{strategy}: {seconds:.1f}s wall, {s['train_samples_per_s']:.0f} samples/s, "
        f"test accuracy {s['test_accuracy']:.4f}"
    )
    assert s["epochs_run"] == 2 and s["test_count"] == 10000 and s["samples"] == 120000
    assert s["test_accuracy"] >= 0.97

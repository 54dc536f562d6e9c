"""Acceptance: the reference config, full MNIST, 2 epochs, world 2, reaches >= 97% test accuracy."""

from __future__ import annotations

from tests.conftest import ROOT, run_cli
from dualtrain.record import read_run


def test_mnist_mlp_world2_converges(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("run", "--backend", "torch", "--config", str(ROOT / "configs" / "mnist_mlp.yaml"),
                   "--world-size", "2", "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr
    rec = read_run(out)
    s = rec.summary
    assert s["world_size"] == 2 and s["steps"] == 2 * 469 and s["test_count"] == 10000
    assert s["test_accuracy"] >= 0.97, s["test_accuracy"]
    assert "test accuracy" in proc.stdout

"""End to end: ``dualtrain compare --config`` runs torch, tf and the noise-floor twin, then reports."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from dualtrain.weights import load_weights
from tests.conftest import ROOT, run_cli

BACKENDS = all((ROOT / f"dualtrain/backends/{b}/worker.py").is_file() for b in ("torch", "tf"))
pytestmark = pytest.mark.skipif(not BACKENDS, reason="needs both backends in this checkout")


def test_compare_config_tiny(tmp_path):
    out = tmp_path / "cmp"
    res = run_cli("compare", "--config", str(ROOT / "configs/mnist_mlp.yaml"), "--world-size", "2",
                  "--set", "train.epochs=1", "--set", "data.train_limit=1280",
                  "--set", "data.test_limit=500", "--set", "distribution.timeout_s=60",
                  "--out", str(out), timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "verdict: PASS" in res.stdout
    for name in ("verdict.json", "report.md", "report.html", "twin_init.npz",
                 "torch/summary.json", "tf/summary.json", "twin/summary.json"):
        assert (out / name).is_file(), name
    v = json.loads((out / "verdict.json").read_text())
    assert v["runs"]["a"]["label"] == "torch" and v["runs"]["b"]["label"] == "tf"
    assert v["runs"]["twin"]["path"] == str(out / "twin")
    steps = json.loads((out / "torch/summary.json").read_text())["steps"]
    traj = next(c for c in v["checks"] if c["name"] == "trajectory")
    assert f"{steps} of {steps} steps" in traj["detail"]
    # the twin starts from torch's initial weights with exactly one element one ulp away
    w0, wt = load_weights(out / "torch/weights_init.npz"), load_weights(out / "twin_init.npz")
    changed = [(k, int(np.count_nonzero(w0[k] != wt[k]))) for k in w0 if np.any(w0[k] != wt[k])]
    assert len(changed) == 1 and changed[0][1] == 1
    k = changed[0][0]
    i = int(np.flatnonzero(w0[k] != wt[k])[0])
    assert wt[k].flat[i] == np.nextafter(w0[k].flat[i], np.float32(np.inf))
    twin_spec = yaml.safe_load((out / "twin/spec.yaml").read_text())
    assert twin_spec["model"]["init_from"] == str((out / "twin_init.npz").resolve())


def test_compare_config_refuses_a_used_out(tmp_path):
    out = tmp_path / "used"
    out.mkdir()
    (out / "something").write_text("x")
    res = run_cli("compare", "--config", str(ROOT / "configs/mnist_mlp.yaml"), "--out", str(out))
    assert res.returncode == 2
    assert "new or empty folder" in res.stderr and len(res.stderr.strip().splitlines()) == 1

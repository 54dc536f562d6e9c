"""End to end: ``dualtrain compare --config`` runs torch, tf and the fp64 reference pair, then reports."""

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
    assert "verdict: PASS" in res.stdout and "semantics checked against the fp64 reference" in res.stdout
    assert "compare run fp64-tf: tf fp64" in res.stdout  # progress: which run is running
    for name in ("verdict.json", "report.md", "report.html", "torch/summary.json", "tf/summary.json",
                 "fp64-torch/summary.json", "fp64-tf/summary.json"):
        assert (out / name).is_file(), name
    v = json.loads((out / "verdict.json").read_text())
    assert v["runs"]["a"]["label"] == "torch" and v["runs"]["b"]["label"] == "tf"
    assert v["runs"]["reference_b"]["path"] == str(out / "fp64-tf")
    steps = json.loads((out / "torch/summary.json").read_text())["steps"]
    checks = {c["name"]: c for c in v["checks"]}
    assert f"{steps} of {steps} steps" in checks["trajectory"]["detail"]
    # the reference pair is the same spec in float64, from the same float32 initial weights
    ref_spec = yaml.safe_load((out / "fp64-tf/spec.yaml").read_text())
    assert ref_spec["precision"]["dtype"] == "fp64"
    w0 = load_weights(out / "torch/weights_init.npz")
    for b in ("fp64-torch", "fp64-tf"):
        init = load_weights(out / b / "weights_init.npz")
        assert all(np.array_equal(w0[k], init[k]) for k in w0)
        final = load_weights(out / b / "weights_final.npz")
        assert {a.dtype for a in final.values()} == {np.dtype(np.float64)}
    # ... and agrees to rounding: far inside the bound, which is far inside fp32's own noise
    assert checks["reference_loss"]["value"] < 1e-13 and checks["reference_weights"]["value"] < 1e-13


def test_compare_config_reference_none(tmp_path):
    out = tmp_path / "cmp"
    res = run_cli("compare", "--config", str(ROOT / "configs/mnist_mlp.yaml"), "--world-size", "1",
                  "--set", "train.max_steps=3", "--set", "data.train_limit=640",
                  "--set", "data.test_limit=100", "--reference", "none", "--out", str(out), timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "semantics NOT checked" in res.stdout and "reference_loss" in res.stdout
    assert not (out / "fp64-torch").exists()
    v = json.loads((out / "verdict.json").read_text())
    assert v["semantics_checked"] is False
    assert any("semantic check did not run" in n for n in v["notes"])


def test_compare_config_refuses_a_used_out(tmp_path):
    out = tmp_path / "used"
    out.mkdir()
    (out / "something").write_text("x")
    res = run_cli("compare", "--config", str(ROOT / "configs/mnist_mlp.yaml"), "--out", str(out))
    assert res.returncode == 2
    assert "new or empty folder" in res.stderr and len(res.stderr.strip().splitlines()) == 1

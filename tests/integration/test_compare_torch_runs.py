"""``dualtrain compare`` on REAL short torch runs (2 gloo ranks) that differ on purpose, and on two
identical-spec runs, which must pass. Each run trains ~20 steps on 2,560 MNIST samples."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dualtrain.core.schedule import lr_at
from dualtrain.parity import compare_dirs
from dualtrain.parity import diagnose as D
from dualtrain.spec import load_spec
from testkit.cli import ROOT, require, run_cli

require("torch")

CONFIG = str(ROOT / "configs/mnist_mlp.yaml")
BASE = [
    "--world-size",
    "2",
    "--set",
    "train.epochs=1",
    "--set",
    "data.train_limit=2560",
    "--set",
    "data.test_limit=1000",
    "--set",
    "train.log_every=10",
    "--set",
    "distribution.timeout_s=60",
    "--set",
    "optimizer.schedule.name=constant",
]
VARIANTS = {
    "a": [],
    "a_again": [],
    "seed": ["--set", "seed=1"],
    "schedule": [
        "--set",
        "optimizer.schedule.name=step",
        "--set",
        "optimizer.schedule.step_size=7",
        "--set",
        "optimizer.schedule.gamma=0.5",
    ],
    "fp16": ["--precision", "fp16"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("torch_runs")

    def one(name: str) -> Path:
        res = run_cli(
            "run",
            "--backend",
            "torch",
            "--config",
            CONFIG,
            *BASE,
            *VARIANTS[name],
            "--out",
            str(root / name),
            timeout=180,
        )
        assert res.returncode == 0, res.stderr[-2000:]
        return root / name

    # Two at a time: a short run is mostly process start-up and rendezvous, which overlap well.
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(VARIANTS, pool.map(one, VARIANTS), strict=True))


def compare_cli(a: Path, b: Path, out: Path):
    res = run_cli("compare", str(a), str(b), "--out", str(out), timeout=120)
    path = out / "verdict.json"
    return res, (json.loads(path.read_text()) if path.is_file() else None)


def test_identical_specs_pass(runs, tmp_path):
    res, v = compare_cli(runs["a"], runs["a_again"], tmp_path / "r")
    assert res.returncode == 0, res.stdout + res.stderr
    assert v["passed"] and "verdict: PASS" in res.stdout
    # determinism: the same spec on the same backend reproduces every loss exactly
    from dualtrain.parity.readings import loss_diff
    from dualtrain.records.record import read_run

    _, diff = loss_diff(read_run(runs["a"]), read_run(runs["a_again"]))
    assert diff.size > 0 and (diff == 0).all()


def test_another_seed_fails_with_initial_weights_and_sample_ids(runs, tmp_path):
    res, v = compare_cli(runs["a"], runs["seed"], tmp_path / "r")
    assert res.returncode == 1, res.stdout + res.stderr
    d = v["diagnosis"]
    assert d["first_divergent_step"] == 1
    assert d["cause"] == D.INIT
    assert D.IDS in [c["name"] for c in d["causes"]]
    assert any(s["field"] == "seed" and not s["cosmetic"] for s in d["spec_differences"])
    assert "likely cause: different initial weights" in res.stdout


def test_another_lr_schedule_is_named_at_the_step_it_changes(runs, tmp_path):
    spec_a = load_spec(runs["a"] / "spec.yaml")
    spec_b = load_spec(runs["schedule"] / "spec.yaml")
    total = json.loads((runs["a"] / "summary.json").read_text())["steps"]
    first = next(
        k
        for k in range(1, total + 1)
        if lr_at(spec_a.optimizer, k - 1, total) != lr_at(spec_b.optimizer, k - 1, total)
    )
    assert first > 1  # the schedules agree at first: the step matters
    res, v = compare_cli(runs["a"], runs["schedule"], tmp_path / "r")
    assert res.returncode == 1
    d = v["diagnosis"]
    assert d["cause"] == D.LR
    assert d["first_divergent_step"] == first
    assert f"first divergent step {first}" in res.stdout
    # the losses are identical before the lr changes (same ids, weights, lr): the runs part there
    cmp = compare_dirs(runs["a"], runs["schedule"])
    assert cmp.check("sharding").passed and cmp.check("init_weights").passed
    from dualtrain.parity.readings import loss_diff

    steps, diff = loss_diff(cmp.a, cmp.b)
    assert (diff[steps <= first] == 0).all() and (diff[steps > first] > 0).any()


def test_fp16_vs_fp32_is_a_precision_difference(runs, tmp_path):
    res, v = compare_cli(runs["a"], runs["fp16"], tmp_path / "r")
    assert res.returncode == 1
    d = v["diagnosis"]
    assert d["cause"] == D.SPEC and d["first_divergent_step"] == 1
    assert {"field": "precision.dtype", "a": "fp32", "b": "fp16", "cosmetic": False} in d[
        "spec_differences"
    ]
    assert D.SCALE in [c["name"] for c in d["causes"]]
    assert v["precision"] == "fp32"

"""End to end: ``dualtrain compare --config`` runs torch, tf and the fp64 reference pair, then
reports."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from dualtrain.core.weights import load_weights
from dualtrain.records.tbevents import EVAL_TAGS, TRAIN_TAGS, read_logdir
from testkit.cli import ROOT, require, run_cli
from testkit.worker_hooks import hook_env

require("torch", "tensorflow", "keras")  # both backends' frameworks (skip only if not installed)


def test_compare_config_tiny(tmp_path):
    out = tmp_path / "cmp"
    res = run_cli(
        "compare",
        "--config",
        str(ROOT / "configs/mnist_mlp.yaml"),
        "--world-size",
        "2",
        "--set",
        "train.epochs=1",
        "--set",
        "data.train_limit=1280",
        "--set",
        "data.test_limit=500",
        "--set",
        "distribution.timeout_s=60",
        "--out",
        str(out),
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert (
        "verdict: PASS" in res.stdout
        and "semantics checked against the fp64 reference" in res.stdout
    )
    # progress: which run is running, and when each ended
    # the fp64 pair runs first: the requested-precision runs replay its recorded probe states
    assert f"dualtrain compare: run 2/4: tf fp64 -> {out / 'fp64-tf'}\n" in res.stdout
    assert "dualtrain compare: run 4/4 done: tf fp32 in " in res.stdout
    assert (
        res.stdout.rstrip()
        .splitlines()[-1]
        .startswith(f"dualtrain compare: report: {out / 'report.html'}")
    )
    for name in (
        "verdict.json",
        "report.md",
        "report.html",
        "torch/summary.json",
        "tf/summary.json",
        "fp64-torch/summary.json",
        "fp64-tf/summary.json",
    ):
        assert (out / name).is_file(), name
    v = json.loads((out / "verdict.json").read_text())
    assert v["runs"]["a"]["label"] == "torch" and v["runs"]["b"]["label"] == "tf"
    # the README's table says how many checks this compare passes: the number is this run's
    scored = [c for c in v["checks"] if not c["informational"]]
    readme = (ROOT / "README.md").read_text()
    assert f"all {len(scored)} checks pass" in readme, len(scored)
    assert f"({len(scored)}/{len(scored)} checks;" in v["verdict"]
    assert v["runs"]["reference_b"]["path"] == str(out / "fp64-tf")
    steps = json.loads((out / "torch/summary.json").read_text())["steps"]
    checks = {c["name"]: c for c in v["checks"]}
    assert f"{steps} of {steps} steps" in checks["trajectory"]["detail"]
    the_reference_pair_is_the_spec_in_fp64_and_agrees(out, checks)
    the_precision_path_is_judged_by_the_probes(out, v, checks)
    tensorboard_overlays_the_four_runs(out)


def the_reference_pair_is_the_spec_in_fp64_and_agrees(out, checks):
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
    assert (
        checks["reference_loss"]["value"] < 1e-13 and checks["reference_weights"]["value"] < 1e-13
    )


def the_precision_path_is_judged_by_the_probes(out, v, checks):
    # the precision path is judged by one-step probes from the fp64 torch run's states
    for name in ("local_loss", "local_grad", "local_update", "convergence"):
        assert checks[name]["ran"] and checks[name]["passed"], checks[name]
    probes = checks["local_grad"]["data"]
    assert probes["steps"][0] == 1 and len(probes["steps"]) >= 4
    assert all(0 < e < 1e-5 for e in probes["a"] + probes["b"])  # fp32: a few float32 ulps
    assert v["culprits"] == [] and v["local_bounds"]["precision"] == "fp32"
    for b in ("torch", "tf"):
        assert json.loads((out / b / "summary.json").read_text())["probes"]["steps"] == len(
            probes["steps"]
        )
    md = (out / "report.md").read_text()
    assert "## Precision path: one-step probes" in md
    assert "One-step errors against the fp64 step" in (out / "report.html").read_text()


def tensorboard_overlays_the_four_runs(out):
    # `tensorboard --logdir OUT` overlays the four runs, with the same tags, and each run's curves
    # are its metrics.jsonl (read with TensorBoard's own loader, as its scalars dashboard reads
    # them)
    runs = read_logdir(out)
    labels = ("torch", "tf", "fp64-torch", "fp64-tf")
    assert set(runs) == {f"{b}/tensorboard" for b in labels}
    # a classification run without a validation split: its eval tags are the test loss and accuracy
    tags = set(TRAIN_TAGS.values()) | {EVAL_TAGS["loss"], EVAL_TAGS["accuracy"]}
    for b in labels:
        scalars = runs[f"{b}/tensorboard"]
        assert set(scalars) == tags, b
        rows = [json.loads(line) for line in (out / b / "metrics.jsonl").read_text().splitlines()]
        train = [r for r in rows if r["kind"] == "train"]
        assert [s for s, _ in scalars["train/loss"]] == [r["step"] for r in train]
        assert np.allclose(
            [v for _, v in scalars["train/loss"]], [r["loss"] for r in train], rtol=1e-6
        )  # float32 in the event file
        assert [(s, round(v, 5)) for s, v in scalars["eval/accuracy"]] == [
            (r["step"], round(r["accuracy"], 5)) for r in rows if r["kind"] == "eval"
        ]


@pytest.mark.slow  # the same compare_backends path runs in test_python_api_runs.py
def test_compare_config_reference_none(tmp_path):
    out = tmp_path / "cmp"
    res = run_cli(
        "compare",
        "--config",
        str(ROOT / "configs/mnist_mlp.yaml"),
        "--world-size",
        "1",
        "--set",
        "train.max_steps=3",
        "--set",
        "data.train_limit=640",
        "--set",
        "data.test_limit=100",
        "--reference",
        "none",
        "--out",
        str(out),
        timeout=300,
    )
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


@pytest.mark.slow
def test_a_compare_is_taken_up_where_it_stopped(tmp_path):
    # A rerun into the same --out reuses the finished runs of the same spec (checked by their
    # records), runs an interrupted one again (set aside, not deleted), refuses another spec, and
    # --overwrite replaces the earlier compare.
    out = tmp_path / "cmp"
    args = [
        "compare",
        "--config",
        str(ROOT / "configs/mnist_mlp.yaml"),
        "--world-size",
        "1",
        "--set",
        "train.max_steps=3",
        "--set",
        "data.train_limit=640",
        "--set",
        "data.test_limit=100",
        "--out",
        str(out),
    ]
    first = run_cli(*args, timeout=300)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    labels = ("fp64-torch", "fp64-tf", "torch", "tf")
    stamps = {b: (out / b / "summary.json").stat().st_mtime_ns for b in labels}

    again = run_cli(*args, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.count("finished earlier, reused") == 4
    assert {b: (out / b / "summary.json").stat().st_mtime_ns for b in labels} == stamps
    assert "verdict: PASS" in again.stdout

    for name in ("summary.json", "weights_final.npz"):  # tf stopped before its end, no checkpoint
        (out / "tf" / name).unlink()
    resumed = run_cli(*args, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert resumed.stdout.count("finished earlier, reused") == 3
    assert (
        f"it runs again (the stopped run is kept in {out / 'partial' / 'tf-1'})" in resumed.stdout
    )
    assert (out / "partial" / "tf-1" / "spec.yaml").is_file() and (
        out / "tf/summary.json"
    ).is_file()

    other = [*args[:-2], "--set", "optimizer.lr=0.02", "--out", str(out)]
    refused = run_cli(*other, timeout=300)
    assert refused.returncode == 2 and "holds a compare of another spec" in refused.stderr
    assert (out / "partial").is_dir()  # nothing touched
    replaced = run_cli(*other, "--overwrite", "--reference", "none", timeout=300)
    assert replaced.returncode == 0, replaced.stdout[-3000:] + replaced.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "report.html",
        "report.md",
        "tf",
        "torch",
        "verdict.json",
    ]
    assert yaml.safe_load((out / "torch/spec.yaml").read_text())["optimizer"]["lr"] == 0.02


def _compare_hooked(out, length: str, hook: str):
    """compare on a short MNIST MLP (``length``: its epochs or steps), every worker running
    ``hook`` (testkit.worker_hooks)."""
    sets = (length, "data.train_limit=1280", "data.test_limit=500")
    return run_cli(
        "compare",
        "--config",
        str(ROOT / "configs/mnist_mlp.yaml"),
        *[a for s in sets for a in ("--set", s)],
        "--out",
        str(out),
        timeout=300,
        env=hook_env(hook),
    )


@pytest.mark.slow
def test_a_run_that_cannot_finish_still_gets_a_verdict(tmp_path):
    # the tf run cannot load the probe states torch recorded (a test hook makes its replay stop on
    # the user error an optimizer slot it does not keep would give): compare still judges what
    # finished (the fp64 pair), and the verdict leads with the run, the reason and what it means
    out = tmp_path / "cmp"
    res = _compare_hooked(
        out, "train.epochs=1", "testkit.worker_hooks:probe_state_does_not_load=tf"
    )
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    v = json.loads((out / "verdict.json").read_text())
    assert v["category"] == "run failed" and not v["passed"]
    assert v["verdict"].startswith(
        "verdict: FAIL, run failed: tf fp32 could not finish: tf run failed: the probe state at "
        "step 1 holds optimizer slot 'velocity'"
    )
    assert "the requested-precision checks" in v["verdict"] and v["verdict"] in res.stdout
    checks = {c["name"]: c for c in v["checks"]}
    assert checks["reference_loss"]["passed"] and checks["reference_weights"]["passed"]
    assert "run failed" in (out / "report.md").read_text()


@pytest.mark.slow
def test_a_failed_fp64_torch_run_leaves_the_probe_run_out_and_a_verdict(tmp_path):
    # the fp64 torch run records the probe states the torch fp32 run replays: when it fails, that
    # run is not run, and compare still judges and reports (it raised KeyError on its timings)
    out = tmp_path / "cmp"
    res = _compare_hooked(out, "train.max_steps=4", "testkit.worker_hooks:run_fails=fp64-torch")
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert "KeyError" not in res.stderr, res.stderr[-3000:]
    v = json.loads((out / "verdict.json").read_text())
    assert v["category"] == "run failed" and not v["passed"]
    assert (
        "torch fp32 could not finish: not run: the fp64 torch run that records its probe"
        in (v["verdict"])
    )
    assert "verdict.json names every run that did not finish" in res.stderr


def test_quick_trains_three_steps_of_every_run(tmp_path):
    # --quick: the short form for a large pair (the fp64 pair's first steps, the probes)
    out = tmp_path / "q"
    small = ("--set", "data.train_limit=1024", "--set", "data.test_limit=200")
    res = run_cli("compare", "--config", str(ROOT / "configs/mnist_mlp.yaml"), *small, "--quick",
                  "--out", str(out), timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for run in ("torch", "tf", "fp64-torch", "fp64-tf"):
        rows = [json.loads(line) for line in (out / run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if r.get("kind") == "train"] == [1, 2, 3], run

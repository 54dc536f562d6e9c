"""Every spec the project ships runs: the migration recipes of docs/strategies.md
(examples/strategies/) each on one backend in the default suite (alternating) and on the other in
the slow set, the configs/ on both backends in the slow set. A few steps each, as the spec is
written (its world size, strategy, precision, model), with only the step count and the test split
cut down."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from testkit.cli import ROOT, require, run_cli

require("torch", "tensorflow", "keras")

STEPS = 3


def _is_spec(path) -> bool:
    """A dualtrain spec, not another tool's YAML (the Kubernetes manifests beside them)."""
    docs = list(yaml.safe_load_all(path.read_text()))
    return (
        len(docs) == 1
        and isinstance(docs[0], dict)
        and "apiVersion" not in docs[0]
        and "kind" not in docs[0]
    )


RECIPES = sorted(p for p in (ROOT / "examples").rglob("*.yaml") if _is_spec(p))
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def test_every_recipe_in_the_docs_is_shipped():
    """docs/strategies.md names each recipe it gives, and each one it names is here."""
    doc = (ROOT / "docs" / "strategies.md").read_text()
    named = {p.relative_to(ROOT).as_posix() for p in RECIPES}
    assert named, "no example specs found"
    for rel in named:
        assert rel in doc, f"{rel} is not in docs/strategies.md"


def _arrays(tmp_path) -> str:
    """An arrays spec's data, written by the example script its comment names
    (examples/own_arrays.py: the two-input digits)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("own_arrays", ROOT / "examples" / "own_arrays.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = tmp_path / "data" / "arrays.npz"
    path.parent.mkdir(parents=True)
    module.main(str(path))
    return str(path)


def _runs_a_few_steps(spec, backend: str, tmp_path) -> None:
    out = tmp_path / "run"
    data = yaml.safe_load(spec.read_text()).get("data", {})
    sets = [f"train.max_steps={STEPS}"]
    if data.get("dataset", "mnist") == "mnist":
        sets.append("data.test_limit=256")  # the small datasets' test splits are smaller
    if data.get("dataset") == "arrays":
        sets.append(f"data.path={_arrays(tmp_path)}")
    proc = run_cli(
        "run",
        "--backend",
        backend,
        "--config",
        str(spec),
        *(a for x in sets for a in ("--set", x)),
        "--out",
        str(out),
    )
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == STEPS
    assert summary["backend"] == backend
    written = yaml.safe_load((out / "spec.yaml").read_text())
    given = yaml.safe_load(spec.read_text())
    # the run ran the spec as written: its world size and precision, not defaults
    assert written["distribution"]["world_size"] == given.get("distribution", {}).get(
        "world_size", 1
    )
    assert written["precision"]["dtype"] == given.get("precision", {}).get("dtype", "fp32")
    train = [
        r
        for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
        if r["kind"] == "train"
    ]
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))
    assert all(math.isfinite(r["loss"]) for r in train)
    assert math.isfinite(summary["test_loss"])


#: every recipe runs in the default suite on one backend (alternating, so both backends run
#: recipes there) and on the other in the slow set: a run costs a framework start-up per process
RECIPE_RUNS = [
    pytest.param(
        spec,
        backend,
        id=f"{spec.stem}-{backend}",
        marks=() if (i % 2 == 0) == (backend == "torch") else pytest.mark.slow,
    )
    for i, spec in enumerate(RECIPES)
    for backend in ("torch", "tf")
]


@pytest.mark.parametrize("spec, backend", RECIPE_RUNS)
def test_recipe_runs(spec, backend, tmp_path):
    _runs_a_few_steps(spec, backend, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "tf"])
@pytest.mark.parametrize("spec", CONFIGS, ids=lambda p: p.stem)
def test_config_runs(spec, backend, tmp_path):
    _runs_a_few_steps(spec, backend, tmp_path)

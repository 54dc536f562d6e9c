"""Your own table through the whole parity machinery (issue 32): scikit-learn's wine table with
its class names as text, written out as a CSV and as a Parquet file, and given to the Python API as
a pandas DataFrame, each passes ``dualtrain compare`` at world 2 (the fp64 pair included). All
three train on the same arrays (one content digest), the class names are recorded in the runs, and
each run records the table file's own sha256; the exported model names its classes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import dualtrain
from testkit.cli import require, run_cli

require("torch", "tensorflow", "keras", "sklearn", "pandas", "pyarrow")

CLASSES = ["class_0", "class_1", "class_2"]
SPEC = {
    "name": "wine-table",
    "seed": 0,
    "data": {
        "dataset": "table",
        "target": "cultivar",
        "test_fraction": 0.2,
        "batch_size": 32,
        "eval_batch_size": 200,
    },
    "model": {
        "inputs": [{"name": "x", "shape": [13]}],
        "preset": None,
        "layers": [{"type": "dense", "units": 16}, {"type": "relu"}, {"type": "dense", "units": 3}],
    },
    "optimizer": {"name": "adam", "lr": 0.01},
    "distribution": {"world_size": 2},
    "train": {"epochs": 2, "log_every": 1000000},
}


@pytest.fixture(scope="module")
def wine():
    from sklearn.datasets import load_wine

    bunch = load_wine(as_frame=True)
    df = bunch.frame.rename(columns={"target": "cultivar"})
    df["cultivar"] = bunch.target_names[bunch.target]  # text labels: class_0, class_1, class_2
    return df


def _passes(out: Path, digests: set[str]) -> None:
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["passed"], verdict
    for run in ("torch", "tf", "fp64-torch", "fp64-tf"):
        summary = json.loads((out / run / "summary.json").read_text())
        assert summary["class_names"] == CLASSES
        digests.add(summary["data_sha256"])
    assert summary["test_count"] == 36 and summary["test_accuracy"] > 0.7  # round(0.2 * 178)


DIGESTS: set[str] = set()


@pytest.mark.parametrize("fmt", ["csv", pytest.param("parquet", marks=pytest.mark.slow)])
def test_a_table_file_passes_compare(tmp_path, wine, fmt):
    path = tmp_path / f"wine.{fmt}"
    if fmt == "csv":
        wine.to_csv(path, index=False)
    else:
        wine.to_parquet(path, index=False)
    config = tmp_path / "wine.yaml"
    config.write_text(json.dumps({**SPEC, "data": {**SPEC["data"], "path": str(path)}}))
    out = tmp_path / "cmp"
    proc = run_cli(
        "compare",
        *("--config", str(config), "--out", str(out)),
        env={"DUALTRAIN_CACHE": str(tmp_path / "cache")},
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    _passes(out, DIGESTS)
    summary = json.loads((out / "torch" / "summary.json").read_text())
    assert summary["table_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert summary["data_source"] == f"table:{path}"
    assert len(DIGESTS) == 1  # a CSV, a Parquet file and a DataFrame: one content
    if fmt == "csv":  # an exported model says which class each output is
        proc = run_cli(
            "export", str(out / "torch"), "--format", "torch", "--out", str(tmp_path / "x")
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads((tmp_path / "x" / "export.json").read_text())["class_names"] == CLASSES


@pytest.mark.slow  # default-suite time: runs in CI's slow part (the CSV file's test stays)
def test_a_dataframe_passes_compare_through_the_api(tmp_path, wine, monkeypatch):
    monkeypatch.setenv("DUALTRAIN_CACHE", str(tmp_path / "cache"))
    cmp = dualtrain.compare(SPEC, data=wine, out=tmp_path / "cmp", quiet=True)
    assert cmp.passed, cmp.verdict
    _passes(tmp_path / "cmp", DIGESTS)
    assert len(DIGESTS) == 1
    record = json.loads((tmp_path / "cmp" / "torch" / "data.json").read_text())
    assert record["table"]["source"] == "a pandas DataFrame"
    assert record["table"]["target"] == "cultivar"

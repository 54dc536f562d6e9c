"""Your own table from the command line (issue 32): a bad table, and a table given where arrays
are read, is one line on stderr, exit 2, nothing written, for ``dualtrain run`` and ``dualtrain
compare``; the dry run names the table as the source. Training on tables:
parity_tests/test_tables.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from testkit.cli import one_line_error, run_cli

pd = pytest.importorskip("pandas")


def _config(tmp_path: Path, **data) -> Path:
    spec = {
        "name": "table",
        "data": {"dataset": "table", "target": "species", "test_fraction": 0.25, **data},
        "model": {
            "inputs": [{"name": "x", "shape": [2]}],
            "preset": None,
            "layers": [{"type": "dense", "units": 3}],
        },
        "distribution": {"world_size": 2},
    }
    out = tmp_path / "table.yaml"
    out.write_text(json.dumps(spec))  # JSON is YAML
    return out


def _table(tmp_path: Path) -> Path:
    df = pd.DataFrame(
        {
            "a": np.linspace(0, 1, 40),
            "b": [str(i) for i in range(40)],
            "species": ["setosa", "versicolor", "virginica", "setosa"] * 10,
        }
    )
    df.loc[11, "b"] = "unknown"  # a text value in a column of numbers
    path = tmp_path / "iris.csv"
    df.to_csv(path, index=False)
    return path


WORDS = "column 'b' holds text ('unknown' at row 11), not numbers"


def test_a_bad_table_is_one_line_and_writes_nothing(tmp_path):
    config = _config(tmp_path, path=str(_table(tmp_path)))
    env = {"DUALTRAIN_CACHE": str(tmp_path / "cache")}
    out = tmp_path / "run"
    proc = run_cli("run", "--backend", "torch", "--config", str(config), "--out", str(out), env=env)
    assert WORDS in one_line_error(proc) and not out.exists()
    proc = run_cli("compare", "--config", str(config), "--out", str(tmp_path / "cmp"), env=env)
    assert WORDS in one_line_error(proc) and not (tmp_path / "cmp").exists()
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "cache").rglob("*"))


def test_a_table_given_as_arrays_is_named_and_a_good_one_dry_runs(tmp_path):
    path = _table(tmp_path)
    env = {"DUALTRAIN_CACHE": str(tmp_path / "cache")}
    config = _config(tmp_path, dataset="arrays", path=str(path), test_fraction=None, target="y")
    proc = run_cli("run", "--backend", "torch", "--config", str(config), "--dry-run", env=env)
    assert "data.path is a CSV table: use data.dataset: table" in one_line_error(proc)
    good = pd.read_csv(path).drop(columns="b")
    good.to_csv(path, index=False)
    config = _config(tmp_path, path=str(path), columns={"x": ["a"]})
    proc = run_cli(
        "run",
        "--backend",
        "torch",
        "--config",
        str(config),
        "--dry-run",
        "--set",
        "model.inputs=[{name: x, shape: [1]}]",
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"table:{path}" in proc.stdout

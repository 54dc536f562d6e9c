"""Your own data from the command line (issue 18): bad input is one line on stderr, exit 2, nothing
written, for ``dualtrain run`` and ``dualtrain compare``; a good arrays dataset trains and records
what it trained on (data.json, summary.json)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from testkit.cli import ROOT, one_line_error, require, run_cli

RNG = np.random.default_rng(1)


_one_line = one_line_error


def _table(n=60, features=4, classes=3) -> dict[str, np.ndarray]:
    return {
        "x_train": RNG.normal(size=(n, features)).astype(np.float32),
        "y_train": np.arange(n) % classes,
        "x_test": RNG.normal(size=(20, features)).astype(np.float32),
        "y_test": np.arange(20) % classes,
    }


def _config(tmp_path: Path, path: Path, **data) -> Path:
    spec = {
        "name": "own",
        "data": {"dataset": "arrays", "path": str(path), "batch_size": 16, **data},
        "model": {
            "inputs": [{"name": "x", "shape": [4]}],
            "preset": None,
            "layers": [
                {"type": "dense", "units": 8},
                {"type": "relu"},
                {"type": "dense", "units": 3},
            ],
        },
        "distribution": {"world_size": 2},
        "train": {"epochs": 2},
    }
    out = tmp_path / "own.yaml"
    out.write_text(json.dumps(spec))  # JSON is YAML
    return out


def _bad(tmp_path: Path, case: str) -> tuple[Path, dict]:
    a = _table()
    data: dict = {}
    if case == "missing file":
        return tmp_path / "nope.npz", data
    if case == "missing key":
        a.pop("x_test")
    elif case == "rows differ":
        a["y_train"] = a["y_train"][:-3]
    elif case == "label out of range":
        a["y_test"][4] = 5
    elif case == "nan":
        a["x_train"][7, 2] = np.nan
    elif case == "object array":
        a["y_train"] = np.array([object()] * 60, dtype=object)
    elif case == "string array":
        a["x_test"] = np.array([["a"] * 4] * 20)
    elif case == "fewer samples than replicas with drop":
        data = {"validation_ids": [3], "last_batch": "drop"}
    p = tmp_path / "data.npz"
    np.savez(p, **a)
    return p, data


WORDS = {
    "missing file": "data.path does not exist",
    "missing key": "missing key x_test",
    "rows differ": "x_train has 60 rows but y_train has 57",
    "label out of range": "label 5 is out of range for the model's 3 outputs",
    "nan": "x_train holds NaN or inf (first at row 7)",
    "object array": "cannot be read without a pickle",
    "string array": "x_test must be a numeric array",
    "fewer samples than replicas with drop": "the validation split has 1 sample(s), fewer than "
    "the 2 replicas",
}


@pytest.mark.parametrize("case", list(WORDS))
def test_bad_data_is_one_line_and_writes_nothing(tmp_path, case):
    path, data = _bad(tmp_path, case)
    config = _config(tmp_path, path, **data)
    out = tmp_path / "run"
    proc = run_cli("run", "--backend", "torch", "--config", str(config), "--out", str(out))
    assert WORDS[case] in _one_line(proc)
    assert not out.exists()


def test_compare_refuses_bad_data_before_any_run(tmp_path):
    path, data = _bad(tmp_path, "nan")
    out = tmp_path / "cmp"
    proc = run_cli("compare", "--config", str(_config(tmp_path, path, **data)), "--out", str(out))
    assert WORDS["nan"] in _one_line(proc)
    assert not out.exists()


def test_an_npy_folder_trains_and_records_its_data(tmp_path):
    require("torch")
    folder = tmp_path / "data"
    folder.mkdir()
    for k, v in _table().items():
        np.save(folder / f"{k}.npy", v)
    out = tmp_path / "run"
    config = _config(tmp_path, folder, validation=0.25)
    proc = run_cli("run", "--backend", "torch", "--config", str(config), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "validation loss" in proc.stdout
    record = json.loads((out / "data.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert record["sizes"] == {"train": 45, "validation": 15, "test": 20}
    assert len(record["validation_ids"]) == 15 and summary["data_sha256"] == record["sha256"]
    assert summary["validation_accuracy"] is not None and summary["metric"] == "accuracy"
    dry = run_cli("run", "--backend", "torch", "--config", str(config), "--dry-run")
    assert dry.returncode == 0 and "arrays:" in dry.stdout, dry.stderr[-2000:]


def test_resume_from_on_other_data_is_refused(tmp_path):
    require("torch")
    np.savez(tmp_path / "a.npz", **_table())
    config = _config(tmp_path, tmp_path / "a.npz")
    first = tmp_path / "first"
    proc = run_cli(
        "run",
        *("--backend", "torch", "--config", str(config), "--out", str(first)),
        *("--set", "train.checkpoint_every=4"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    changed = _table()  # another draw: other content, same shapes
    np.savez(tmp_path / "b.npz", **changed)
    ckpt = sorted((first / "checkpoints").iterdir())[0]
    out = tmp_path / "second"
    proc = run_cli(
        "run",
        *("--backend", "torch", "--config", str(config), "--out", str(out)),
        *("--set", f"data.path={tmp_path / 'b.npz'}", "--resume-from", str(ckpt)),
    )
    assert "was trained on other data" in _one_line(proc)
    assert not out.exists()


def test_shipped_dataset_configs_validate():
    # every shipped config names data the dry run can find (the arrays one needs its file first)
    for name in ("digits_cnn", "breast_cancer_mlp", "diabetes_regression"):
        proc = run_cli("run", "--backend", "torch", "--config", name, "--dry-run")
        assert proc.returncode == 0, (name, proc.stderr[-2000:])
    assert (ROOT / "configs" / "digits_two_inputs.yaml").is_file()

"""The shared file/JSON helpers (dualtrain.jsonio) that records, checkpoints, compare and the report
all use: one sanitiser, one flattening, one atomic write, one folder naming."""

from __future__ import annotations

import json
import math

import numpy as np

from dualtrain.jsonio import flatten, json_safe, new_folder, write_atomic


def test_json_safe_makes_every_record_valid_json():
    obj = {
        "loss": math.nan,
        "amax": [math.inf, -math.inf, 1.5],
        3: (np.float32(0.25), np.int64(7)),
        "nested": {"x": np.float64("nan")},
    }
    out = json_safe(obj)
    assert out == {
        "loss": "nan",
        "amax": ["inf", "-inf", 1.5],
        "3": [0.25, 7],
        "nested": {"x": "nan"},
    }
    json.loads(json.dumps(out, allow_nan=False))  # strict JSON: no NaN/Infinity tokens


def test_flatten_gives_dotted_paths_and_keeps_lists_as_leaves():
    assert flatten(
        {
            "optimizer": {"lr": 0.1, "schedule": {"name": "cosine"}},
            "seed": 0,
            "model": {"layers": [{"type": "relu"}]},
            "empty": {},
        }
    ) == {
        "optimizer.lr": 0.1,
        "optimizer.schedule.name": "cosine",
        "seed": 0,
        "model.layers": [{"type": "relu"}],
    }
    assert flatten({"a": 1}, "env") == {"env.a": 1}


def test_new_folder_never_names_an_existing_one(tmp_path):
    first = new_folder(tmp_path, "mnist_mlp-torch")
    assert first.parent == tmp_path and first.name.startswith("mnist_mlp-torch-")
    assert not first.exists()
    first.mkdir()
    second = new_folder(tmp_path, "mnist_mlp-torch")
    if second.name[:-2] == first.name:  # the same second: a suffix
        assert second.name == first.name + "-2"
    assert second != first and not second.exists()


def test_write_atomic_replaces_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "summary.json"
    write_atomic(path, "old")
    write_atomic(path, "new")
    assert path.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == [
        "summary.json"
    ]

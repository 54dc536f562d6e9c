"""The checkpoint folder itself (dualtrain/runtime/checkpoint.py): round trip, atomic visibility,
keeping K, checksums, the spec comparison. (A full disk, on a real tmpfs:
tests/integration/test_checkpoint_full_disk.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from dualtrain.errors import UserError
from dualtrain.runtime import checkpoint
from dualtrain.runtime.checkpoint import OptimizerState
from dualtrain.spec import load_spec

W = {"0.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "0.bias": np.ones(2, np.float32)}
OPT = OptimizerState(
    slots={"exp_avg/0.weight": np.full((2, 3), 0.5, np.float32)},
    applied=7,
    loss_scale=1024.0,
    good_steps=3,
)


def save(run: Path, step: int, keep: int = 3) -> Path:
    return checkpoint.save(run, step, W, OPT, {"epoch": 1, "spec": {}, "records": {}}, keep=keep)


def test_round_trip(tmp_path):
    path = save(tmp_path, 12)
    assert path == tmp_path / "checkpoints" / "step-00000012"
    assert sorted(p.name for p in path.iterdir()) == [
        "MANIFEST.json",
        "optimizer.npz",
        "state.json",
        "weights.npz",
    ]
    ck = checkpoint.load(path)
    assert ck.step == 12 and ck.state["epoch"] == 1
    assert all(np.array_equal(ck.weights[k], W[k]) and ck.weights[k].dtype == W[k].dtype for k in W)
    assert np.array_equal(ck.optimizer.slots["exp_avg/0.weight"], OPT.slots["exp_avg/0.weight"])
    assert (ck.optimizer.applied, ck.optimizer.loss_scale, ck.optimizer.good_steps) == (
        7,
        1024.0,
        3,
    )


def test_keeps_the_newest_k(tmp_path):
    for step in (5, 10, 15, 20):
        save(tmp_path, step, keep=2)
    assert checkpoint.complete_steps(tmp_path) == [15, 20]
    assert checkpoint.latest(tmp_path).name == "step-00000020"


def test_unfinished_write_is_invisible(tmp_path):
    save(tmp_path, 10)
    # what a crash before the rename leaves behind, and a folder whose manifest never came
    partial = tmp_path / "checkpoints" / ".tmp-step-00000020-999"
    shutil.copytree(tmp_path / "checkpoints" / "step-00000010", partial)
    no_manifest = tmp_path / "checkpoints" / "step-00000030"
    shutil.copytree(tmp_path / "checkpoints" / "step-00000010", no_manifest)
    (no_manifest / "MANIFEST.json").unlink()
    assert checkpoint.complete_steps(tmp_path) == [10]
    with pytest.raises(UserError, match="not a complete checkpoint"):
        checkpoint.load(no_manifest)


@pytest.mark.parametrize("name", ["weights.npz", "optimizer.npz", "state.json"])
def test_any_changed_byte_is_refused(tmp_path, name):
    path = save(tmp_path, 10)
    f = path / name
    data = bytearray(f.read_bytes())
    data[-3] ^= 0x01
    f.write_bytes(bytes(data))
    with pytest.raises(UserError, match=f"{name} does not match its checksum"):
        checkpoint.load(path)


def test_spec_difference_names_the_field():
    a = load_spec(None, ["optimizer.lr=0.1"]).to_dict()
    same = load_spec(
        None,
        [
            "optimizer.lr=0.1",
            "distribution.world_size=3",
            "train.log_every=7",
            "train.checkpoint_every=epoch",
            "name=other",
        ],
    ).to_dict()
    assert checkpoint.spec_difference(a, same) is None
    other = load_spec(None, ["optimizer.lr=0.2"]).to_dict()
    assert checkpoint.spec_difference(a, other) == "optimizer.lr: 0.1 in the checkpoint, 0.2 here"
    longer = load_spec(None, ["optimizer.lr=0.1", "train.epochs=3"]).to_dict()
    assert checkpoint.spec_difference(a, longer) == "train.epochs: 1 in the checkpoint, 3 here"

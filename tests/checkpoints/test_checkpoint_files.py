"""The checkpoint folder itself (dualtrain/runtime/checkpoint.py): round trip, atomic visibility,
keeping K, checksums, the spec comparison, and a full disk (a real tmpfs, where the machine allows
mounting)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest

from dualtrain.errors import UserError
from dualtrain.runtime import checkpoint
from dualtrain.runtime.checkpoint import CheckpointWriteError, OptimizerState
from dualtrain.spec import load_spec
from tests.conftest import ROOT, run_cli

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


@pytest.fixture
def small_disk(tmp_path):
    """A 1.5 MB tmpfs (root and mount needed): room for a run's records and initial weights (the
    MLP's are 0.94 MB), not for a checkpoint."""
    mnt = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount to make a small tmpfs")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1536k", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_keeps_the_previous_checkpoint(small_disk):
    save(small_disk, 10)
    big = {"w": np.zeros(1_000_000, np.float32)}  # 4 MB: does not fit
    with pytest.raises(
        CheckpointWriteError,
        match="the checkpoint of step 20 could not be written.*No space left on device",
    ):
        checkpoint.save(small_disk, 20, big, OPT, {"spec": {}, "records": {}}, keep=3)
    assert checkpoint.complete_steps(small_disk) == [10]
    assert [p.name for p in (small_disk / "checkpoints").iterdir()] == ["step-00000010"]
    checkpoint.load(small_disk / "checkpoints" / "step-00000010")


def test_full_disk_fails_the_run_in_one_line(small_disk):
    pytest.importorskip("torch")
    out = small_disk / "run"
    proc = run_cli(
        "run",
        "--backend",
        "torch",
        "--config",
        str(ROOT / "configs" / "mnist_mlp.yaml"),
        "--set",
        "data.train_limit=640",
        "--set",
        "train.checkpoint_every=2",
        "--set",
        "distribution.world_size=1",
        "--out",
        str(out),
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert any(
        "the checkpoint of step 2 could not be written" in e and "No space left on device" in e
        for e in errors
    ), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert checkpoint.complete_steps(out) == []

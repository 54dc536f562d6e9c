"""A full disk (a real tmpfs, where the machine allows mounting): the previous checkpoint is kept,
and a run fails in one line. (The checkpoint folder itself, in process:
tests/runtime/test_checkpoint_files.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import numpy as np
import pytest

from dualtrain.runtime import checkpoint
from dualtrain.runtime.checkpoint import CheckpointWriteError
from testkit.cli import ROOT, run_cli
from tests.runtime.test_checkpoint_files import OPT, save


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

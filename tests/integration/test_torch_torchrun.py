"""The torchrun convention: each torchrun rank runs the CLI as one worker; rank 0 writes the run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dualtrain.launch.local import free_port
from dualtrain.records.record import read_run
from testkit.cli import ROOT

# Signals, kills, torchrun or timing: make test runs these alone, after the parallel part.
pytestmark = pytest.mark.serial


def test_torchrun_two_ranks(tmp_path):
    out = tmp_path / "run"
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        GLOO_SOCKET_IFNAME="lo",
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        "-m",
        "dualtrain",
        "run",
        "--backend",
        "torch",
        "--set",
        "data.train_limit=300",
        "--set",
        "data.test_limit=100",
        "--set",
        "train.log_every=1",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = read_run(out)
    for name in ("weights_init.npz", "weights_final.npz"):
        assert (out / name).is_file()
    assert rec.summary["world_size"] == 2  # from torchrun's WORLD_SIZE, not the spec's 1
    assert len(rec.train) == 3 and [r["samples"] for r in rec.train] == [128, 128, 44]
    assert {r["replica"] for r in rec.shards} == {0, 1}
    assert rec.eval[-1]["count"] == 100


@pytest.mark.slow
def test_torchrun_max_restarts_resumes_from_the_latest_checkpoint(tmp_path):
    # torchrun restarts both ranks after rank 1 is SIGKILLed at step 5; the restarted ranks find the
    # step-4 checkpoint in --out by themselves, and the run ends bit-identical to a run without the
    # failure (dualtrain's own launcher, same world size).
    import numpy as np

    from dualtrain.core.weights import load_weights
    from testkit.cli import run_cli

    sets = [
        "--set",
        "data.train_limit=600",
        "--set",
        "data.test_limit=100",
        "--set",
        "train.checkpoint_every=4",
        "--set",
        "train.log_every=1000",
    ]
    ref = tmp_path / "ref"
    proc = run_cli(
        "run", "--backend", "torch", "--world-size", "2", *sets, "--out", str(ref), timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / "run"
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        GLOO_SOCKET_IFNAME="lo",
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--max-restarts",
        "1",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        "-m",
        "dualtrain",
        "run",
        "--backend",
        "torch",
        *sets,
        "--set",
        "debug.exit_rank=[5, 1]",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "continuing" in proc.stdout and "step-00000004" in proc.stdout
    rec = read_run(out)
    assert rec.summary["resumed"][0]["from_step"] == 4
    a, b = load_weights(ref / "weights_final.npz"), load_weights(out / "weights_final.npz")
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert [r["step"] for r in rec.train] == [r["step"] for r in read_run(ref).train]

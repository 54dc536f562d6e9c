"""A dying worker fails the run fast, naming the rank; no hang. SIGTERM stops the whole run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit.cli import ROOT, cli_env
from testkit.torch_runs import torch_run

# Signals, kills, torchrun or timing: make test runs these alone, after the parallel part.
pytestmark = pytest.mark.serial


def test_dead_rank_fails_the_run(tmp_path):
    t0 = time.monotonic()
    proc = torch_run(
        tmp_path / "run",
        "data.train_limit=2000",
        "train.max_steps=20",
        "debug.exit_rank=[3,1]",
        "distribution.timeout_s=30",
        world=2,
        timeout=120,
        check=False,
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1, proc.stderr
    assert "rank 1" in proc.stderr and "SIGKILL" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr.splitlines()[-1]
    assert elapsed < 60, f"took {elapsed:.0f}s"


def test_gpu_without_cuda_is_a_clear_error(tmp_path):
    import torch

    if torch.cuda.is_available():
        import pytest

        pytest.skip("this machine has CUDA")
    proc = torch_run(
        tmp_path / "run",
        "distribution.device=gpu",
        "data.train_limit=64",
        "train.max_steps=1",
        world=1,
        timeout=120,
        check=False,
    )
    # Refused before any worker starts (the launcher asks torch in a child process): a user
    # mistake, one line, exit 2, no run folder.
    assert proc.returncode == 2, proc.stderr
    errors = [x for x in proc.stderr.splitlines() if ": error:" in x]
    assert len(errors) == 1 and "no CUDA device" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


def test_sigterm_stops_the_run_and_its_workers(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dualtrain",
            "run",
            "--backend",
            "torch",
            "--world-size",
            "2",
            "--out",
            str(out),
            "--set",
            "train.epochs=50",
            "--set",
            "train.log_every=1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        cwd=ROOT,
    )
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.is_file() and metrics.stat().st_size > 0):  # training is under way
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    pids = [w["pid"] for w in json.loads((out / "launch.json").read_text())["workers"]]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "dualtrain: stopped by SIGTERM" in err and f"partial run left in {out}" in err, err
    assert "no checkpoint to resume from (train.checkpoint_every writes them)" in err, err
    assert "Traceback" not in err, err
    for pid in pids:  # the launcher stopped (and reaped) its workers before exiting
        assert not Path(f"/proc/{pid}").exists(), f"worker {pid} outlived the run"

"""Failure handling: a dead multi_worker process fails the run quickly, naming the worker."""

from __future__ import annotations

import time

import pytest

from testkit.tf_runs import small_spec, tf_run

# Signals, kills, torchrun or timing: make test runs these alone, after the parallel part.
pytestmark = pytest.mark.serial


def test_killed_worker_fails_the_run_fast(tmp_path):
    spec = small_spec(
        data={"train_limit": 640, "batch_size": 64, "test_limit": 50},
        distribution={"world_size": 2, "timeout_s": 30},
        tf={"strategy": "multi_worker"},
        train={"epochs": 1, "log_every": 1},
        debug={"exit_rank": [5, 1]},
    )
    t0 = time.monotonic()
    run = tf_run(tmp_path, spec, check=False, timeout=120)
    elapsed = time.monotonic() - t0
    assert run.proc.returncode != 0
    assert elapsed < 60, f"took {elapsed:.0f}s"
    err = run.proc.stderr
    assert "worker 1" in err and "SIGKILL" in err, err[-2000:]
    assert "fault injection: rank 1 exits at step 5" in err
    assert not (run.out / "summary.json").exists()

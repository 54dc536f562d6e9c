"""A dying worker fails the run fast, naming the rank; no hang."""

from __future__ import annotations

import time

from tests.torch.helpers import torch_run


def test_dead_rank_fails_the_run(tmp_path):
    t0 = time.monotonic()
    proc = torch_run(tmp_path / "run", "data.train_limit=2000", "train.max_steps=20",
                     "debug.exit_rank=[3,1]", "distribution.timeout_s=30", world=2, timeout=120,
                     check=False)
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
    proc = torch_run(tmp_path / "run", "distribution.device=gpu", "data.train_limit=64",
                     "train.max_steps=1", world=1, timeout=120, check=False)
    assert proc.returncode == 1, proc.stderr  # the launcher reports the worker's exit code 2
    assert "no CUDA device" in proc.stderr and "exited with code 2" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr

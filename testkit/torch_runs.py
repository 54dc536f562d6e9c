"""Helpers for the torch backend tests: real `dualtrain run --backend torch` subprocesses."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

from dualtrain.records.record import RunRecord, read_run
from testkit.cli import run_cli

SMALL = ("data.test_limit=200", "train.log_every=1")


def torch_run(
    out: Path, *sets: str, world: int = 1, timeout: float = 300, check: bool = True
) -> subprocess.CompletedProcess:
    args = ["run", "--backend", "torch", "--world-size", str(world), "--out", str(out)]
    for s in (*SMALL, *sets):
        args += ["--set", s]
    proc = run_cli(*args, timeout=timeout)
    if check:
        assert proc.returncode == 0, (
            f"run failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def record(out: Path) -> RunRecord:
    return read_run(out)


def npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}

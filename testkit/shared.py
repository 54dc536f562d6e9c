"""Runs shared by every test of a session, also across pytest-xdist workers (``make test`` runs
the suite in two worker processes): a run is built once, under a file lock, in a folder both
workers see, and every later asker reuses the finished run directory."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

import pytest


def shared_root(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A folder of this test session that every xdist worker of it shares (each worker's own
    basetemp sits inside the session's), or this process's basetemp without xdist."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    root = base / name
    root.mkdir(parents=True, exist_ok=True)
    return root


def once(out: Path, build: Callable[[Path], object], done: str = "summary.json") -> Path:
    """``out`` built by ``build(out)`` unless a finished one (holding ``done``) is there already;
    another process asking for the same ``out`` meanwhile waits for it instead of building it
    twice."""
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (out / done).is_file():
                build(out)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return out


def run_outputs(
    run: Path, backend: str, n: int, tmp: Path, weights: str = "weights_final.npz"
) -> tuple[object, list]:
    """A finished run's own float64 outputs on its first ``n`` test samples (the backend's
    ``tools forward``) from its ``weights`` file, and the normalised inputs they came from."""
    import subprocess
    import sys

    import numpy as np

    from dualtrain.core.data import TEST, open_data
    from dualtrain.spec import load_spec

    logits = tmp / "logits.npz"
    proc = subprocess.run(
        [sys.executable, "-m", f"dualtrain.backends.{backend}.tools", "forward"]
        + [str(run / "spec.yaml"), str(run / weights), str(n), str(logits)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    with np.load(logits) as z:
        expected = z["logits"].astype(np.float64)
    return expected, list(open_data(load_spec(run / "spec.yaml"), run).inputs(TEST, slice(0, n)))


def run_without_dualtrain(code: str, *args: str, cwd: Path):
    """``code`` in a Python that sees the installed packages but not this checkout (no
    PYTHONPATH, no site hooks): what a user without dualtrain has."""
    import subprocess
    import sys

    site = [p for p in sys.path if p.endswith("site-packages")]
    return subprocess.run(
        [sys.executable, "-S", "-c", f"import sys; sys.path[:0] = {site!r}\n" + code, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin"},
    )

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

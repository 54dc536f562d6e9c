"""A child process of the launcher: its environment (this package importable from a source checkout,
unbuffered output), and a question asked in one so that the framework it imports never loads into
the launcher (how many GPUs the framework sees: ``distribution.device: gpu``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dualtrain.errors import UserError
from dualtrain.spec import Device


def worker_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    env["PYTHONUNBUFFERED"] = "1"
    # Workers must find this package even when it is run from a source checkout.
    root = str(Path(__file__).resolve().parents[2])  # the folder that holds dualtrain/
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def count_in_child(code: str, timeout_s: float = 120.0) -> int | None:
    """Run ``python -c code`` (which prints one integer) in a child process, so the framework it
    imports never loads into this one; None if it fails."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=worker_env({}),
        )
        return int(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def require_gpu(device: Device, count_code: str, nothing_seen: str) -> None:
    """``distribution.device: gpu`` needs a GPU the framework can see. Asked in a child process
    (``count_code`` prints how many; the launcher never imports the framework) before any worker
    starts, so ``--dry-run`` says it too; only for gpu runs (the question costs a framework
    import)."""
    if device is not Device.GPU:
        return
    if not count_in_child(count_code):
        raise UserError(
            f"distribution.device is 'gpu' but {nothing_seen} on this machine; use "
            f"distribution.device: cpu. Received: 'gpu'"
        )

"""Running examples/audit's scripts small (1024 images, 2 epochs: 8 steps an epoch at 2 x 64)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from testkit.cli import ROOT

EXAMPLES = ROOT / "examples" / "audit"
SMALL = ("--train-size", "1024", "--epochs", "2")


def record(script: str, out: Path, *flags: str, timeout: int = 240) -> Path:
    """Run ``examples/audit/<script>`` into ``out``; the record's folder."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--out", str(out), *SMALL, *flags],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out

"""The tutorials run as a reader runs them (issue 49 item 6): each step's commands in a fresh
folder, and every output line the page quotes found in what they print, numbers aside
(tools/tutorials.py). The compare tutorial in the slow set's CI part, the port and scripts ones
in the sweep. That the check fails on a changed line is shown in tests/package."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.cli import ROOT, require
from tools.tutorials import missing, steps

require("torch", "tensorflow", "keras")


def _follow(page: str, tmp_path: Path) -> None:
    for name in ("configs", "examples"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    for step in steps(ROOT / "docs" / page):
        printed = ""
        for command in step.commands:
            proc = subprocess.run(
                command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True
            )
            last = command == step.commands[-1]
            assert proc.returncode in ((0, 1) if last else (0,)), (command, proc.stderr[-3000:])
            printed = proc.stdout + proc.stderr
        assert not missing(step.quoted, printed), (page, step.commands, printed[-3000:])


@pytest.mark.slow  # four runs and two compares (~2 min)
def test_the_compare_tutorial_runs_as_written(tmp_path):
    _follow("tutorial-compare.md", tmp_path)


@pytest.mark.slow  # about 3 minutes each: the sweep
@pytest.mark.sweep
@pytest.mark.parametrize("page", ["tutorial-port.md", "tutorial-scripts.md"])
def test_the_port_and_scripts_tutorials_run_as_written(tmp_path, page):
    _follow(page, tmp_path)

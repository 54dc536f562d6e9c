"""The checkout's root, and running the real CLI in a process of its own as a user would."""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from dualtrain.launch import forkserver
from dualtrain.launch.forkserver import Warm

ROOT = Path(__file__).resolve().parent.parent

CLI_WARM = Warm(
    preload=(
        "dualtrain.cli",
        "dualtrain.driver.runs",
        "dualtrain.driver.compare",
        "dualtrain.parity.report.page",
        "matplotlib.pyplot",
    ),
    preimport={},
)
"""What a warm CLI server imports (run_cli): the CLI, what its run and compare commands import,
and the report's plotting library; no framework (the CLI never imports one)."""


def require(*modules: str) -> None:
    """Skip the calling test module unless ``modules`` are installed, without importing them: the
    frameworks run in the backends' worker processes, and the pytest process never loads TF."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}", allow_module_level=True)


def run_cli(
    *args: str, timeout: float = 600, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """Run ``python -m dualtrain ARGS`` as a user would, capturing output. In the suite's parallel
    part (warm_workers) the process is forked from a server that imported the CLI already
    (CLI_WARM), as a run's workers are: the same program in a process of its own, its output,
    exit code, files and Ctrl-C as a started one's (tests/integration/test_forkserver.py), without
    the ~0.3 s of CPU each start spends importing."""
    return forkserver.run(
        "dualtrain",
        list(args),
        env=cli_env(env),
        warm=CLI_WARM,
        timeout=timeout,
        cwd=str(cwd or ROOT),
        interrupt=True,
    )


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The CLI's error convention for a user mistake: exit 2 and exactly one ``dualtrain: error:``
    line on stderr, no traceback; returns that line."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    errors = [line for line in proc.stderr.splitlines() if ": error:" in line]
    assert len(errors) == 1 and errors[0].startswith("dualtrain: error: "), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return errors[0]


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a CLI subprocess gets: this checkout first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra or {})
    return env


def isolate_pair_cache() -> None:
    """A pair-description cache of this test process's own (dualtrain.driver.pair_cache): a
    session describes every pair at least once, whatever earlier sessions cached; within the
    session, runs of the same pair reuse it, as a user's would."""
    if not os.environ.get("DUALTRAIN_PAIR_CACHE"):
        folder = tempfile.mkdtemp(prefix="dualtrain-test-pairs-")
        atexit.register(shutil.rmtree, folder, True)
        os.environ["DUALTRAIN_PAIR_CACHE"] = folder


def warm_workers() -> None:
    """In the suite's parallel part (a pytest-xdist worker), runs fork their workers from warm
    servers in a folder of this test process's own (dualtrain.launch.forkserver): a run's fixed
    cost is mostly its workers' framework import. The serial part (signals, kills, torchrun, other
    launchers) starts every worker as a fresh process, as a user's run does; so does a test that
    sets DUALTRAIN_FORKSERVER empty. The servers end with the folder."""
    if os.environ.get("PYTEST_XDIST_WORKER") and "DUALTRAIN_FORKSERVER" not in os.environ:
        folder = tempfile.mkdtemp(prefix="dualtrain-test-warm-")
        atexit.register(shutil.rmtree, folder, True)
        os.environ["DUALTRAIN_FORKSERVER"] = folder

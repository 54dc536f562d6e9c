"""Signals through the real launcher (`dualtrain run`), on both backends and both TF strategies.

What a scheduler, an OOM killer or a user does to a run: kill -9 of the launcher (no handler runs in
it), SIGTERM to it (`kill`, `docker stop`, Slurm's preemption), Ctrl-C (SIGINT to the whole
foreground process group). In every case no worker may outlive its launcher by more than the spec's
distribution.timeout_s, SIGTERM and SIGINT stop the run with a one-line message and the exit code of
the signal (no traceback), and a run whose workers had all finished is reported finished.

The default suite runs the case that failed (issue 16: TF multi_worker workers trained on after kill
-9 and ignored SIGTERM) and Ctrl-C on TF; the rest of the matrix is slow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit.cli import ROOT, cli_env, require

# Signals, kills, torchrun or timing: make test runs these alone, after the parallel part.
pytestmark = pytest.mark.serial

TIMEOUT_S = 30  # distribution.timeout_s of every run here

CASES = [  # (backend, tf strategy or None, signal, in the default suite)
    ("tf", "multi_worker", signal.SIGKILL, True),
    ("tf", "multi_worker", signal.SIGTERM, True),
    ("tf", "multi_worker", signal.SIGINT, False),
    ("tf", "mirrored", signal.SIGKILL, False),
    ("tf", "mirrored", signal.SIGTERM, False),
    ("tf", "mirrored", signal.SIGINT, True),
    ("torch", None, signal.SIGKILL, True),
    ("torch", None, signal.SIGTERM, False),
    ("torch", None, signal.SIGINT, False),
]


def default_sigint() -> None:
    """As a terminal starts a job: SIGINT at its default (a background job of a non-interactive
    shell, e.g. a suite run with `&`, inherits it ignored, and a Ctrl-C test would then test
    nothing)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie has exited; only its parent (dead or gone) had to reap it


def _start(tmp_path: Path, backend: str, strategy: str | None, epochs: int = 200):
    out = tmp_path / "run"
    args = [
        sys.executable,
        "-m",
        "dualtrain",
        "run",
        "--backend",
        backend,
        "--world-size",
        "2",
        "--out",
        str(out),
        "--set",
        f"train.epochs={epochs}",
        "--set",
        "train.log_every=1",
        "--set",
        "data.train_limit=640",
        "--set",
        "data.test_limit=100",
        "--set",
        f"distribution.timeout_s={TIMEOUT_S}",
    ]
    if strategy:
        args += ["--set", f"tf.strategy={strategy}"]
    # A session of its own, as a shell gives a job: SIGINT then goes to the whole group, as Ctrl-C.
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        cwd=ROOT,
        start_new_session=True,
        preexec_fn=default_sigint,
    )
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while not (metrics.is_file() and metrics.stat().st_size > 0):  # training is under way
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    pids = [w["pid"] for w in json.loads((out / "launch.json").read_text())["workers"]]
    return proc, out, pids


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def _params():
    for backend, strategy, sig, default in CASES:
        marks = [] if default else [pytest.mark.slow]
        name = f"{backend}-{strategy or 'ddp'}-{sig.name}"
        yield pytest.param(backend, strategy, sig, id=name, marks=marks)


@pytest.mark.parametrize("backend,strategy,sig", list(_params()))
def test_no_worker_outlives_its_launcher(tmp_path, backend, strategy, sig):
    require("tensorflow", "keras") if backend == "tf" else require("torch")
    proc, out, pids = _start(tmp_path, backend, strategy)
    if sig is signal.SIGINT:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: every process of the job gets it
    else:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=TIMEOUT_S + 30)
    left = _gone_within(pids, TIMEOUT_S)
    for pid in left:  # do not leave them behind for the next test
        os.kill(pid, signal.SIGKILL)
    assert not left, f"workers {left} outlived their launcher ({sig.name}) by {TIMEOUT_S}s"
    if sig is signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
        assert not (out / "summary.json").exists()  # nobody trained on unattended to the end
        return
    assert proc.returncode == 128 + sig, err[-3000:]
    word = "interrupted" if sig is signal.SIGINT else f"stopped by {sig.name}"
    assert f"dualtrain: {word}" in err, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]

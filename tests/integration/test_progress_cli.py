"""The chief's live progress bar on a terminal, plain lines everywhere else: real runs, on a
pseudo-terminal and in a pipe. (The Reporter's rendering, in process:
tests/runtime/test_progress.py.)"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys

import pytest

from testkit.cli import ROOT, cli_env, require, run_cli


def _in_terminal(args: list[str], extra_env: dict[str, str]) -> tuple[int, str]:
    """Run ``python -m dualtrain ARGS`` with a pseudo-terminal as its stdout and stderr."""
    master, slave = pty.openpty()
    env = cli_env({"COLUMNS": "120", "TERM": "xterm", **extra_env})
    if "CI" not in extra_env:  # CI runners set it; the bar is for a person at a terminal
        env.pop("CI", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dualtrain", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=ROOT,
        close_fds=True,
    )
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(timeout=60), b"".join(chunks).decode(errors="replace")


RUN = [
    "run",
    "--backend",
    "torch",
    "--config",
    str(ROOT / "configs/mnist_mlp.yaml"),
    "--world-size",
    "2",
    "--set",
    "data.train_limit=6400",
    "--set",
    "data.test_limit=500",
    "--set",
    "train.epochs=2",
    "--set",
    "train.log_every=10",
]


def test_a_run_on_a_terminal_shows_a_live_bar_and_in_a_pipe_plain_lines(tmp_path):
    require("torch")
    code, text = _in_terminal([*RUN, "--out", str(tmp_path / "tty")], {})
    assert code == 0, text[-3000:]
    frames = [f for f in text.split("\r") if f.startswith("[torch] train ")]
    assert len(frames) >= 3, text[-3000:]
    assert any("ETA" in f and "samples/s" in f and "epoch 2/2" in f for f in frames)
    assert any("100/100" in f for f in frames)
    # what stays on screen: the epoch ends, the evaluations, the end; not the log_every lines
    assert "[torch] epoch 1/2 step 50/100" in text and "[torch] eval after step 100" in text
    assert "step 10/100" not in text
    assert "test accuracy" in text

    piped = run_cli(*RUN, "--out", str(tmp_path / "pipe"), timeout=300)
    assert piped.returncode == 0, piped.stderr[-3000:]
    assert "\r" not in piped.stdout and "ETA" not in piped.stdout
    assert "[torch] epoch 1/2 step 10/100" in piped.stdout  # one line per log_every, as always


@pytest.mark.slow
@pytest.mark.parametrize(
    "env,setting", [({"CI": "true"}, []), ({}, ["--set", "logging.progress=lines"])]
)
def test_ci_or_lines_keeps_plain_lines_on_a_terminal(tmp_path, env, setting):
    require("torch")
    code, text = _in_terminal(
        [*RUN, "--set", "train.epochs=1", *setting, "--out", str(tmp_path / "run")], env
    )
    assert code == 0, text[-3000:]
    assert "ETA" not in text and "[torch] epoch 1/1 step 10/50" in text

"""Helpers for the tf backend tests: real `dualtrain run --backend tf` processes on real MNIST.

Importing this module skips the importing test module unless TensorFlow and Keras are installed."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dualtrain.backends import tools_warm
from dualtrain.core.weights import load_weights
from dualtrain.launch import forkserver
from dualtrain.records.record import RunRecord, read_run
from dualtrain.spec import Backend
from testkit.cli import ROOT, cli_env, require, run_cli

require("tensorflow", "keras")


def write_spec(path: Path, spec: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def small_spec(**sections: Any) -> dict[str, Any]:
    """A short-run spec; keyword arguments replace or extend top-level sections."""
    spec: dict[str, Any] = {
        "name": "tftest",
        "seed": 0,
        "data": {"train_limit": 64, "test_limit": 50, "batch_size": 7, "eval_batch_size": 20},
        "model": {"preset": "mlp"},
        "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
        "distribution": {"world_size": 2, "timeout_s": 60},
        "tf": {"strategy": "mirrored"},
        "train": {"epochs": 1, "log_every": 3},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec


class Run:
    def __init__(self, out: Path, proc: subprocess.CompletedProcess, seconds: float):
        self.out, self.proc, self.seconds = out, proc, seconds

    @property
    def record(self) -> RunRecord:
        return read_run(self.out)

    def grads(self, step: int) -> dict[str, np.ndarray]:
        return load_weights(self.out / f"grads_step{step}.npz")


def tf_run(
    tmp: Path, spec: dict[str, Any], *extra: str, check: bool = True, timeout: float = 300
) -> Run:
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = write_spec(tmp / "spec_in.yaml", spec)
    out = tmp / "run"
    t0 = time.monotonic()
    proc = run_cli(
        "run", "--backend", "tf", "--config", str(cfg), "--out", str(out), *extra, timeout=timeout
    )
    seconds = time.monotonic() - t0
    if check:
        assert proc.returncode == 0, (
            f"tf run failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return Run(out, proc, seconds)


def python_env() -> dict[str, str]:
    """A script's environment: the CLI's (testkit.cli.cli_env: the checkout on PYTHONPATH, TF's
    log level) with unbuffered output as a run's workers have it
    (dualtrain.launch.child.worker_env), so that in the parallel part its process is forked from
    the same warm server as theirs."""
    return cli_env({"PYTHONUNBUFFERED": "1"})


def run_python(
    *args: str, timeout: float = 300, backend: Backend = Backend.TF
) -> subprocess.CompletedProcess:
    """``python -m MODULE ...`` or ``python -c CODE ...``, a process that imports ``backend``'s
    framework: in the suite's parallel part forked from that backend's warm server
    (testkit.cli.warm_workers), which imported the framework already and ran none of it; else
    started."""
    how, what, *rest = args
    assert how in ("-m", "-c"), args
    module, argv = (what, rest) if how == "-m" else ("testkit.run_code", [what, *rest])
    return forkserver.run(
        module,
        argv,
        env=python_env(),
        warm=tools_warm(backend),
        timeout=timeout,
        cwd=str(ROOT),
        interrupt=True,
    )

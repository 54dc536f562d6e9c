"""A new user's mistakes (issue 16): one line, exit 2, nothing written, and the dry run says what
the run would. Real CLI processes; the runs that start stop before any worker trains. (The Python
API's own refusal, in process, is tests/api/test_first_hour.py.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from testkit.cli import ROOT, one_line_error, require, run_cli
from testkit.worker_hooks import hook_env

CONFIG = str(ROOT / "configs" / "mnist_mlp.yaml")
SMALL = ("--set", "data.train_limit=256", "--set", "data.test_limit=100", "--set", "train.epochs=1")


_one_line = one_line_error


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


BAD_OUTS = [("/proc/dualtrain-x", "cannot be written"), ("/dev/null/x", "not a folder")]


@pytest.mark.parametrize("out,words", BAD_OUTS, ids=["proc", "dev-null"])
@pytest.mark.parametrize("how", ["run", "dry-run", "compare", "export"])
def test_an_unusable_out_is_one_line(tmp_path, out, words, how):
    if how == "run":
        proc = run_cli("run", "--backend", "torch", "--config", CONFIG, *SMALL, "--out", out)
    elif how == "dry-run":
        proc = run_cli("run", "--backend", "torch", "--config", CONFIG, "--out", out, "--dry-run")
    elif how == "compare":
        proc = run_cli("compare", "--config", CONFIG, *SMALL, "--out", out)
    else:
        run = tmp_path / "run"
        done = run_cli(
            "run",
            "--backend",
            "torch",
            "--config",
            CONFIG,
            *SMALL,
            "--set",
            "distribution.world_size=1",
            "--out",
            str(run),
        )
        assert done.returncode == 0, done.stderr[-2000:]
        proc = run_cli("export", str(run), "--format", "torch", "--out", out)
    assert words in _one_line(proc)


@pytest.mark.skipif(os.geteuid() != 0, reason="a read-only bind mount needs root")
def test_a_read_only_out_is_one_line_and_nothing_is_written(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "--bind", str(ro), str(ro)]).returncode != 0:
        pytest.skip("cannot bind-mount here")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], check=True)
        for args in (
            ("run", "--backend", "torch", "--config", CONFIG, *SMALL),
            ("run", "--backend", "tf", "--config", CONFIG, "--dry-run"),
            ("compare", "--config", CONFIG, *SMALL),
        ):
            proc = run_cli(*args, "--out", str(ro / "a" / "b"))
            assert "Read-only file system" in _one_line(proc)
            assert _tree(ro) == []
    finally:
        subprocess.run(["umount", str(ro)])


def test_a_gpu_run_without_a_gpu_is_refused_before_it_starts(tmp_path):
    require("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    out = tmp_path / "run"
    for extra in (("--dry-run",), SMALL):
        proc = run_cli(
            "run",
            "--backend",
            "torch",
            "--config",
            CONFIG,
            "--set",
            "distribution.device=gpu",
            "--out",
            str(out),
            *extra,
        )
        assert "torch sees no CUDA device" in _one_line(proc)
        assert not out.exists()


def _other_dataset(folder: Path) -> None:
    """MNIST's shapes and types, other content (as Fashion-MNIST in MNIST's file names)."""
    rng = np.random.default_rng(0)
    folder.mkdir()
    np.savez(
        folder / "mnist.npz",
        x_train=rng.integers(0, 256, (60000, 28, 28), dtype=np.uint8),
        y_train=rng.integers(0, 10, 60000, dtype=np.uint8),
        x_test=rng.integers(0, 256, (10000, 28, 28), dtype=np.uint8),
        y_test=rng.integers(0, 10, 10000, dtype=np.uint8),
    )


def test_another_dataset_in_data_dir_is_refused_by_the_dry_run_too(tmp_path):
    _other_dataset(tmp_path / "data")
    out = tmp_path / "run"
    for extra in (("--dry-run",), SMALL):
        proc = run_cli(
            "run",
            "--backend",
            "torch",
            "--config",
            CONFIG,
            "--set",
            f"data.data_dir={tmp_path / 'data'}",
            "--out",
            str(out),
            *extra,
        )
        assert "does not match canonical MNIST" in _one_line(proc)
        assert not out.exists()


def test_a_worker_user_error_is_one_line_with_its_cause_and_leaves_no_run(tmp_path):
    # A mistake only a worker can see (planted through the test hook every worker runs): reported
    # once, as the launcher's own line, exit 2, and the run folder this call created is gone.
    out = tmp_path / "run"
    hook = hook_env("testkit.worker_hooks:user_error=the planted cause")
    proc = run_cli(
        "run", "--backend", "torch", "--config", CONFIG, *SMALL, "--out", str(out), env=hook
    )
    assert _one_line(proc) == "dualtrain: error: the planted cause"
    assert not out.exists()


def test_a_setup_without_a_training_step_is_refused(tmp_path):
    proc = run_cli(
        "run",
        "--backend",
        "torch",
        "--config",
        CONFIG,
        "--dry-run",
        "--set",
        "data.train_limit=100",
        "--set",
        "data.batch_size=256",
        "--set",
        "data.last_batch=drop",
    )
    assert "no training step" in _one_line(proc)


def test_idle_replicas_are_said_once(tmp_path):
    proc = run_cli(
        "run",
        "--backend",
        "torch",
        "--config",
        CONFIG,
        "--dry-run",
        "--world-size",
        "8",
        "--set",
        "data.train_limit=4",
    )
    assert proc.returncode == 0, proc.stderr
    warnings = [x for x in proc.stderr.splitlines() if x.startswith("dualtrain: warning:")]
    assert len(warnings) == 1 and "4 of the 8 replicas get no sample at any step" in warnings[0]
    proc = run_cli(
        "run",
        "--backend",
        "torch",
        "--config",
        CONFIG,
        "--dry-run",
        "--set",
        "data.train_limit=100",
    )
    assert "every epoch is one step of 100" in proc.stderr


def test_backend_and_precision_as_people_type_them():
    import json

    proc = run_cli(
        "run",
        "--backend",
        "pytorch",
        "--precision",
        "mixed_float16",
        "--config",
        CONFIG,
        "--dry-run",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["backend"] == "torch"
    proc = run_cli("run", "--backend", "tensorflw", "--config", CONFIG, "--dry-run")
    assert "did you mean 'tf'?" in _one_line(proc)


def test_shipped_configs_by_name_from_anywhere(tmp_path):
    import json

    for name in ("mnist_cnn.yaml", "mnist_cnn", "configs/mnist_cnn.yaml"):
        proc = run_cli(
            "run",
            "--backend",
            "torch",
            "--config",
            name,
            "--dry-run",
            "--json",
            "--out",
            str(tmp_path / "run"),
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["name"] == "mnist_cnn"
    proc = run_cli(
        "run", "--backend", "torch", "--config", "mnist_cnm.yaml", "--dry-run", cwd=tmp_path
    )
    line = _one_line(proc)
    assert "shipped configs, usable by name from anywhere: " in line
    assert "mnist_cnn, " in line and "digits_cnn, " in line

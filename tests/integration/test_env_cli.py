"""``dualtrain env`` and the ``env`` facts in summary.json.

Real processes throughout: the CLI with both frameworks, the CLI in a virtual environment where
torch and TensorFlow are really not installed (and one where ``import torch`` really fails), a real
short torch run. The compare report's environment table is tests/records/test_env.py.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

import dualtrain
from dualtrain.records.envinfo import ISA_FLAGS, WATCHED_ENV
from testkit.cli import ROOT, run_cli


def proc_cpu_flags() -> set[str] | None:
    """The first CPU's feature flags, read here independently of dualtrain.records.envinfo."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.split(":")[0].strip().lower() in ("flags", "features"):
            return set(line.split(":", 1)[1].split())
    return None


def have(*modules: str) -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in modules)


# ---- dualtrain env with the frameworks installed -------------------------------------------------


@pytest.mark.skipif(not have("torch", "tensorflow", "keras"), reason="needs torch and tensorflow")
def test_env_json_reports_real_values():
    settings = {"OMP_NUM_THREADS": "1", "ONEDNN_MAX_CPU_ISA": "AVX2", "TF_ENABLE_ONEDNN_OPTS": "0"}
    env = {k: v for k, v in os.environ.items() if k not in WATCHED_ENV}  # only ours are set
    res = subprocess.run(
        [sys.executable, "-m", "dualtrain", "env", "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env={**env, **settings, "PYTHONPATH": str(ROOT)},
    )
    assert res.returncode == 0, res.stderr
    facts = json.loads(res.stdout)
    assert facts["backends"] == {"torch": {"status": "ok"}, "tf": {"status": "ok"}}

    core = facts["core"]
    assert core["versions"]["python"] == platform.python_version()
    assert core["versions"]["numpy"] == np.__version__
    assert core["versions"]["dualtrain"] == dualtrain.__version__
    assert core["devices"]["logical_cores"] == os.cpu_count()
    if hasattr(os, "sched_getaffinity"):
        assert core["devices"]["usable_cores"] == len(os.sched_getaffinity(0))
    flags = proc_cpu_flags()
    if flags is not None:
        assert set(core["devices"]["isa"]) == flags & set(ISA_FLAGS)
        assert core["devices"]["isa"] == [f for f in ISA_FLAGS if f in flags]  # in ISA_FLAGS order
    assert core["settings"] == settings

    torch_version = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.strip()
    t = facts["torch"]
    assert t["versions"]["torch"] == torch_version == core["versions"]["installed"]["torch"]
    assert t["settings"]["num_threads"] == 1  # OMP_NUM_THREADS reached the backend's process
    assert t["settings"]["cpu_capability"] in (
        "DEFAULT",
        "AVX2",
        "AVX512",
        "ZVECTOR",
        "VSX",
        "SVE256",
        "NEON",
    )
    if flags is not None and "avx2" not in flags:
        assert t["settings"]["cpu_capability"] not in ("AVX2", "AVX512")
    if flags is not None and "avx512f" not in flags:
        assert t["settings"]["cpu_capability"] != "AVX512"
    assert t["devices"]["gpu_count"] == len(t["devices"]["gpus"])

    tf = facts["tf"]
    assert tf["versions"]["tensorflow"] == importlib.metadata.version("tensorflow")
    assert tf["versions"]["keras"] == importlib.metadata.version("keras")
    assert tf["settings"]["onednn_enabled"] is False  # TF_ENABLE_ONEDNN_OPTS=0 is TF's own answer
    assert tf["settings"]["mixed_precision_policy"] == "float32"


@pytest.mark.skipif(not have("torch"), reason="needs torch")
def test_env_tables_for_people():
    res = run_cli("env", "--backend", "torch", timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    titles = [ln for ln in lines if ln and not ln.startswith(" ")]
    assert titles[:3] == ["versions", "devices", "kernel settings"]
    text = res.stdout
    assert any(ln.split() == ["python", platform.python_version()] for ln in lines)
    assert "torch cpu_capability" in text and "torch num_threads" in text
    assert "Traceback" not in text + res.stderr


def test_env_usage_errors_are_one_line():
    for args in (("--backend", "jax"), ("--timeout", "0")):
        res = run_cli("env", *args, timeout=60)
        assert res.returncode == 2
        assert res.stderr.count("\n") == 1 and res.stderr.startswith("dualtrain: error: "), (
            res.stderr
        )
    assert "dualtrain env" in run_cli("--help", timeout=60).stdout


# ---- dualtrain env without the frameworks --------------------------------------------------------


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """A virtual environment with no torch, tensorflow or keras: only numpy, click, pyyaml and this
    checkout, exposed through a .pth file and symlinks into this interpreter's site-packages."""
    root = tmp_path_factory.mktemp("bare")
    venv = root / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    deps = root / "deps"
    deps.mkdir()
    ours = Path(sysconfig.get_paths()["purelib"])
    for name in ("numpy", "numpy.libs", "click", "yaml", "_yaml"):
        if (ours / name).exists():
            (deps / name).symlink_to(ours / name)
    (Path(purelib.strip()) / "dualtrain_test.pth").write_text(f"{ROOT}\n{deps}\n")
    return python


def bare_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return {**env, **extra}


def test_env_without_frameworks(bare_python, tmp_path):
    for module in ("torch", "tensorflow", "keras"):  # really not installed there
        probe = subprocess.run(
            [str(bare_python), "-c", f"import {module}"],
            capture_output=True,
            text=True,
            env=bare_env(),
            timeout=60,
        )
        assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr
    res = subprocess.run(
        [str(bare_python), "-m", "dualtrain", "env"],
        capture_output=True,
        text=True,
        env=bare_env(),
        timeout=60,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert out.startswith("versions\n") and "\ndevices\n" in out and "\nkernel settings\n" in out
    assert platform.python_version() in out and np.__version__ in out
    assert (
        "missing backends: torch (torch not installed); tf (tensorflow, keras not installed)" in out
    )
    assert "Traceback" not in out + res.stderr

    res = subprocess.run(
        [str(bare_python), "-m", "dualtrain", "env", "--json"],
        capture_output=True,
        text=True,
        env=bare_env(),
        timeout=60,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    facts = json.loads(res.stdout)
    assert facts["torch"] is None and facts["tf"] is None
    assert facts["backends"]["torch"] == {"status": "missing", "detail": "torch not installed"}
    assert facts["backends"]["tf"]["status"] == "missing"
    assert facts["core"]["versions"]["installed"] == {
        "torch": None,
        "tensorflow": None,
        "keras": None,
    }
    assert facts["core"]["versions"]["numpy"] == np.__version__


def test_env_broken_backend_is_one_line(bare_python, tmp_path):
    """A torch that is installed but fails to import: reported as broken, exit 0, no traceback."""
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        'raise ImportError("libtorch_cpu.so: cannot open shared object file")\n'
    )
    env = bare_env(PYTHONPATH=str(tmp_path / "site"))
    res = subprocess.run(
        [str(bare_python), "-m", "dualtrain", "env", "--backend", "torch"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if "torch backend" in ln)
    assert line.split(None, 2)[2] == (
        "broken: ImportError: libtorch_cpu.so: cannot open shared object file"
    )
    assert "Traceback" not in res.stdout + res.stderr


# ---- summary.json of a real run ------------------------------------------------------------------


@pytest.mark.skipif(not have("torch"), reason="needs torch")
def test_torch_run_summary_has_env(tmp_path):
    out = tmp_path / "run"
    res = run_cli(
        "run",
        "--backend",
        "torch",
        "--world-size",
        "1",
        "--out",
        str(out),
        "--set",
        "data.train_limit=64",
        "--set",
        "data.test_limit=64",
        "--set",
        "train.epochs=1",
        timeout=300,
        env={"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    )
    assert res.returncode == 0, res.stderr
    env = json.loads((out / "summary.json").read_text())["env"]
    assert set(env) == {"core", "torch"}
    assert env["core"]["versions"]["python"] == platform.python_version()
    assert env["core"]["settings"].get("MKL_ENABLE_INSTRUCTIONS") == "AVX2"
    # what the run used, not a fresh process's defaults: dualtrain's determinism settings
    s = env["torch"]["settings"]
    assert s["deterministic_algorithms"] is True and s["tf32_matmul"] is False
    assert s["tf32_cudnn"] is False
    assert env["torch"]["versions"]["torch"] == importlib.metadata.version("torch")

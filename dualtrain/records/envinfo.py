"""The facts that decide whether two runs compute the same numbers (framework-free).

``core_facts()`` reads what any process can see without importing a framework: versions, the OS, the
CPU and its instruction sets, and the environment variables that change kernels, rounding or thread
counts. Each backend adds its own facts (``dualtrain.backends.<name>.envinfo.backend_facts``, which
imports the framework). ``dualtrain env`` prints both; every run's summary.json records them under
``env``; ``dualtrain compare`` lists the ones that differ between the compared runs (docs/env.md).

Facts are grouped: ``versions``, ``devices``, ``settings`` (kernel settings). ``env`` in
summary.json is ``{"core": core_facts(), "<backend>": backend_facts()}``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
from typing import Any

import numpy as np

from dualtrain.jsonio import flatten
from dualtrain.version import __version__

GROUPS = (("versions", "versions"), ("devices", "devices"), ("settings", "kernel settings"))

#: Environment variables that change which kernels run, how they round, or how many threads split a
#: reduction. Only those that are set are recorded (docs/env.md says what each does).
WATCHED_ENV = (
    # threads: a reduction split over a different number of threads rounds differently
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
    # instruction-set caps and numerical modes of MKL / oneDNN / ATen
    "MKL_ENABLE_INSTRUCTIONS",
    "MKL_CBWR",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "ONEDNN_DEFAULT_FPMATH_MODE",
    "ATEN_CPU_CAPABILITY",
    # framework kernel switches
    "TF_ENABLE_ONEDNN_OPTS",
    "TF_DETERMINISTIC_OPS",
    "TF_CUDNN_DETERMINISTIC",
    "TF_XLA_FLAGS",
    "DUALTRAIN_TORCH_MKLDNN",
    # GPU
    "CUBLAS_WORKSPACE_CONFIG",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "CUDA_VISIBLE_DEVICES",
)

#: CPU features that select different kernels (x86 /proc/cpuinfo "flags", Arm "Features"), in the
#: order they are printed. ATen's AVX512 path needs avx512f+bw+vl+dq; bf16/vnni/amx change which
#: oneDNN kernels exist.
ISA_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512dq",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
    "asimd",
    "asimdhp",
    "fphp",
    "sve",
    "sve2",
    "bf16",
    "i8mm",
    "sme",
)

#: Distribution names a package may be installed under (importlib.metadata), first found wins.
_DISTRIBUTIONS = {
    "torch": ("torch",),
    "tensorflow": (
        "tensorflow",
        "tensorflow-cpu",
        "tensorflow-gpu",
        "tensorflow-intel",
        "tensorflow-macos",
        "tf-nightly",
        "tf-nightly-cpu",
    ),
    "keras": ("keras", "keras-nightly"),
}

#: What each backend needs, importable.
BACKEND_PACKAGES = {"torch": ("torch",), "tf": ("tensorflow", "keras")}


def installed_version(package: str) -> str | None:
    """The installed version of ``package`` (an import name), or None when it cannot be imported;
    found without importing it."""
    try:
        if importlib.util.find_spec(package) is None:
            return None
    except (ImportError, ValueError):  # a broken parent, or a module whose __spec__ is None
        return None
    for dist in _DISTRIBUTIONS.get(package, (package,)):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown version"


def missing_packages(backend: str) -> list[str]:
    """The packages ``backend`` needs that are not installed (empty: it can be tried)."""
    return [p for p in BACKEND_PACKAGES[backend] if installed_version(p) is None]


def _cpuinfo(path: str = "/proc/cpuinfo") -> dict[str, str]:
    """The first processor's block of /proc/cpuinfo (empty where there is none: not Linux)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if out.get("flags") or out.get("features"):
                break  # the first processor's block is enough
            continue
        key, sep, value = line.partition(":")
        if sep:
            out.setdefault(key.strip().lower(), value.strip())
    return out


def cpu_flags(info: dict[str, str] | None = None) -> set[str]:
    """Every feature flag of the first CPU (x86 ``flags``, Arm ``features``); empty off Linux."""
    info = _cpuinfo() if info is None else info
    return set((info.get("flags") or info.get("features") or "").split())


def _cpu_model(info: dict[str, str]) -> str:
    for key in ("model name", "hardware", "cpu model", "processor"):
        value = info.get(key, "")
        if value and not value.isdigit():
            return value
    if info.get("cpu implementer"):  # Arm: no model name, the implementer/part ids instead
        return f"implementer {info['cpu implementer']} part {info.get('cpu part', '?')}"
    return platform.processor() or platform.machine() or "unknown"


def _numpy() -> tuple[str | None, str | None]:
    blas = None
    try:
        deps = np.show_config(mode="dicts").get("Build Dependencies", {})  # numpy >= 1.25
        info = deps.get("blas", {})
        if info.get("name"):
            blas = f"{info['name']} {info.get('version', '')}".strip()
    except Exception:  # older numpy prints instead; the BLAS is a nice-to-have
        blas = None
    return np.__version__, blas


def _libc() -> str | None:
    name, version = platform.libc_ver()
    return f"{name} {version}" if name else None


def usable_cores() -> int | None:
    """The cores this process may run on (os.sched_getaffinity; None where unsupported)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def core_facts(environ: dict[str, str] | os._Environ | None = None) -> dict[str, Any]:
    """The framework-free facts. ``environ``: where the watched variables are read (os.environ)."""
    environ = os.environ if environ is None else environ
    info = _cpuinfo()
    flags = cpu_flags(info)
    numpy_version, blas = _numpy()
    return {
        "versions": {
            "dualtrain": __version__,
            "python": platform.python_version(),
            "numpy": numpy_version,
            "numpy_blas": blas,
            "os": f"{platform.system()} {platform.release()}".strip(),
            "libc": _libc(),
            "installed": {p: installed_version(p) for p in ("torch", "tensorflow", "keras")},
        },
        "devices": {
            "cpu": _cpu_model(info),
            "arch": platform.machine(),
            "logical_cores": os.cpu_count(),
            "usable_cores": usable_cores(),
            "isa": [f for f in ISA_FLAGS if f in flags] if flags else None,
        },
        "settings": {k: environ[k] for k in WATCHED_ENV if k in environ},
    }


# ---- differences between runs --------------------------------------------------------------------


def show(value: Any) -> str:
    """A fact as people read it: None -> "-", booleans yes/no, lists space-separated, GPUs by
    name."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        if "name" in value:
            cc = value.get("compute_capability")
            return f"{value['name']}" + (f" (sm {cc})" if cc else "")
        return ", ".join(f"{k}={show(v)}" for k, v in value.items()) or "-"
    if isinstance(value, (list, tuple)):
        return (
            " ".join(show(v) for v in value)
            if all(not isinstance(v, dict) for v in value)
            else "; ".join(show(v) for v in value)
        ) or "none"
    return str(value)


UNSET = "(unset)"


def env_differences(envs: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    """The env facts that differ between runs, like compared with like.

    ``envs``: run key ("a", "b", "reference_a", ...) -> that run's summary ``env`` (None if it has
    none). Core facts are compared across every run that has them; a backend's facts only between
    the runs of that backend (a torch run has no tensorflow facts, which is not a difference).

    Returns {"compared": [run keys with env facts], "missing": [run keys without],
    "differences": [{"fact": "core.settings.OMP_NUM_THREADS", "scope": "core",
    "values": {run key: value, ...}}]}: ``values`` holds the runs of that scope only; a variable set
    in one run and not in another shows as "(unset)".
    """
    have = {k: e for k, e in envs.items() if isinstance(e, dict) and e}
    missing = [k for k in envs if k not in have]
    scopes: dict[str, list[str]] = {}
    for key, env in have.items():
        for scope in env:
            if isinstance(env[scope], dict):
                scopes.setdefault(scope, []).append(key)
    diffs = []
    for scope in sorted(scopes, key=lambda s: (s != "core", s)):
        runs = scopes[scope]
        if len(runs) < 2:
            continue
        flat = {k: flatten(have[k][scope]) for k in runs}
        names: list[str] = []
        for k in runs:
            names += [n for n in flat[k] if n not in names]
        for name in names:
            unset = UNSET if name.startswith("settings.") and scope == "core" else None
            values = {k: flat[k].get(name, unset) for k in runs}
            if len({_key(v) for v in values.values()}) > 1:
                diffs.append({"fact": f"{scope}.{name}", "scope": scope, "values": values})
    return {"compared": list(have), "missing": missing, "differences": diffs}


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)

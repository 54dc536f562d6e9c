"""torch's facts for ``dualtrain env`` and summary.json ``env.torch`` (docs/env.md).

``backend_facts()`` reads the state of this process: in a worker, after ``configure_determinism``
and ``torch.set_num_threads`` (what the run used); in ``python -m dualtrain.backends.torch.tools
env``, a fresh process's defaults.
"""

from __future__ import annotations

import re
from typing import Any

import torch


def _search(pattern: str, text: str) -> str | None:
    m = re.search(pattern, text, re.MULTILINE)
    return m.group(1).strip() if m else None


def _nccl() -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # CPU builds have no NCCL binding
        return None
    return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)


def _gpus(details: bool) -> tuple[int, list[dict[str, Any]] | None]:
    """(count, descriptions) of the visible CUDA devices. ``details=False``: no descriptions (None),
    so that a CPU run does not initialise CUDA just to describe the machine."""
    try:
        if not torch.cuda.is_available():
            return 0, []
        n = torch.cuda.device_count()
        if not details:
            return n, None
        out = []
        for i in range(n):
            p = torch.cuda.get_device_properties(i)
            out.append(
                {
                    "name": p.name,
                    "compute_capability": f"{p.major}.{p.minor}",
                    "memory_gib": round(p.total_memory / 2**30, 1),
                }
            )
        return n, out
    except Exception as exc:  # a broken driver: say so, do not fail the run
        return 0, [{"name": f"error: {type(exc).__name__}: {exc}"[:200]}]


def backend_facts(*, gpu_details: bool = True) -> dict[str, Any]:
    """torch versions, devices and kernel settings, as this process has them now."""
    parallel = torch.__config__.parallel_info()
    config = torch.__config__.show()
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    gpu_count, gpus = _gpus(gpu_details)
    return {
        "versions": {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "cudnn": cudnn,
            "nccl": _nccl(),
            "hip": getattr(torch.version, "hip", None),
            "mkl": _search(r"Math Kernel Library Version (\d[\d.]*)", parallel),
            "onednn": _search(r"MKL-DNN (v\S+)", parallel),
            "blas": _search(r"BLAS_INFO=([^,\s]+)", config),
        },
        "devices": {
            "gpu_count": gpu_count,
            "gpus": gpus,
        },
        "settings": {
            # the ISA ATen's vectorised CPU kernels actually use (ATEN_CPU_CAPABILITY caps it)
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "num_threads": torch.get_num_threads(),
            "num_interop_threads": torch.get_num_interop_threads(),
            "parallel_backend": _search(r"ATen parallel backend: (.+)$", parallel),
            "mkldnn_available": torch.backends.mkldnn.is_available(),
            "mkldnn_enabled": bool(torch.backends.mkldnn.enabled),
            "mkl_available": torch.backends.mkl.is_available(),
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
            "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
        },
    }

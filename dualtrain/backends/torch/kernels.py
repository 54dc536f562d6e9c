"""torch's products in a low precision, for the kernel calibration (dualtrain.core.kernels), and
which implementation runs them on this CPU."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from dualtrain.core import kernels

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def product(kind: str, a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
    """The product as the autocast path computes it (the inputs in ``dtype``, the output too)."""
    d = _DTYPES[dtype]
    ta, tb = (
        torch.from_numpy(np.ascontiguousarray(a)).to(d),
        torch.from_numpy(np.ascontiguousarray(b)).to(d),
    )
    with torch.no_grad():
        out = ta @ tb if kind == "matmul" else F.conv2d(ta, tb)
    return out.to(torch.float64).numpy()


def _onednn(dtype: str) -> bool:
    """Whether torch hands a ``dtype`` product to oneDNN here: mkldnn enabled and oneDNN supports
    the dtype on this CPU (torch's own check: at::native::mkldnn_bf16_device_check and its fp16
    twin), else ATen's reference kernels (float32 accumulation, rounded once)."""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return False
    check = {"bf16": "_is_mkldnn_bf16_supported", "fp16": "_is_mkldnn_fp16_supported"}[dtype]
    try:
        return bool(getattr(torch.ops.mkldnn, check)())
    except Exception:  # an op missing in some build: say ATen
        return False


def static_facts(flags: set[str]) -> dict[str, Any]:
    """Which implementation runs torch's low-precision products here (dualtrain.core.kernels)."""
    return kernels.static_facts(flags, _onednn, "ATen")

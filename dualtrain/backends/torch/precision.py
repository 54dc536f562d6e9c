"""spec.precision -> (autocast context, GradScaler or None): the one place that names the dtypes."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from dualtrain.spec import Precision, PrecisionSpec

_AUTOCAST = {Precision.FP16: torch.float16, Precision.BF16: torch.bfloat16}


def precision_setup(
    precision: PrecisionSpec, device_type: str
) -> tuple[Any, torch.amp.GradScaler | None]:
    """Return ``(autocast, scaler)``.

    ``autocast`` is a reusable context manager: ``torch.autocast(device_type, dtype)`` for
    fp16/bf16, a null context for fp32. ``scaler`` is a ``torch.amp.GradScaler`` configured from
    ``precision.loss_scale`` for fp16 (dynamic loss scaling), None otherwise (scale 1, never skips).
    """
    dtype = _AUTOCAST.get(precision.dtype)
    if dtype is None:
        return contextlib.nullcontext(), None
    autocast = torch.autocast(device_type=device_type, dtype=dtype)
    if precision.dtype is not Precision.FP16:
        return autocast, None
    ls = precision.loss_scale
    scaler = torch.amp.GradScaler(
        device_type,
        init_scale=ls.init,
        growth_factor=ls.growth_factor,
        backoff_factor=ls.backoff_factor,
        growth_interval=ls.growth_interval,
    )
    return autocast, scaler

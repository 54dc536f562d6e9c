"""The exponential moving average of the weights (train.ema), defined once for both backends.

When: after optimizer step ``s`` (1-based; a step fp16 skipped counts, as the schedule's do), the
average is a copy of the weights while ``s <= max(start, 1)`` (the first update copies, as
Keras's ``use_ema`` and torch's AveragedModel do); afterwards it is updated every ``every`` steps,
counted from ``start``.

What: every trainable parameter, ``ema <- ema + (1 - decay) * (w - ema)``: torch's
``ema.add_(w - ema, alpha=1 - decay)`` (one rounding, alpha rounded to the parameter dtype),
which :func:`update` writes in the update rules' array namespace (``Ops.fma``) for the TF
backend. Batchnorm running statistics are not averaged: the averaged weights carry the live
model's statistics (Keras's ``use_ema`` averages trainable variables only; torch's AveragedModel
keeps its own, stale copies unless ``use_buffers=True``). docs/spec.md.
"""

from __future__ import annotations

from typing import Any

from dualtrain.core.ops import Ops
from dualtrain.spec import EmaSpec

COPY, UPDATE = "copy", "update"


def action(spec: EmaSpec, step: int) -> str | None:
    """What happens to the average after optimizer step ``step`` (1-based)."""
    if step <= max(spec.start, 1):
        return COPY
    if (step - spec.start) % spec.every == 0:
        return UPDATE
    return None


def update(ops: Ops, ema: Any, w: Any, decay: float) -> Any:
    """One update of one tensor (torch: ``ema.add_(w - ema, alpha=1 - decay)``)."""
    return ops.fma(ema, 1.0 - decay, w - ema)

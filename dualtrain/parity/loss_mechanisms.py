"""The known mechanisms behind a loss that differs while every layer's output agrees
(dualtrain.parity.taps): the spec's loss (dualtrain.core.losses.reference) on the shared outputs
against each side's per-sample losses, and the other side's as a constant factor (0.5: the
1/2 (o - t)^2 convention) or as label smoothing fitted over every sample and checked on each.
Framework-free, float64 NumPy."""

from __future__ import annotations

import numpy as np

from dualtrain.core import losses
from dualtrain.parity.layer_mechanisms import FITS
from dualtrain.parity.mechanisms import rel
from dualtrain.spec import Loss


def loss_mechanism(
    labels: tuple[str, str],
    loss: Loss,
    out: np.ndarray,
    y: np.ndarray,
    sides: tuple[np.ndarray, np.ndarray],
) -> str:
    """Where one side's per-sample losses are the spec's (dualtrain.core.losses.reference) on the
    shared outputs: the other's, as a constant factor or as label smoothing, in words; else ""."""
    ref = losses.reference(loss, out, y)[0]
    for k in (0, 1):
        mine, other = sides[k], sides[1 - k]
        if rel(ref, mine) > FITS or rel(ref, other) <= FITS:
            continue
        who = labels[1 - k]
        ratio = other / np.where(ref == 0, np.nan, ref)
        ratio = ratio[np.isfinite(ratio)]
        if ratio.size >= 2 and float(np.ptp(ratio)) <= FITS * abs(float(ratio.mean())):
            r = float(ratio.mean())
            half = " (the 1/2 (o - t)^2 convention)" if abs(r - 0.5) < 1e-12 else ""
            return f"{who} departs from the spec's rule: its loss is the spec's x {r:.6g}{half}"
        return _smoothing(who, loss, out, y, ref, other)
    return ""


def _smoothing(
    who: str, loss: Loss, out: np.ndarray, y: np.ndarray, ref: np.ndarray, other: np.ndarray
) -> str:
    """``other`` as the loss with smoothed labels: linear in the smoothing, so one factor fitted
    over every sample, and named only where it reproduces each."""
    if loss is Loss.CROSS_ENTROPY:
        m = out.max(axis=1, keepdims=True)
        lse = np.log(np.exp(out - m).sum(axis=1)) + m[:, 0]
        full = (lse[:, None] - out).mean(axis=1)  # every class's share, label_smoothing = 1
    elif loss is Loss.BINARY_CROSS_ENTROPY:
        full = losses.reference(loss, out, np.full_like(np.asarray(y, np.float64), 0.5))[0]
    else:
        return ""
    d, step = other - ref, full - ref
    if len(d) < 2 or not np.any(step):
        return ""
    eps = float(d @ step / (step @ step))
    if rel(d, eps * step) > 1e-6:
        return ""
    return (
        f"{who} departs from the spec's rule: label smoothing {eps:.3g} (targets t (1 - s) + s / "
        f"{'K' if loss is Loss.CROSS_ENTROPY else '2'}, Keras's label_smoothing=s)"
    )

"""The tolerance table: one row per precision, the only place compare's thresholds live.

docs/parity.md documents every number and why it was chosen. A comparison of two runs with different
precisions uses the strictest row of the two (and the ``spec`` check fails anyway).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Tolerance:
    precision: str
    loss_early: float
    """Absolute per-step |loss_a - loss_b| allowed over the first ``early_steps`` steps."""
    traj_abs_floor: float
    """Absolute floor under the noise-floor envelope (the twin can agree to the last bit early on)."""
    traj_fixed: float
    """Absolute per-step |loss diff| bound used when no noise-floor twin is available."""
    weights_floor: float
    """Relative floor under the twin's final-weights difference."""
    weights_fixed: float
    """Per-tensor relative final-weights difference allowed when no twin is available."""
    early_steps: int = 50
    traj_lag: int = 0
    """Look-ahead of the noise-floor envelope, in steps: the bound at step k uses the twin's largest
    |loss diff| up to step k + traj_lag. 0 (a plain running max) since the twin also runs on another
    world size (dualtrain.compare.backends.twin_world_size) and so carries per-step rounding noise
    like the cross pair; with a one-ulp-only twin the cross pair entered chaotic growth ~20 steps
    earlier and needed a 25-step look-ahead (docs/parity.md)."""
    factor: float = 10.0
    """Cross-backend divergence may be this many times the noise floor (trajectory, final weights)."""
    eval_pp: float = 0.3
    """Test-accuracy difference in percentage points (final and at every eval step)."""
    lr_rel: float = 1e-12
    """Relative per-step learning-rate difference (both sides compute it with the same Python code)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(precision="fp32", loss_early=1e-5, traj_abs_floor=1e-6, traj_fixed=5e-2,
                      weights_floor=1e-6, weights_fixed=1e-1),
    "fp16": Tolerance(precision="fp16", loss_early=1e-2, traj_abs_floor=1e-3, traj_fixed=1e-1,
                      weights_floor=1e-3, weights_fixed=2e-1),
    "bf16": Tolerance(precision="bf16", loss_early=5e-2, traj_abs_floor=5e-3, traj_fixed=2e-1,
                      weights_floor=5e-3, weights_fixed=3e-1),
}

_STRICTNESS = ["fp32", "fp16", "bf16"]  # strictest first


def precision_of(spec: dict[str, Any]) -> str:
    p = spec.get("precision", {})
    dtype = p.get("dtype", "fp32") if isinstance(p, dict) else p
    return str(dtype or "fp32")


def tolerance_for(*precisions: str) -> Tolerance:
    """The strictest row among ``precisions`` (unknown names fall back to fp32, the strictest)."""
    known = [p for p in precisions if p in TOLERANCES]
    if not known:
        return TOLERANCES["fp32"]
    return TOLERANCES[min(known, key=_STRICTNESS.index)]

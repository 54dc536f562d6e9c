"""The tolerance table: the only place compare's thresholds live.

Two kinds of bound (docs/parity.md §7 documents every number and the measurements behind it):

* :data:`REFERENCE`: the **semantic** check. Both backends run the spec in float64 (the reference pair);
  they must agree to rounding over the whole run. A disagreement beyond these bounds means the two
  backends compute a different training run (another update rule, loss, data order...).
* :data:`TOLERANCES`, one row per requested precision: the **numerics** check. The noise model is each
  backend's own distance to its float64 run: how far the requested precision's rounding alone moves a
  run away from the exact one. The cross-backend difference may be at most ``factor`` times the smaller
  of the two (with an absolute floor), so it holds on any CPU: a machine whose kernels round
  differently moves both distances, and the bound with them.

A comparison of two runs with different precisions uses the strictest row of the two (and the ``spec``
check fails anyway).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ReferenceBound:
    """What "agrees to rounding" means for two float64 runs of the same spec on the two backends."""

    loss_abs: float = 1e-10
    """Per-step |loss_torch - loss_tf| of the fp64 pair (absolute; losses are O(0.01-3))."""
    weights_rel: float = 1e-10
    """Per-tensor ||w_torch - w_tf|| / ||w_torch|| of the final fp64 weights."""
    eval_loss_abs: float = 1e-10
    """|eval loss difference| at every evaluation (test accuracy must be identical)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


REFERENCE = ReferenceBound()


@dataclass(frozen=True)
class Tolerance:
    precision: str
    traj_abs_floor: float
    """Absolute floor under the noise model (the first steps, where both runs are still within a few
    ulps of their fp64 runs)."""
    traj_fixed: float
    """Absolute per-step |loss diff| bound used when no fp64 reference ran (``--reference none``)."""
    weights_floor: float
    """Relative floor under the noise model's final-weights difference."""
    weights_fixed: float
    """Per-tensor relative final-weights difference allowed when no fp64 reference ran."""
    factor: float = 10.0
    """The cross-backend difference may be this many times the noise model (trajectory, weights)."""
    eval_pp: float = 0.3
    """Test-accuracy difference in percentage points (final and at every eval step): the floor under
    ``factor`` x the larger backend's accuracy distance to its fp64 run, or the bound itself without
    a reference."""
    lr_rel: float = 1e-12
    """Relative per-step learning-rate difference (both sides compute it with the same Python code)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


TOLERANCES: dict[str, Tolerance] = {
    # fp64 runs are the reference pair themselves: their result checks are the REFERENCE bounds; the
    # fixed values below only apply where a fp64 pair is compared without them (never in practice).
    "fp64": Tolerance(precision="fp64", traj_abs_floor=REFERENCE.loss_abs, traj_fixed=REFERENCE.loss_abs,
                      weights_floor=REFERENCE.weights_rel, weights_fixed=REFERENCE.weights_rel),
    "fp32": Tolerance(precision="fp32", traj_abs_floor=1e-6, traj_fixed=5e-2,
                      weights_floor=1e-6, weights_fixed=1e-1),
    "fp16": Tolerance(precision="fp16", traj_abs_floor=1e-3, traj_fixed=1e-1,
                      weights_floor=1e-3, weights_fixed=2e-1),
    "bf16": Tolerance(precision="bf16", traj_abs_floor=5e-3, traj_fixed=2e-1,
                      weights_floor=5e-3, weights_fixed=3e-1),
}

_STRICTNESS = ["fp64", "fp32", "fp16", "bf16"]  # strictest first


def precision_of(spec: dict[str, Any]) -> str:
    p = spec.get("precision", {})
    dtype = p.get("dtype", "fp32") if isinstance(p, dict) else p
    return str(dtype or "fp32")


def tolerance_for(*precisions: str) -> Tolerance:
    """The strictest row among ``precisions`` (unknown names fall back to fp32)."""
    known = [p for p in precisions if p in TOLERANCES]
    if not known:
        return TOLERANCES["fp32"]
    return TOLERANCES[min(known, key=_STRICTNESS.index)]

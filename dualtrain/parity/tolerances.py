"""The tolerance table: the only place compare's thresholds live.

Two kinds of bound (docs/parity.md §7 documents every number and the measurements behind it):

* :data:`REFERENCE`: the **semantic** check. Both backends run the spec in float64 (the reference
  pair); they must agree to rounding over the whole run. A disagreement beyond these bounds means
  the two backends compute a different training run (another update rule, loss, data order...).
* :data:`TOLERANCES`, one row per requested precision: the **numerics** check. The noise model is
  each backend's own distance to its float64 run: how far the requested precision's rounding alone
  moves a run away from the exact one. The cross-backend difference may be at most ``factor`` times
  the larger of the two (with an absolute floor), so it holds on any CPU: a machine whose kernels
  round differently moves both distances, and the bound with them. With a reference pair these
  whole-run checks cannot fail (docs/parity.md §7): they describe the drift, they do not judge the
  precision.
* :data:`LOCAL`, one row per precision: the checks that judge the requested precision.
  Teacher-forced one-step probes (dualtrain.runtime.probes) give each backend's local error against
  the fp64 step from the same state; each is bounded a priori from the precision's unit roundoff,
  and against the other backend's. Neither bound is computed from the run being judged. With them,
  ``convergence``: each run's test accuracy against its own fp64 run's.

A comparison of two runs with different precisions uses the strictest row of the two (and the
``spec`` check fails anyway).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ReferenceBound:
    """What "agrees to rounding" means for two float64 runs of the same spec on the two backends."""

    loss_abs: float = 1e-10
    """Per-step |loss_torch - loss_tf| of the fp64 pair: absolute for losses up to 1 (cross-entropy
    is O(0.01-3)), relative above (a regression loss of 20,000 carries float64 rounding of ~4e-12
    absolute)."""
    weights_rel: float = 1e-10
    """Per-tensor ||w_torch - w_tf|| / ||w_torch|| of the final fp64 weights."""
    eval_loss_abs: float = 1e-10
    """|eval loss difference| at every evaluation (relative above 1, as loss_abs), of the test and
    the validation split (accuracy must be identical; an mae within this bound)."""
    twin_factor: float = 100.0
    """Where training amplifies rounding past the fixed bounds above (a wide model, many steps, an
    optimizer that normalises small gradients), each bound becomes ``twin_factor`` times what the
    **rounding twin** makes of one rounding: the reference run again on its own backend from the
    same initial weights, every element one ulp away (:mod:`dualtrain.parity.twin`). The pair
    differs by rounding at every step, the twin by one rounding once; measured (tools/
    reference_sweep.py: width 16-1024, depth 1-6, 10-500 steps, each optimizer), the pair stays
    within 1.65x of the twin wherever one ran, under the default and the avx2 kernels, and a
    porting mistake stands 6e8x or more above it wherever training is not chaotic; where it is
    (RMSprop at width 384: pair and twin both O(0.1)), the first steps judge, where the twin is
    still at 1e-16 (docs/parity.md §7)."""

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
    """Absolute per-step |loss diff| bound used when no fp64 reference ran
    (``--reference none``)."""
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
    """Relative per-step learning-rate difference (both sides compute it with the same Python
    code)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


TOLERANCES: dict[str, Tolerance] = {
    # fp64 runs are the reference pair themselves: their result checks are the REFERENCE bounds; the
    # fixed values below only apply where a fp64 pair is compared without them (never in practice).
    "fp64": Tolerance(
        precision="fp64",
        traj_abs_floor=REFERENCE.loss_abs,
        traj_fixed=REFERENCE.loss_abs,
        weights_floor=REFERENCE.weights_rel,
        weights_fixed=REFERENCE.weights_rel,
    ),
    "fp32": Tolerance(
        precision="fp32",
        traj_abs_floor=1e-6,
        traj_fixed=5e-2,
        weights_floor=1e-6,
        weights_fixed=1e-1,
    ),
    "fp16": Tolerance(
        precision="fp16",
        traj_abs_floor=1e-3,
        traj_fixed=1e-1,
        weights_floor=1e-3,
        weights_fixed=2e-1,
    ),
    "bf16": Tolerance(
        precision="bf16",
        traj_abs_floor=5e-3,
        traj_fixed=2e-1,
        weights_floor=5e-3,
        weights_fixed=3e-1,
    ),
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


#: Unit roundoff (half an ulp of 1) of the compute precision of each path.
UNIT_ROUNDOFF = {"fp64": 2.0**-53, "fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8}


@dataclass(frozen=True)
class LocalBound:
    """Bounds on the one-step (local) errors of one precision path (dualtrain.parity.local), all
    relative, ``u`` the compute precision's unit roundoff, ``u_param`` the parameter dtype's
    (float32 for fp32, fp16 and bf16: the update rule always runs in float32).

    A priori, at every probe step and for each backend: loss <= ``loss_c`` u;
    gradient <= ``grad_c`` u; update <= its rounding floor (u_param ||W_new|| / ||W_new - W_pre||:
    what rounding the new weights to float32 alone can do, a hard bound) + ``update_c`` u_param.
    Cross-backend, over all probe steps: the root mean square of one backend's errors <= ``ratio`` x
    max(the other backend's, a floor: ``loss_floor`` u, ``grad_floor`` u, the rms rounding floor
    for the update). docs/parity.md §7 has the measurements behind every number."""

    precision: str
    u: float
    """The compute precision's unit roundoff (:data:`UNIT_ROUNDOFF`)."""
    loss_c: float
    """The loss's a priori bound, in units of ``u``."""
    grad_c: float
    """The gradient's a priori bound, in units of ``u``."""
    loss_floor: float
    """The floor under the other backend's loss error in the cross bound, in units of ``u``."""
    grad_floor: float
    """The floor under the other backend's gradient error in the cross bound, in units of ``u``."""
    update_c: float = 32.0
    """The update's a priori bound over its rounding floor, in units of ``u_param``."""
    ratio: float = 4.0
    """Cross-backend: one backend's rms error over the probes may be this many times the other's
    (or its floor)."""
    accuracy_pp: float = 1.0
    """convergence: a run's final test accuracy may be at most this many percentage points below its
    own fp64 run's."""
    u_param: float = 2.0**-24
    """The parameter dtype's unit roundoff: float32's for fp32, fp16 and bf16 (the update rule
    runs in float32)."""
    grad_lambda: float = 4.0
    """The gradient's accumulation allowance: each tensor's error is judged against its absolute
    scale ||A_t|| x (1 + ``grad_lambda`` sqrt(n_t) u_param / (``grad_c`` u)), n_t the terms each of
    its elements sums (batch x output positions; dualtrain.backends.torch.condition). Rounding a
    sum of n terms moves it by about sqrt(n) u times the sum of their absolute values, with
    probability >= 1 - 2n exp(-lambda^2 / 2) for a bound of lambda sqrt(n) u (Higham and Mary,
    SIAM J. Sci. Comput. 41(5), 2019); the sums accumulate in float32 under every precision."""

    loss_path_c: float = 8.0
    """The per-sample losses' own rounding in :meth:`loss_path` (a logsumexp and a subtraction in
    float32: a few u_param each)."""

    def loss_path(self, count: int) -> float:
        """The a priori bound on the loss path's own error, relative to the loss's terms: the loss
        runs in float32 from the outputs on in every path (docs/parity.md §3), so a correct one
        rounds each per-sample loss by a few u_param (``loss_path_c``) and their sum over at most
        ``count`` samples by ``grad_lambda`` sqrt(count) u_param (Higham and Mary's probabilistic
        bound, as the gradient's accumulation allowance). A loss path that rounds to bfloat16 or
        float16 anywhere is off by 2^-9 or 2^-12 of its terms: 500x this bound at a batch of
        128."""
        return (self.loss_path_c + self.grad_lambda * count**0.5) * self.u_param

    def grad_scale(self, terms: float) -> float:
        """The factor on a tensor's absolute gradient scale for its accumulation length
        ``terms``."""
        return 1.0 + self._accumulation(terms) / (self.grad_c * self.u)

    def grad_cross_floor(self, terms: float) -> float:
        """The cross floor of one tensor's gradient error (in its scaled units): ``grad_floor`` u
        plus the accumulation allowance, which is where correct kernels differ (the order and
        blocking of the sum is theirs to choose: measured, oneDNN's fp32 weight gradient of a
        one-channel conv over 100,352 positions at 0.46 sqrt(n) u, TF's at 0.01 sqrt(n) u)."""
        return (self.grad_floor * self.u + self._accumulation(terms)) / self.grad_scale(terms)

    def loss_terms(self, loss_abs: float) -> float:
        """What the loss's absolute scale A_L adds to the loss error's denominator: the loss's own
        subtraction (logsumexp z - z_y) runs in float32 under every precision (docs/parity.md §3),
        so its correct rounding is u_param relative to its terms, which is A_L u_param / u in units
        of this path's u. (A loss near zero cancels; a bf16 path's logits error reaches the loss
        through the softmax's p - y, which vanishes there, so the path's u never multiplies A_L.)"""
        return loss_abs * self.u_param / self.u

    def _accumulation(self, terms: float) -> float:
        return self.grad_lambda * terms**0.5 * self.u_param

    def a_priori(self, quantity: str, rounding_floor: float = 0.0) -> float:
        if quantity == "update":
            return rounding_floor + self.update_c * self.u_param
        return {"loss": self.loss_c, "grad": self.grad_c}[quantity] * self.u

    def cross_floor(self, quantity: str, rounding_floor_rms: float = 0.0) -> float:
        if quantity == "update":
            return rounding_floor_rms
        return {"loss": self.loss_floor, "grad": self.grad_floor}[quantity] * self.u

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


LOCAL: dict[str, LocalBound] = {
    # fp32 floors: the loss and gradient errors of a correct fp32 step are a few u, and which
    # backend happens to be the more accurate one varies from probe to probe (measured rms ratios up
    # to 1.7): a backend is compared with the other only beyond 4 u.
    "fp32": LocalBound(
        "fp32",
        UNIT_ROUNDOFF["fp32"],
        loss_c=32,
        grad_c=128,
        loss_floor=4,
        grad_floor=4,
        accuracy_pp=1.0,
    ),
    # fp16 loss floor: Keras's mixed_float16 runs every op of a layer in float16, torch's CPU
    # autocast only the matmuls and convolutions (docs/parity.md §3), so tf's fp16 forward rounds
    # more by design: measured up to 3.2x torch's loss rms (8.5e-5 = 0.17 u,
    # configs/pytorch_examples_mnist).
    "fp16": LocalBound(
        "fp16",
        UNIT_ROUNDOFF["fp16"],
        loss_c=16,
        grad_c=128,
        loss_floor=0.25,
        grad_floor=2,
        accuracy_pp=2.0,
    ),
    "bf16": LocalBound(
        "bf16",
        UNIT_ROUNDOFF["bf16"],
        loss_c=16,
        grad_c=32,
        loss_floor=0.02,
        grad_floor=1,
        accuracy_pp=3.0,
    ),
}

"""Local (one-step) errors of the requested precision, from the teacher-forced probes
(dualtrain.runtime.probes).

For every probe step k the fp64 reference run recorded its state before step k (weights, batchnorm
statistics, optimizer slots, applied-update count) and the exact (float64) step k from that state
rounded to float32: its all-reduced gradient and loss. Each requested-precision run loaded the same
rounded state and ran step k itself. Per backend X and probe step, three relative errors:

* ``loss``:   |L_X - L_64| / (|L_64| + A_L u_param / u): the forward pass (model and loss). A_L
  is the loss's absolute scale, the mean over the batch of the magnitudes of the terms each
  per-sample loss subtracts (cross-entropy: |logsumexp z| + |z_y|), recorded by the fp64 run
  (StepOut.abs_loss): a loss near zero (a well-fit batch) is a cancellation, and the float32
  subtraction's correct rounding is u_param relative to its terms, not to the loss
  (configs/digits_cnn.yaml's late steps: L ~ 1e-3 with logits ~ 10). The path's own u does not
  multiply A_L (LocalBound.loss_terms), so a loss computed in bf16 still fails;
* ``grad``:   max over parameter tensors t of ||g_X,t - g64,t|| / S_t: the all-reduced, unscaled
  gradient (backward, all-reduce, loss-scale unscaling), each tensor against its own scale. S_t is
  ||A_t||, the gradient's absolute scale (the sum of |input| x |output gradient| over the batch,
  recorded by the fp64 run: dualtrain.backends.torch.condition), which bounds a correct
  implementation's rounding of a sum whose terms cancel, times the accumulation allowance for the
  n_t terms each element sums (LocalBound.grad_scale); ||g64,t|| for a tensor without a recorded
  scale (A_t >= |g64,t| componentwise);
* ``update``: ||W_X - U(fl(state), g_X)|| / ||U(fl(state), g_X) - fl(W_pre)||: what X's optimizer
  did with X's own gradient against the exact (float64) update rule applied to that same gradient
  from the state X loaded (dualtrain.core.optim_ref; clipping included). The gradient's rounding is
  the grad error's business, so this one sees only the update's arithmetic.

Nothing here is measured against the run being judged: every error is the distance of one step of
the requested precision from an exact step from the same state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.core import optim_ref
from dualtrain.core.weights import Weights
from dualtrain.parity.tolerances import LocalBound
from dualtrain.runtime import probes
from dualtrain.spec import OptimizerSpec

QUANTITIES = ("loss", "grad", "update")
WHAT = {"loss": "forward (loss)", "grad": "gradient", "update": "update rule"}


@dataclass
class Probe:
    """One probe step of one backend: its errors against the exact step."""

    step: int
    errors: dict[str, float]
    skipped: bool
    """The step was skipped (fp16 overflow) by this run or the reference: no errors then."""
    rounding_floor: float
    """The update error that rounding the updated weights to the parameter dtype alone can cause:
    u(param) x ||W_new|| / ||W_new - W_pre||."""
    worst_tensor: dict[str, str] = field(default_factory=dict)
    """Per quantity (grad, update): the tensor with the largest relative error."""
    grad_tensors: dict[str, float] = field(default_factory=dict)
    """Each tensor's gradient error against its scale (``errors["grad"]`` is their max)."""
    grad_floors: dict[str, float] = field(default_factory=dict)
    """Each tensor's cross floor, in the same units (tensors with a recorded absolute scale)."""
    loss_signed: float = math.nan
    """L_X - L_64, signed (``errors["loss"]`` is its magnitude over :attr:`loss_scale`)."""
    loss_scale: float = math.nan
    """The loss error's denominator: |L_64| + the loss's absolute scale term."""
    loss_path: float = math.nan
    """The loss path's own error: |L_X - the exact loss of X's own outputs| over (|that loss| + the
    loss's absolute scale), NaN where the run did not record its outputs' exact loss. The
    forward's kernels do not enter it: only what the path does from the outputs on (the cast,
    the per-sample losses, their sum and its normalisation)."""
    loss_path_bound: float = math.nan
    """Its a priori bound (LocalBound.loss_path)."""
    sensitivity: dict[str, float] = field(default_factory=dict)
    """Per kind of product, the loss's first-order change when every product of that kind is
    scaled by (1 + e), per unit e (recorded by the fp64 run; dualtrain.core.kernels)."""


def _norm(ws: Weights, keys: list[str]) -> float:
    return math.sqrt(sum(float(np.sum(np.square(np.asarray(ws[k], np.float64)))) for k in keys))


def _diff(a: Weights, b: Weights, keys: list[str]) -> Weights:
    return {k: np.asarray(a[k], np.float64) - np.asarray(b[k], np.float64) for k in keys}


def _rel(num: float, den: float) -> float:
    if math.isnan(num):
        return math.inf
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def _worst(err: Weights, ref: Weights, keys: list[str]) -> str:
    def rel(k: str) -> float:
        return _rel(
            float(np.linalg.norm(err[k])), float(np.linalg.norm(np.asarray(ref[k], np.float64)))
        )

    return max(keys, key=rel) if keys else ""


def measure(
    run_dir: str | Path,
    reference_dir: str | Path,
    opt: OptimizerSpec,
    bound: LocalBound | None = None,
) -> list[Probe] | None:
    """The probes of ``run_dir`` against the fp64 run that recorded them; None where either has no
    probes (runs not made by ``dualtrain compare --config``). ``bound``: the precision's bounds,
    whose accumulation allowance scales each tensor's gradient error (none: plain relative
    errors)."""
    ref_rows = probes.read_index(reference_dir)
    rows = probes.read_index(run_dir)
    if not ref_rows or not rows:
        return None
    ref_by = {int(r["step"]): r for r in ref_rows}
    out = []
    for row in rows:
        step = int(row["step"])
        ref_row = ref_by.get(step)
        if ref_row is None:
            continue
        skipped = bool(row.get("skipped")) or bool(ref_row.get("skipped"))
        if skipped:
            out.append(Probe(step, {q: math.nan for q in QUANTITIES}, True, math.nan))
            continue
        ref, mine = probes.load(reference_dir, step), probes.load(run_dir, step)
        g64, g = ref["grad"], mine["grad"]
        keys = sorted(g64)
        dtype = np.dtype(probes.PARAM_DTYPE)
        pre = probes.rounded(ref["pre"])  # the state this run loaded (float32 values, in float64)
        slots = probes.rounded(ref.get("slot", {}))
        exact = optim_ref.step(
            opt,
            float(row["lr"]),
            pre,
            slots,
            int(ref_row["applied"]),
            {k: np.asarray(g[k], np.float64) for k in keys},
        )
        update = _diff(exact, pre, keys)
        upd_err = _diff(mine["post"], exact, keys)
        grad_err = _diff(g, g64, keys)
        scale, tensors, floors = _grad_errors(ref, g64, keys, grad_err, bound)
        den = _norm(update, keys)
        loss_scale = abs(float(ref_row["loss"]))
        if bound is not None and "loss_abs" in ref_row:
            loss_scale += bound.loss_terms(float(ref_row["loss_abs"]))
        loss_signed = float(row["loss"]) - float(ref_row["loss"])
        path, path_bound = _loss_path(row, ref_row, bound)
        errors = {
            "loss": _rel(abs(loss_signed), loss_scale),
            "grad": max(tensors.values()),
            "update": _rel(_norm(upd_err, keys), den),
        }
        u = float(np.finfo(dtype).eps) / 2
        floor = _rel(u * _norm(exact, keys), den)
        out.append(
            Probe(
                step,
                errors,
                False,
                floor,
                {"grad": _worst(grad_err, scale, keys), "update": _worst(upd_err, update, keys)},
                tensors,
                floors,
                loss_signed,
                loss_scale,
                path,
                path_bound,
                {k: float(v) for k, v in (ref_row.get("sensitivity") or {}).items()},
            )
        )
    return out


def _grad_errors(
    ref: dict[str, Weights],
    g64: Weights,
    keys: list[str],
    grad_err: Weights,
    bound: LocalBound | None,
) -> tuple[Weights, dict[str, float], dict[str, float]]:
    """Each gradient tensor's scale (its fp64 value, or its absolute scale x the accumulation
    allowance), its relative error against it, and its cross floor: (scale, errors, floors)."""
    absgrad, n = (
        ref.get("absgrad", {}),
        {k: float(v[0]) for k, v in ref.get("absterms", {}).items()},
    )
    scaled = [k for k in keys if k in absgrad and k in n and bound is not None]
    scale = {k: g64[k] for k in keys}
    if bound is not None:  # else scaled is empty
        scale.update({k: absgrad[k] * bound.grad_scale(n[k]) for k in scaled})
    tensors = {k: _rel(_norm(grad_err, [k]), _norm(scale, [k])) for k in keys}
    floors = {k: bound.grad_cross_floor(n[k]) for k in scaled} if bound is not None else {}
    return scale, tensors, floors


def _loss_path(
    row: dict[str, Any], ref_row: dict[str, Any], bound: LocalBound | None
) -> tuple[float, float]:
    """The loss of the run's own outputs against its exact loss, and its bound (NaN without)."""
    path, path_bound = math.nan, math.nan
    if "own_loss" in row and bound is not None:
        own = float(row["own_loss"])
        path = _rel(abs(float(row["loss"]) - own), abs(own) + float(ref_row.get("loss_abs", 0)))
        path_bound = bound.loss_path(int(row.get("count") or ref_row.get("count") or 1))
    return path, path_bound


def rms(values: list[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return math.sqrt(sum(v * v for v in vals) / len(vals)) if vals else math.nan


def median(values: list[float]) -> float:
    vals = sorted(v for v in values if not math.isnan(v))
    if not vals:
        return math.nan
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else 0.5 * (vals[mid - 1] + vals[mid])


#: How a quantity's per-probe errors are summarised (the a priori bound for ``grad`` and every cross
#: bound judge the summary). The gradient is a discontinuous function of the rounding: a ReLU whose
#: input lies within rounding of zero, or a near-tie in a max-pool, can switch (on one backend, or
#: on both) and move one sample's contribution, so a single probe can show a large, legitimate error
#: (measured: 1.0e-4 = 1,700 u on both backends at one of six probes of
#: configs/pytorch_examples_mnist.yaml in fp32). Its summary is the median over the probes, which
#: two such probes cannot move; the loss and the update are continuous, their summary is the rms and
#: their a priori bound holds at every probe.
SUMMARY = {"loss": rms, "grad": median, "update": rms}

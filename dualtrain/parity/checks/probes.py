"""The ``numerics`` group, one step at a time: the one-step probes judge each backend's
precision path (loss, gradient, update) against fp64; with them runs the convergence check
(dualtrain.parity.checks.convergence)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from dualtrain.core import kernels
from dualtrain.parity import local as L
from dualtrain.parity import readings as R
from dualtrain.parity.checks.base import Reference, fmt_num, not_run, path_name
from dualtrain.parity.checks.convergence import check_convergence
from dualtrain.parity.tolerances import (
    LOCAL,
    LocalBound,
    precision_of,
)
from dualtrain.records.record import RunRecord
from dualtrain.records.verdict import NUMERICS, Check
from dualtrain.spec import from_dict

# ---- numerics: the requested precision's path, judged by one-step probes -------------------------


def local_errors(
    a: RunRecord, b: RunRecord, ref: Reference, bound: LocalBound
) -> tuple[list[L.Probe], list[L.Probe]] | None:
    """Both runs' probes against the fp64 run of the reference pair that recorded the states (the
    fp64 torch run, for ``compare --config``); None when the runs did not replay probes or neither
    reference run recorded them. The reference pair is the compared spec in fp64 (compare_dirs
    checks it), so its recorded states are the ones the runs replayed, to fp64 rounding."""
    if not all((rec.summary.get("probes") or {}).get("mode") == "replay" for rec in (a, b)):
        return None
    source = next(
        (r.path for r in (ref.a, ref.b) if (r.summary.get("probes") or {}).get("mode") == "record"),
        None,
    )
    if source is None:
        return None
    opt = from_dict(a.spec).optimizer
    pa, pb = (L.measure(rec.path, source, opt, bound) for rec in (a, b))
    if not pa or not pb:
        return None
    return pa, pb


def _grad_cross(
    mine: dict[int, L.Probe],
    other: dict[int, L.Probe],
    steps: list[int],
    floor: float,
    ratio: float,
    agg: float,
) -> float:
    """The gradient's cross bound, as one number against ``agg`` (this backend's median of the
    per-probe max): every tensor's median error over the probes is compared with ``ratio`` x the
    same tensor's on the other backend, or its floor (the accumulation allowance where the tensor
    has one); the binding tensor sets the bound."""
    worst = 0.0
    for k in mine[steps[0]].grad_tensors:
        m = L.median([mine[s].grad_tensors.get(k, math.nan) for s in steps])
        o = L.median([other[s].grad_tensors.get(k, math.nan) for s in steps])
        f = mine[steps[0]].grad_floors.get(k, floor)
        worst = max(worst, m / (ratio * max(o, f)) if not math.isnan(m) else math.inf)
    if not mine[steps[0]].grad_tensors:
        return ratio * floor
    return agg / worst if worst > 0 else math.inf


def kernel_shift(a: RunRecord, b: RunRecord, prec: str) -> tuple[list[dict[str, float]], str]:
    """Per backend (a, b), per kind of product: its kernels' directed error minus the other
    backend's, in units of the precision's u (dualtrain.core.kernels), and a line for the report;
    zeros where a run has no calibration (made before it existed, or fp32)."""
    da, db = (kernels.directed(rec.summary, prec) for rec in (a, b))
    la, lb = R.labels(a, b)
    if da is None or db is None:
        missing = ", ".join(lab for lab, d in ((la, da), (lb, db)) if d is None)
        note = (
            f"no kernel calibration in {missing}'s run: the other backend's errors are taken as "
            "they are"
            if prec in kernels.DTYPES
            else ""
        )
        return [{}, {}], note
    kinds = [k for k in kernels.KINDS if k in da and k in db]
    shift = [{k: da[k] - db[k] for k in kinds}, {k: db[k] - da[k] for k in kinds}]
    parts = [f"{k} {la} {da[k]:+.2f} u, {lb} {db[k]:+.2f} u" for k in kinds]
    note = f"kernels' directed error ({prec}): " + "; ".join(parts)
    return shift, note


def _translated(
    other: dict[int, L.Probe], steps: list[int], shift: dict[str, float], u: float
) -> list[float]:
    """The other backend's loss error at each probe, translated onto this backend's kernels: its
    signed error plus the loss's sensitivity to each kind of product times the difference of the
    two kernels' directed errors, over the same denominator. Where the kernels round alike (every
    shift zero) this is the other backend's error itself."""
    out = []
    for s in steps:
        p = other[s]
        if not shift or math.isnan(p.loss_signed) or not p.loss_scale:
            out.append(p.errors["loss"])
            continue
        moved = p.loss_signed + sum(d * u * p.sensitivity.get(k, 0.0) for k, d in shift.items())
        out.append(abs(moved) / p.loss_scale)
    return out


def check_local(
    quantity: str,
    a: RunRecord,
    b: RunRecord,
    errs: tuple[list[L.Probe], list[L.Probe]],
    bound: LocalBound,
) -> Check:
    """One quantity of the one-step probes (the check ``local_loss``, ``local_grad`` or
    ``local_update``): each backend's error at every probe step against the a priori bound, and
    its rms over the probes against the other backend's (dualtrain.parity.local)."""
    name = f"local_{quantity}"
    runs = (a, b)
    steps = [p.step for p in errs[0] if not p.skipped]
    by = [{p.step: p for p in e if not p.skipped} for e in errs]
    steps = [s for s in steps if s in by[1]]
    if not steps:
        return not_run(name, NUMERICS, "every probe step was skipped (fp16 overflow)")
    vals = [[by[i][s].errors[quantity] for s in steps] for i in range(2)]
    vals = [[math.inf if math.isnan(v) else v for v in row] for row in vals]
    floors = [by[0][s].rounding_floor for s in steps]
    prior = [bound.a_priori(quantity, f) for f in floors]
    summary = L.SUMMARY[quantity]
    what = "median" if summary is L.median else "rms"
    agg = [summary(row) for row in vals]
    cross_floor = bound.cross_floor(quantity, L.rms(floors))
    cross = [bound.ratio * max(agg[1 - i], cross_floor) for i in range(2)]
    kernel_note, translated, cross = _cross_bounds(
        quantity, a, b, by, steps, bound, cross, cross_floor, agg
    )
    ratio, culprits, first, per_backend = _judge_backends(
        quantity, a, b, runs, by, steps, vals, prior, summary, what, agg, cross
    )
    how = _bound_how(quantity, bound)
    detail = _local_detail(
        quantity,
        steps,
        per_backend,
        how,
        bound,
        what,
        cross_floor,
        translated,
        kernel_note,
        culprits,
    )
    data = _local_data(
        quantity, steps, vals, prior, what, agg, cross, floors, translated, kernel_note, how, bound
    )
    return Check(
        name,
        ratio,
        1.0,
        not culprits,
        detail,
        unit="x bound",
        first_step=first,
        group=NUMERICS,
        culprits=culprits,
        data=data,
    )


def _judge_backends(
    quantity: str,
    a: RunRecord,
    b: RunRecord,
    runs: tuple[RunRecord, RunRecord],
    by: list[dict[int, L.Probe]],
    steps: list[int],
    vals: list[list[float]],
    prior: list[float],
    summary: Callable[[list[float]], float],
    what: str,
    agg: list[float],
    cross: list[float],
) -> tuple[float, list[str], int | None, list[str]]:
    """Each backend against the a priori bound at every probe and against its cross bound:
    (the largest ratio to a bound, the backends off, the first step off, a line per backend)."""
    ratio, culprits, first = 0.0, [], None
    per_backend = []
    for i, rec in enumerate(runs):
        r_prior = [v / p for v, p in zip(vals[i], prior, strict=True)]
        if summary is L.median:  # the a priori bound judges the median too (one value per probe)
            r_judged = [summary(r_prior)]
            over = [steps[k] for k, r in enumerate(r_prior) if r > 1.0] if r_judged[0] > 1 else []
        else:
            r_judged = r_prior
            over = [steps[k] for k, r in enumerate(r_prior) if r > 1.0]
        r_cross = agg[i] / cross[i]
        worst = max(range(len(steps)), key=lambda k: r_prior[k])
        path_note, r_path = _loss_path(quantity, by, i, steps, over)
        bad = bool(over) or r_cross > 1.0
        if bad:
            culprits.append(path_name(rec))
            s_first = over[0] if over else steps[max(range(len(steps)), key=lambda k: vals[i][k])]
            first = s_first if first is None else min(first, s_first)
        ratio = max(ratio, max(r_judged), r_cross, r_path)
        judged = f"; {what} {max(r_judged):.2g} x a priori" if what == "median" else ""
        tensor = by[i][steps[worst]].worst_tensor.get(quantity)
        tensor = f", most in {tensor}" if tensor else ""
        per_backend.append(
            f"{R.labels(a, b)[i]} {what} {fmt_num(agg[i])} (max {fmt_num(vals[i][worst])} at "
            f"step {steps[worst]}{tensor}, {r_prior[worst]:.2g} x a priori{judged}; "
            f"{what} {r_cross:.2g} x cross{path_note})"
        )
    return ratio, culprits, first, per_backend


def _cross_bounds(
    quantity: str,
    a: RunRecord,
    b: RunRecord,
    by: list[dict[int, L.Probe]],
    steps: list[int],
    bound: LocalBound,
    cross: list[float],
    cross_floor: float,
    agg: list[float],
) -> tuple[str, list[list[float]] | None, list[float]]:
    """The cross bounds where the quantity needs more than the other backend's aggregate: the loss
    on this backend's kernels (the kernels' note, the translated errors), the gradient tensor by
    tensor. Returns (kernel note, translated errors or None, cross bounds)."""
    kernel_note, translated = "", None
    if quantity == "loss":  # the other backend's errors on this backend's kernels
        shift, kernel_note = kernel_shift(a, b, bound.precision)
        if any(v != 0.0 for d in shift for v in d.values()):
            translated = [_translated(by[1 - i], steps, shift[i], bound.u) for i in range(2)]
            cross = [bound.ratio * max(L.rms(translated[i]), cross_floor) for i in range(2)]
    if quantity == "grad":  # tensor by tensor, each against the same tensor of the other backend
        cross = [
            _grad_cross(by[i], by[1 - i], steps, cross_floor, bound.ratio, agg[i]) for i in range(2)
        ]
    return kernel_note, translated, cross


def _loss_path(
    quantity: str, by: list[dict[int, L.Probe]], i: int, steps: list[int], over: list[int]
) -> tuple[str, float]:
    """The loss path on backend ``i``'s own outputs: (its note, its ratio to the bound); the probe
    steps over the bound are added to ``over``."""
    path_note, r_path = "", 0.0
    if quantity == "loss":  # the loss path on the backend's own outputs (kernel-free)
        path = [(by[i][s].loss_path, by[i][s].loss_path_bound) for s in steps]
        path = [(v, b) for v, b in path if not math.isnan(b)]
        if path:
            r_path = max(v / b if not math.isnan(v) else math.inf for v, b in path)
            over += [
                s for s, (v, b) in zip(steps, path, strict=True) if not v <= b and s not in over
            ]
            path_note = f"; loss path on its own outputs {r_path:.2g} x its bound"
    return path_note, r_path


def _bound_how(quantity: str, bound: LocalBound) -> str:
    """The a priori bound of ``quantity``, as the detail names it."""
    how = {
        "update": f"rounding floor + {bound.update_c:g} u_param",
        "loss": f"{bound.loss_c:g} u, and the loss of its own outputs within "
        f"({bound.loss_path_c:g} + {bound.grad_lambda:g} sqrt(n)) u_param of their exact loss",
        "grad": f"{bound.grad_c:g} u",
    }[quantity]
    return how


def _local_detail(
    quantity: str,
    steps: list[int],
    per_backend: list[str],
    how: str,
    bound: LocalBound,
    what: str,
    cross_floor: float,
    translated: list[list[float]] | None,
    kernel_note: str,
    culprits: list[str],
) -> str:
    """The check's detail line: the probes, each backend's numbers, the bounds, the kernels."""
    detail = (
        f"{L.WHAT[quantity]}, one step from the fp64 state at {len(steps)} probe steps "
        f"({', '.join(map(str, steps))}): "
        + "; ".join(per_backend)
        + f"; bounds: a priori {how} ({bound.precision} u = {bound.u:.3g})"
        f"{' on the median over the probes' if what == 'median' else ' at every probe'}, "
        + (
            f"cross {bound.ratio:g} x max(other backend's {what}, {fmt_num(cross_floor)})"
            if quantity != "grad"
            else f"cross {bound.ratio:g} x max(the same tensor's median on the other backend, "
            f"{bound.grad_floor:g} u + its accumulation allowance {bound.grad_lambda:g} "
            f"sqrt(n) u_param); each tensor against its absolute scale x (1 + the allowance "
            f"/ {bound.grad_c:g} u)"
        )
    )
    if translated is not None:
        detail += (
            f"; {kernel_note}: each backend's cross bound is the other backend's errors moved onto "
            "its kernels (its signed loss error + the difference of the directed errors x the "
            "loss's sensitivity to those products, recorded by the fp64 run)"
        )
    elif kernel_note and quantity == "loss":
        detail += f"; {kernel_note}"
    if culprits:
        detail += f"; off: {', '.join(culprits)}"
    return detail


def _local_data(
    quantity: str,
    steps: list[int],
    vals: list[list[float]],
    prior: list[float],
    what: str,
    agg: list[float],
    cross: list[float],
    floors: list[float],
    translated: list[list[float]] | None,
    kernel_note: str,
    how: str,
    bound: LocalBound,
) -> dict[str, Any]:
    """The check's data (the report's table and figure): every number behind the verdict."""
    per_tensor = (
        (
            " (tensor by tensor; each tensor's error against its absolute scale x its "
            "accumulation allowance)"
        )
        if quantity == "grad"
        else ""
    )
    data = {
        "quantity": quantity,
        "steps": steps,
        "a": vals[0],
        "b": vals[1],
        "a_priori": prior,
        "summary": what,
        "aggregate": agg,
        "cross": cross,
        "rounding_floor": floors,
        "translated": translated,
        "kernels": kernel_note,
        "bound_source": f"a priori {how} "
        f"({'median over the probes' if what == 'median' else 'every probe'}); "
        f"cross {bound.ratio:g} x the other backend's {what}{per_tensor}",
    }
    return data


LOCAL_CHECKS = ("local_loss", "local_grad", "local_update", "convergence")


def local_checks(a: RunRecord, b: RunRecord, ref: Reference | None) -> list[Check]:
    prec = precision_of(a.spec)
    bound = LOCAL.get(prec)
    if bound is None or precision_of(b.spec) != prec:
        why = "the runs' precisions differ" if bound is not None else f"no local bounds for {prec}"
        return [not_run(n, NUMERICS, why) for n in LOCAL_CHECKS]
    if ref is None:
        why = "no fp64 reference pair: the precision path was not checked"
        return [not_run(n, NUMERICS, why) for n in LOCAL_CHECKS]
    errs = local_errors(a, b, ref, bound)
    if errs is None:
        why = (
            "no one-step probes in these runs (dualtrain compare --config records and replays them)"
        )
        checks = [not_run(n, NUMERICS, why) for n in LOCAL_CHECKS[:3]]
    else:
        checks = [check_local(q, a, b, errs, bound) for q in L.QUANTITIES]
    return checks + [check_convergence(a, b, ref, bound)]

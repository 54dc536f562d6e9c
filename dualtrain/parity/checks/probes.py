"""The ``numerics`` group, one step at a time: the one-step probes judge each backend's
precision path (loss, gradient, update) against fp64, and convergence against the fp64 run."""

from __future__ import annotations

import math

from dualtrain.core import kernels
from dualtrain.parity import local as L
from dualtrain.parity import readings as R
from dualtrain.parity.checks.base import NUMERICS, Check, Reference, fmt_num, not_run, path_name
from dualtrain.parity.tolerances import (
    LOCAL,
    LocalBound,
    precision_of,
)
from dualtrain.records.record import RunRecord

# ---- numerics: the requested precision's path, judged by one-step probes -------------------------


def local_errors(
    a: RunRecord, b: RunRecord, ref: Reference, bound: LocalBound
) -> tuple[list[L.Probe], list[L.Probe]] | None:
    """Both runs' probes against the fp64 run of the reference pair that recorded the states (the
    fp64 torch run, for ``compare --config``); None when the runs did not replay probes or neither
    reference run recorded them. The reference pair is the compared spec in fp64 (compare_dirs
    checks it), so its recorded states are the ones the runs replayed, to fp64 rounding."""
    from dualtrain.spec import from_dict

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
    """One quantity of the one-step probes: each backend's error at every probe step against the a
    priori bound, and its rms over the probes against the other backend's
    (dualtrain.parity.local)."""
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
    how = {
        "update": f"rounding floor + {bound.update_c:g} u_param",
        "loss": f"{bound.loss_c:g} u, and the loss of its own outputs within "
        f"({bound.loss_path_c:g} + {bound.grad_lambda:g} sqrt(n)) u_param of their exact loss",
        "grad": f"{bound.grad_c:g} u",
    }[quantity]
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


#: convergence: when both fp16 runs skipped at least this share of their steps by the loss-scale
#: rule (a spec whose initial scale overflows for many steps), they applied materially fewer
#: updates than their fp64 runs, so each is judged against the other backend's run instead.
SKIPPED_SHARE = 0.1


def _skipped_share(rec: RunRecord) -> float:
    skipped = R.step_map(rec, "skipped")
    return sum(1 for v in skipped.values() if v) / len(skipped) if skipped else 0.0


def check_convergence(a: RunRecord, b: RunRecord, ref: Reference, bound: LocalBound) -> Check:
    """Each run's final test accuracy against its own fp64 run's: at most ``accuracy_pp`` below
    (against the other backend's run when both skipped a large share of their steps by the
    loss-scale rule, :data:`SKIPPED_SHARE`)."""
    drops, culprits, parts = [], [], []
    shares = [_skipped_share(a), _skipped_share(b)]
    cross = min(shares) >= SKIPPED_SHARE
    metric = R.metric_name(a)
    unit = "pp" if metric == "accuracy" else f"% of fp64 {metric}"
    for rec, r64 in ((a, b), (b, a)) if cross else ((a, ref.a), (b, ref.b)):
        scale = R.metric_scale(r64)
        got, want = (
            R.metric_points(rec, scale).get("final"),
            R.metric_points(r64, scale).get("final"),
        )
        label = R.label(rec, "A")
        if got is None or want is None:
            return Check(
                "convergence",
                None,
                bound.accuracy_pp,
                False,
                f"no final test {metric} in {label}'s run or its fp64 run",
                unit=unit,
                group=NUMERICS,
            )
        drop = want - got  # higher is better in points (an error metric counts negative)
        drop = math.inf if math.isnan(drop) else drop
        drops.append(drop)
        if drop > bound.accuracy_pp:
            culprits.append(path_name(rec))
        against = f"{R.label(r64, 'B')}'s run" if cross else "its fp64 run"
        # both present: metric_points found "final" in each
        v, v64 = rec.summary[f"test_{metric}"], r64.summary[f"test_{metric}"]
        parts.append(
            f"{label} {100 * float(v):.2f}% vs {against} {100 * float(v64):.2f}%"
            if metric == "accuracy"
            else f"{label} {metric} {float(v):.6g} vs {against} {float(v64):.6g}"
        )
    worse = "below" if metric == "accuracy" else "worse than"
    detail = "; ".join(parts) + (
        f"; a run may end at most {bound.accuracy_pp:g} {unit} {worse} its own fp64 "
        f"run ({bound.precision})"
    )
    if cross:
        detail += (
            f"; both runs skipped {100 * shares[0]:.0f}% / {100 * shares[1]:.0f}% of their "
            f"steps by the loss-scale rule (the fp64 runs applied every update), so each is "
            f"judged against the other backend's run"
        )
    if culprits:
        detail += f"; off: {', '.join(culprits)}"
    return Check(
        "convergence",
        max(drops),
        bound.accuracy_pp,
        not culprits,
        detail,
        unit=f"{unit} {worse} fp64",
        group=NUMERICS,
        culprits=culprits,
    )


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

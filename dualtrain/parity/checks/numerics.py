"""The ``numerics`` group, whole-run: the requested precision's runs differ by at most ``factor``
times what its rounding alone does (each backend's distance to its own fp64 run)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dualtrain.parity import readings as R
from dualtrain.parity.checks.base import (
    Reference,
    earliest_step,
    first_missing_step,
    fmt_num,
    missing_steps_note,
    tolerance_of,
)
from dualtrain.parity.tolerances import (
    Tolerance,
)
from dualtrain.records.record import RunRecord
from dualtrain.records.verdict import NUMERICS, Check

# ---- numerics: the requested precision against its rounding distance from fp64 -------------------


@dataclass
class Trajectory:
    """Per-step numbers behind the trajectory check (also what the report plots)."""

    steps: np.ndarray
    cross: np.ndarray
    """|loss_a - loss_b| at each step."""
    rounding_a: np.ndarray | None
    """|loss_a - loss_ref_a| at each step: A's distance to its own fp64 run (NaN where it did not
    run)."""
    rounding_b: np.ndarray | None
    noise: np.ndarray | None
    """The noise model: the larger of the two backends' distances to their fp64 runs (running
    max)."""
    allowed: np.ndarray
    """The per-step bound: factor * max(noise, abs_floor), or the fixed tolerance."""
    covered: np.ndarray
    """True where the bound comes from the noise model."""


def _distance(run: RunRecord, ref: RunRecord, steps: list[int]) -> np.ndarray:
    r, x = R.step_map(ref, "loss"), R.step_map(run, "loss")
    return np.array([abs(x[s] - r[s]) if s in r else math.nan for s in steps], dtype=np.float64)


def trajectory(a: RunRecord, b: RunRecord, ref: Reference | None, tol: Tolerance) -> Trajectory:
    steps, cross = R.loss_diff(a, b)
    allowed = np.full(steps.shape, tol.traj_fixed, dtype=np.float64)
    covered = np.zeros(steps.shape, dtype=bool)
    if ref is None:
        return Trajectory(steps, cross, None, None, None, allowed, covered)
    s = steps.tolist()
    da, db = _distance(a, ref.a, s), _distance(b, ref.b, s)
    covered = ~(np.isnan(da) | np.isnan(db))
    noise = np.full(steps.shape, math.nan)
    if covered.any():
        # The larger of the two distances: backends round differently and one can sit much closer to
        # exact arithmetic than the other (measured: torch fp32 within 1e-6 of its fp64 run for 150
        # SGD steps while TF's fp32 run drifted 5e-4 from its own), so only the farther one bounds
        # what two same-meaning runs may differ by. Running max: one lucky step where a run sits on
        # its fp64 run must not tighten the bound. docs/parity.md §7.
        noise[covered] = np.maximum(R.running_max(da[covered]), R.running_max(db[covered]))
    base = np.maximum(np.nan_to_num(noise, nan=0.0), tol.traj_abs_floor)
    allowed = np.where(covered, tol.factor * base, tol.traj_fixed)
    return Trajectory(steps, cross, da, db, noise, allowed, covered)


def check_trajectory(
    a: RunRecord, b: RunRecord, ref: Reference | None = None, tol: Tolerance | None = None
) -> Check:
    """The per-step |loss difference| of the two runs, at most ``factor`` times the farther
    backend's distance to its fp64 run (running max, floored at ``traj_abs_floor``); without a
    reference, at most ``traj_fixed``."""
    tol = tol or tolerance_of(a, b)
    t = trajectory(a, b, ref, tol)
    if t.steps.size == 0:
        return Check("trajectory", None, None, False, "no common steps", group=NUMERICS)
    cross = np.where(np.isnan(t.cross), np.inf, t.cross)
    over = cross > t.allowed
    first = int(t.steps[np.argmax(over)]) if over.any() else None
    n = int(t.steps.size)
    span = f"steps {int(t.steps[0])}-{int(t.steps[-1])}"
    first_note = ""
    if first is not None:
        i = int(np.argmax(over))
        first_note = (
            f"; first over at step {first}: |diff| {fmt_num(float(cross[i]))} > "
            f"{fmt_num(float(t.allowed[i]))}"
        )
    if not t.covered.any():
        value = float(cross.max())
        why = (
            "no fp64 reference"
            if ref is None
            else "the fp64 reference shares no step with the runs"
        )
        detail = (
            f"{why}: fixed tolerance {fmt_num(tol.traj_fixed)} ({tol.precision}) over {n} steps "
            f"({span}); max |loss diff| {fmt_num(value)}{first_note}"
        )
        return Check(
            "trajectory",
            value,
            tol.traj_fixed,
            first is None,
            detail,
            unit="abs",
            first_step=first,
            group=NUMERICS,
        )
    ratio = cross / t.allowed * tol.factor  # <= factor exactly where the step passes
    worst = int(np.argmax(ratio))
    n_cov = int(t.covered.sum())
    la, lb = R.labels(a, b)
    # covered steps exist: trajectory() had the fp64 runs' losses
    assert t.rounding_a is not None and t.rounding_b is not None and t.noise is not None
    end_a = float(np.nanmax(t.rounding_a[t.covered]))
    end_b = float(np.nanmax(t.rounding_b[t.covered]))
    detail = (
        f"{n_cov} of {n} steps ({span}) against {tol.factor:g} x max(distance to fp64 "
        f"(running max, farther backend), {fmt_num(tol.traj_abs_floor)}); "
        f"worst step {int(t.steps[worst])}: "
        f"|diff| {fmt_num(float(cross[worst]))}, distance to fp64 "
        f"{fmt_num(float(np.nan_to_num(t.noise[worst])))}; largest distance to fp64: {la} "
        f"{fmt_num(end_a)}, {lb} {fmt_num(end_b)}"
    )
    if n_cov < n:
        uncovered = t.steps[~t.covered]
        detail += (
            f"; steps {int(uncovered[0])}-{int(uncovered[-1])} (no fp64 data) against the fixed "
            f"tolerance {fmt_num(tol.traj_fixed)}"
        )
    detail += first_note
    return Check(
        "trajectory",
        float(ratio[worst]),
        tol.factor,
        first is None,
        detail,
        unit="x rounding",
        first_step=first,
        group=NUMERICS,
    )


def check_final_weights(
    a: RunRecord, b: RunRecord, ref: Reference | None = None, tol: Tolerance | None = None
) -> Check:
    """Per-tensor relative difference of weights_final against each backend's distance to fp64."""
    tol = tol or tolerance_of(a, b)
    wa, wb = R.load_final(a), R.load_final(b)
    if wa is None or wb is None:
        return Check(
            "final_weights",
            None,
            None,
            False,
            "weights_final.npz missing in " + ("A" if wa is None else "B"),
            group=NUMERICS,
        )
    problem = R.layout_problem(wa, wb)
    if problem:
        return Check("final_weights", math.inf, None, False, problem, group=NUMERICS)
    cross = R.rel_diff(wa, wb)
    noise = None
    if ref is not None:
        ra, rb = R.load_final(ref.a), R.load_final(ref.b)
        if (
            ra is not None
            and rb is not None
            and R.layout_problem(wa, ra) is None
            and R.layout_problem(wb, rb) is None
        ):
            da, db = R.rel_diff(wa, ra), R.rel_diff(wb, rb)
            noise = {k: max(da[k], db[k]) for k in cross}
    if noise is None:
        worst = max(cross, key=cross.__getitem__)
        bad = [k for k, v in cross.items() if not v <= tol.weights_fixed]
        why = "no fp64 reference" if ref is None else "fp64 reference weights unusable"
        detail = (
            f"{why}: fixed relative tolerance {fmt_num(tol.weights_fixed)}; worst {worst} "
            f"{fmt_num(cross[worst])}"
        )
        if bad:
            detail += f"; over: {', '.join(bad)}"
        return Check(
            "final_weights",
            cross[worst],
            tol.weights_fixed,
            not bad,
            detail,
            unit="rel",
            group=NUMERICS,
        )
    ratio = {k: cross[k] / max(noise[k], tol.weights_floor) for k in cross}
    ratio = {k: (math.inf if math.isnan(v) else v) for k, v in ratio.items()}
    worst = max(ratio, key=ratio.__getitem__)
    bad = [k for k, v in ratio.items() if v > tol.factor]
    detail = (
        f"per tensor rel diff vs {tol.factor:g} x max(distance to fp64 (farther backend), "
        f"{fmt_num(tol.weights_floor)}); worst {worst}: {fmt_num(cross[worst])} vs "
        f"{fmt_num(noise[worst])}"
    )
    if bad:
        detail += f"; over: {', '.join(bad)}"
    return Check(
        "final_weights",
        ratio[worst],
        tol.factor,
        not bad,
        detail,
        unit="x rounding",
        group=NUMERICS,
    )


def check_eval(
    a: RunRecord,
    b: RunRecord,
    ref: Reference | None = None,
    tol: Tolerance | None = None,
    final: bool = True,
) -> Check:
    """The test metric, finally and at every eval step: |m_A - m_B| <= max(eval_pp, factor x the
    larger backend's distance to its fp64 run) (without a reference: eval_pp). Accuracy in
    percentage points; an error metric (mae) in percent of the fp64 run's final value. ``final``
    False: runs that stop after different steps (early stopping) are judged at their common
    evaluation steps only."""
    tol = tol or tolerance_of(a, b)
    la, lb = R.labels(a, b)
    metric = R.metric_name(a)
    scale = R.metric_scale(ref.a if ref is not None else a)
    unit = "pp" if metric == "accuracy" else f"% of fp64 {metric}"
    ea, eb = R.metric_points(a, scale), R.metric_points(b, scale)
    if "final" not in ea or "final" not in eb:
        return Check(
            "eval",
            None,
            tol.eval_pp,
            False,
            f"no final test {metric} in {la if 'final' not in ea else lb}",
            unit=unit,
            group=NUMERICS,
        )
    points = [s for s in sorted(k for k in ea if k != "final") if s in eb] + (
        ["final"] if final else []
    )
    diff, allowed = _eval_bounds(ea, eb, points, ref, scale, tol)
    over = [s for s in points if diff[s] > allowed[s]]
    worst = max(points, key=lambda s: diff[s] / allowed[s])
    # the keys besides "final" are the int eval steps
    note = missing_steps_note(
        {k for k in ea if isinstance(k, int)}, {k for k in eb if isinstance(k, int)}, la, lb
    )
    # both present: "final" in ea and eb above
    shown = _final_shown(a, b, metric, lb)
    detail = (
        f"final {la} {shown} ({diff['final']:.3f} {unit})"
        if final
        else f"the runs stop after different steps (final {la} {shown}): common steps only"
    )
    if len(points) > 1:
        detail += f"; {len(points) - 1} eval step(s)"
    detail += (
        f"; worst {'final' if worst == 'final' else f'step {worst}'}: {diff[worst]:.3f} {unit} "
        f"against {allowed[worst]:.3g}"
    )
    if ref is not None:
        detail += (
            f" = max({tol.eval_pp:g}, {tol.factor:g} x the farther backend's {metric} distance "
            f"to fp64)"
        )
    if over:
        detail += f"; over at {', '.join(map(str, over[:5]))}"
    if not final:
        note = ""  # the evaluations after the earlier stop are the later run's own
    if note:
        detail += f"; {note}"
    steps_over = [s for s in over if isinstance(s, int)]  # all but "final"
    return Check(
        "eval",
        diff[worst],
        allowed[worst],
        not over and not note,
        detail,
        unit=unit,
        first_step=earliest_step(
            steps_over[0] if steps_over else None,
            first_missing_step(
                set(R.step_map(a, metric, "eval")), set(R.step_map(b, metric, "eval"))
            ),
        ),
        group=NUMERICS,
    )


Points = dict[int | str, float]


def _eval_bounds(
    ea: Points,
    eb: Points,
    points: list[int | str],
    ref: Reference | None,
    scale: float,
    tol: Tolerance,
) -> tuple[Points, Points]:
    """At each point: the backends' metric difference, and what it is allowed (eval_pp, or
    ``factor`` x the farther backend's distance to its fp64 run)."""
    ra, rb = (
        (R.metric_points(ref.a, scale), R.metric_points(ref.b, scale))
        if ref is not None
        else ({}, {})
    )
    diff, allowed = {}, {}
    for s in points:
        d = abs(ea[s] - eb[s])
        diff[s] = math.inf if math.isnan(d) else d
        allowed[s] = tol.eval_pp
        if s in ra and s in rb:
            dist = max(abs(ea[s] - ra[s]), abs(eb[s] - rb[s]))
            allowed[s] = (
                max(tol.eval_pp, tol.factor * dist) if not math.isnan(dist) else tol.eval_pp
            )
    return diff, allowed


def _final_shown(a: RunRecord, b: RunRecord, metric: str, lb: str) -> str:
    """The two runs' final test metric, as the detail shows it."""
    fa, fb = float(a.summary[f"test_{metric}"]), float(b.summary[f"test_{metric}"])
    shown = (
        f"{100 * fa:.2f}% vs {lb} {100 * fb:.2f}%"
        if metric == "accuracy"
        else f"{metric} {fa:.6g} vs {lb} {fb:.6g}"
    )
    return shown

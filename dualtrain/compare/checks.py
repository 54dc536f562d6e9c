"""The compare-backends checks: pure functions over two run records (+ an optional noise-floor twin).

Each check returns a :class:`Check`. ``run_checks`` runs them all in report order. The parity tests
call these same functions, so the report and the tests cannot disagree about what "equal" means.
Thresholds come from :mod:`dualtrain.compare.tolerances` only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dualtrain.compare import records as R
from dualtrain.compare.tolerances import Tolerance, precision_of, tolerance_for
from dualtrain.record import RunRecord


@dataclass
class Check:
    name: str
    value: float | None
    """What was measured (``unit`` says in what)."""
    tolerance: float | None
    """The largest passing value (None: informational)."""
    passed: bool
    detail: str
    unit: str = ""
    first_step: int | None = None
    """First step (1-based) at which this check's per-step condition fails; 0 = before training."""
    informational: bool = False
    """Never fails (throughput)."""

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("value", "tolerance"):
            v = d[k]
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        return d


def tolerance_of(a: RunRecord, b: RunRecord) -> Tolerance:
    return tolerance_for(precision_of(a.spec), precision_of(b.spec))


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def _steps_note(sa: set[int], sb: set[int], la: str, lb: str) -> str:
    if sa == sb:
        return ""
    only_a, only_b = sorted(sa - sb), sorted(sb - sa)
    parts = []
    if only_a:
        parts.append(f"{len(only_a)} step(s) only in {la} (first {only_a[0]})")
    if only_b:
        parts.append(f"{len(only_b)} step(s) only in {lb} (first {only_b[0]})")
    return "; ".join(parts)


def _first_missing(sa: set[int], sb: set[int]) -> int | None:
    diff = sa ^ sb
    return min(diff) if diff else None


def _min_step(*steps: int | None) -> int | None:
    real = [s for s in steps if s is not None]
    return min(real) if real else None


# ---- checks --------------------------------------------------------------------------------------

def check_spec(a: RunRecord, b: RunRecord) -> Check:
    """Both runs were compiled from the same experiment (cosmetic fields aside)."""
    diffs = R.spec_differences(a.spec, b.spec)
    relevant = [d for d in diffs if not R.is_cosmetic(d[0])]
    cosmetic = [d for d in diffs if R.is_cosmetic(d[0])]
    if relevant:
        shown = ", ".join(f"{k}: {va!r} vs {vb!r}" for k, va, vb in relevant[:6])
        more = f" (+{len(relevant) - 6} more)" if len(relevant) > 6 else ""
        detail = f"spec differs: {shown}{more}"
    else:
        detail = "same experiment"
    if cosmetic:
        detail += f"; ignored: {', '.join(k for k, _, _ in cosmetic)}"
    return Check("spec", float(len(relevant)), 0.0, not relevant, detail, unit="fields",
                 first_step=0 if relevant else None)


def check_sharding(a: RunRecord, b: RunRecord) -> Check:
    """Every (step, replica) fed the same ids (digest) and count; both runs have the same steps."""
    la, lb = R.labels(a, b)
    ma, mb = R.shard_map(a), R.shard_map(b)
    steps_a, steps_b = {s for s, _ in ma}, {s for s, _ in mb}
    bad = []
    for key in sorted(set(ma) | set(mb)):
        if ma.get(key) != mb.get(key):
            bad.append(key)
    notes = []
    if bad:
        step, rep = bad[0]
        va, vb = ma.get((step, rep)), mb.get((step, rep))
        fa = f"digest {va[0]} count {va[1]}" if va else "missing"
        fb = f"digest {vb[0]} count {vb[1]}" if vb else "missing"
        notes.append(f"{len(bad)} (step, replica) mismatch(es); first: step {step} replica {rep}: "
                     f"{la} {fa}, {lb} {fb}")
    if not ma or not mb:
        notes.append(f"no shard records in {la if not ma else lb}")
    steps_note = _steps_note(steps_a, steps_b, la, lb)
    if steps_note:
        notes.append(steps_note)
    passed = not bad and bool(ma) and bool(mb)
    detail = "; ".join(notes) if notes else (
        f"{len(steps_a)} steps x {len({r for _, r in ma})} replicas identical")
    return Check("sharding", float(len(bad)), 0.0, passed, detail, unit="mismatches",
                 first_step=bad[0][0] if bad else None)


def check_init_weights(a: RunRecord, b: RunRecord) -> Check:
    wa, wb = R.load_init(a), R.load_init(b)
    if wa is None or wb is None:
        return Check("init_weights", None, 0.0, False, "weights_init.npz missing in "
                     + ("A" if wa is None else "B"), unit="max abs", first_step=0)
    problem = R.layout_problem(wa, wb)
    if problem:
        return Check("init_weights", math.inf, 0.0, False, problem, unit="max abs", first_step=0)
    diffs = R.max_abs_diff(wa, wb)
    worst = max(diffs, key=diffs.get)
    value = diffs[worst]
    differing = [k for k, v in diffs.items() if v > 0]
    if differing:
        n = sum(int(np.count_nonzero(wa[k] != wb[k])) for k in differing)
        detail = f"{n} element(s) differ in {', '.join(differing)}; largest in {worst}"
    else:
        detail = f"{len(diffs)} tensors bit-identical"
    return Check("init_weights", value, 0.0, not differing, detail, unit="max abs",
                 first_step=0 if differing else None)


def check_lr(a: RunRecord, b: RunRecord, tol: Tolerance | None = None) -> Check:
    tol = tol or tolerance_of(a, b)
    la, lb = R.labels(a, b)
    ma, mb = R.step_map(a, "lr"), R.step_map(b, "lr")
    steps = R.common_steps(ma, mb)
    worst, first = 0.0, None
    for s in steps:
        x, y = ma[s], mb[s]
        rel = abs(x - y) / max(abs(x), abs(y)) if (x != y) else 0.0
        if math.isnan(rel):
            rel = math.inf
        if rel > tol.lr_rel and first is None:
            first = s
        worst = max(worst, rel)
    missing = _first_missing(set(ma), set(mb))
    note = _steps_note(set(ma), set(mb), la, lb)
    passed = first is None and not note and bool(steps)
    if first is not None:
        detail = f"first difference at step {first}: {la} {ma[first]:.6g}, {lb} {mb[first]:.6g}"
    else:
        detail = f"{len(steps)} steps equal"
    if note:
        detail += f"; {note}"
    return Check("lr", worst, tol.lr_rel, passed, detail, unit="rel",
                 first_step=_min_step(first, missing))


def _sequence_check(name: str, key: str, a: RunRecord, b: RunRecord) -> Check:
    la, lb = R.labels(a, b)
    ma, mb = R.step_map(a, key), R.step_map(b, key)
    steps = R.common_steps(ma, mb)
    bad = [s for s in steps if ma[s] != mb[s]]
    note = _steps_note(set(ma), set(mb), la, lb)
    if bad:
        s = bad[0]
        detail = f"{len(bad)} step(s) differ; first at step {s}: {la} {ma[s]:g}, {lb} {mb[s]:g}"
    else:
        detail = f"{len(steps)} steps identical"
        if key == "skipped":
            detail += f" ({int(sum(ma[s] for s in steps))} skipped)"
        elif steps:
            detail += f" (final {ma[steps[-1]]:g})"
    if note:
        detail += f"; {note}"
    return Check(name, float(len(bad)), 0.0, not bad and not note and bool(steps), detail,
                 unit="steps", first_step=_min_step(bad[0] if bad else None,
                                                    _first_missing(set(ma), set(mb))))


def check_loss_scale(a: RunRecord, b: RunRecord) -> Check:
    """Identical per-step loss scale (fp16's dynamic scale; 1.0 at every step for fp32/bf16)."""
    return _sequence_check("loss_scale", "loss_scale", a, b)


def check_skipped(a: RunRecord, b: RunRecord) -> Check:
    """Identical per-step skip decisions (an overflow on any replica skips the step on all)."""
    return _sequence_check("skipped", "skipped", a, b)


def check_loss_early(a: RunRecord, b: RunRecord, tol: Tolerance | None = None) -> Check:
    tol = tol or tolerance_of(a, b)
    steps, diff = R.loss_diff(a, b)
    keep = steps <= tol.early_steps
    steps, diff = steps[keep], diff[keep]
    if steps.size == 0:
        return Check("loss_early", None, tol.loss_early, False, "no common steps", unit="abs")
    over = ~(diff <= tol.loss_early)  # NaN counts as over
    worst_i = int(np.nanargmax(np.where(np.isnan(diff), np.inf, diff)))
    value = float(diff[worst_i]) if not np.isnan(diff[worst_i]) else math.inf
    first = int(steps[np.argmax(over)]) if over.any() else None
    detail = (f"max |loss diff| over steps {int(steps[0])}-{int(steps[-1])} is {_fmt(value)} "
              f"at step {int(steps[worst_i])}")
    if first is not None:
        detail += f"; first over tolerance at step {first} ({_fmt(float(diff[np.argmax(over)]))})"
    return Check("loss_early", value, tol.loss_early, first is None, detail, unit="abs",
                 first_step=first)


@dataclass
class Trajectory:
    """Per-step numbers behind the trajectory check (also what the report plots)."""

    steps: np.ndarray
    cross: np.ndarray
    """|loss_a - loss_b| at each step."""
    noise: np.ndarray | None
    """|loss_a - loss_twin| at each step (NaN where the twin did not run)."""
    envelope: np.ndarray | None
    """Running max of ``noise``, looking ``traj_lag`` steps ahead (NaN where the twin did not run)."""
    allowed: np.ndarray
    """The per-step bound: factor * max(envelope, abs_floor), or the fixed tolerance."""
    covered: np.ndarray
    """True where the bound comes from the noise floor."""
    collapsed: bool = False
    """The twin's losses equal A's at every shared step: it measured no noise floor."""


def trajectory(a: RunRecord, b: RunRecord, twin: RunRecord | None, tol: Tolerance) -> Trajectory:
    steps, cross = R.loss_diff(a, b)
    allowed = np.full(steps.shape, tol.traj_fixed, dtype=np.float64)
    covered = np.zeros(steps.shape, dtype=bool)
    noise = envelope = None
    if twin is not None:
        ta, tt = R.step_map(a, "loss"), R.step_map(twin, "loss")
        noise = np.array([abs(ta[s] - tt[s]) if s in tt else math.nan for s in steps.tolist()])
        covered = np.array([s in tt for s in steps.tolist()], dtype=bool)
        envelope = np.full(steps.shape, math.nan)
        if covered.any() and not np.any(noise[covered] != 0):
            # A collapsed twin (its one-ulp change was rounded away) bounds nothing: fixed tolerance.
            return Trajectory(steps, cross, noise, envelope, allowed,
                              np.zeros(steps.shape, dtype=bool), collapsed=True)
        if covered.any():
            # The twin covers a prefix of A's steps; the running max runs over that prefix in order.
            envelope[covered] = R.running_max(noise[covered], tol.traj_lag)
        base = np.maximum(np.nan_to_num(envelope, nan=0.0), tol.traj_abs_floor)
        allowed = np.where(covered, tol.factor * base, tol.traj_fixed)
    return Trajectory(steps, cross, noise, envelope, allowed, covered)


def check_trajectory(a: RunRecord, b: RunRecord, twin: RunRecord | None = None,
                     tol: Tolerance | None = None) -> Check:
    tol = tol or tolerance_of(a, b)
    t = trajectory(a, b, twin, tol)
    if t.steps.size == 0:
        return Check("trajectory", None, None, False, "no common steps")
    cross = np.where(np.isnan(t.cross), np.inf, t.cross)
    over = cross > t.allowed
    first = int(t.steps[np.argmax(over)]) if over.any() else None
    n = int(t.steps.size)
    span = f"steps {int(t.steps[0])}-{int(t.steps[-1])}"
    first_note = ""
    if first is not None:
        i = int(np.argmax(over))
        first_note = (f"; first over at step {first}: |diff| {_fmt(float(cross[i]))} > "
                      f"{_fmt(float(t.allowed[i]))}")
    if twin is None or not t.covered.any():
        value = float(cross.max())
        why = ("no noise-floor twin" if twin is None else "the twin never left run A (its one-ulp "
               "change was rounded away, so it measures no noise floor)" if t.collapsed
               else "the twin shares no step with A")
        detail = (f"{why}: fixed tolerance {_fmt(tol.traj_fixed)} ({tol.precision}) over {n} steps "
                  f"({span}); max |loss diff| {_fmt(value)}{first_note}")
        return Check("trajectory", value, tol.traj_fixed, first is None, detail, unit="abs",
                     first_step=first)
    # ratio to the noise floor: allowed = factor * base, so value <= factor <=> within tolerance
    base = t.allowed / tol.factor
    ratio = cross / base
    worst = int(np.argmax(ratio))
    n_cov = int(t.covered.sum())
    detail = (f"{n_cov} of {n} steps ({span}) against {tol.factor:g} x max(noise-floor envelope "
              f"(running max{f', {tol.traj_lag} steps look-ahead' if tol.traj_lag else ''}), "
              f"{_fmt(tol.traj_abs_floor)}); "
              f"worst step {int(t.steps[worst])}: |diff| "
              f"{_fmt(float(cross[worst]))}, envelope {_fmt(float(np.nan_to_num(t.envelope[worst])))}")
    if n_cov < n:
        uncovered = t.steps[~t.covered]
        detail += (f"; steps {int(uncovered[0])}-{int(uncovered[-1])} (no twin data) against the fixed "
                   f"tolerance {_fmt(tol.traj_fixed)}")
    detail += first_note
    return Check("trajectory", float(ratio[worst]), tol.factor, first is None, detail,
                 unit="x noise floor", first_step=first)


def check_final_weights(a: RunRecord, b: RunRecord, twin: RunRecord | None = None,
                        tol: Tolerance | None = None) -> Check:
    """Per-tensor relative difference of weights_final; the twin's difference is the reference."""
    tol = tol or tolerance_of(a, b)
    wa, wb = R.load_final(a), R.load_final(b)
    if wa is None or wb is None:
        return Check("final_weights", None, None, False, "weights_final.npz missing in "
                     + ("A" if wa is None else "B"))
    problem = R.layout_problem(wa, wb)
    if problem:
        return Check("final_weights", math.inf, None, False, problem)
    cross = R.rel_diff(wa, wb)
    wt = R.load_final(twin) if twin is not None else None
    ref = None
    if wt is not None and R.layout_problem(wa, wt) is None:
        ref = R.rel_diff(wa, wt)
    collapsed = ref is not None and not any(v != 0 for v in ref.values())
    if ref is None or collapsed:
        worst = max(cross, key=cross.get)
        bad = [k for k, v in cross.items() if not v <= tol.weights_fixed]
        why = ("no noise-floor twin" if twin is None else "the twin's final weights equal A's "
               "(no noise floor)" if collapsed else "twin weights unusable")
        detail = (f"{why}: fixed relative tolerance {_fmt(tol.weights_fixed)}; worst {worst} "
                  f"{_fmt(cross[worst])}")
        if bad:
            detail += f"; over: {', '.join(bad)}"
        return Check("final_weights", cross[worst], tol.weights_fixed, not bad, detail, unit="rel")
    ratio = {k: cross[k] / max(ref[k], tol.weights_floor) for k in cross}
    ratio = {k: (math.inf if math.isnan(v) else v) for k, v in ratio.items()}
    worst = max(ratio, key=ratio.get)
    bad = [k for k, v in ratio.items() if v > tol.factor]
    detail = (f"per tensor rel diff vs {tol.factor:g} x max(twin's, {_fmt(tol.weights_floor)}); worst "
              f"{worst}: {_fmt(cross[worst])} vs twin {_fmt(ref[worst])}")
    if bad:
        detail += f"; over: {', '.join(bad)}"
    return Check("final_weights", ratio[worst], tol.factor, not bad, detail, unit="x noise floor")


def check_eval(a: RunRecord, b: RunRecord, tol: Tolerance | None = None) -> Check:
    tol = tol or tolerance_of(a, b)
    la, lb = R.labels(a, b)
    ea, eb = R.step_map(a, "accuracy", "eval"), R.step_map(b, "accuracy", "eval")
    steps = R.common_steps(ea, eb)
    per_step = {s: 100.0 * abs(ea[s] - eb[s]) for s in steps}
    fa, fb = a.summary.get("test_accuracy"), b.summary.get("test_accuracy")
    if fa is None or fb is None:
        return Check("eval", None, tol.eval_pp, False,
                     f"no final test accuracy in {la if fa is None else lb}", unit="pp")
    fa, fb = float(fa), float(fb)
    final = 100.0 * abs(fa - fb)
    if math.isnan(final):
        final = math.inf
    values = [final] + [v if not math.isnan(v) else math.inf for v in per_step.values()]
    value = max(values)
    over = [s for s in steps if not per_step[s] <= tol.eval_pp]
    note = _steps_note(set(ea), set(eb), la, lb)
    detail = f"final {la} {100 * fa:.2f}% vs {lb} {100 * fb:.2f}% ({final:.3f} pp)"
    if steps:
        ws = max(steps, key=lambda s: per_step[s] if not math.isnan(per_step[s]) else math.inf)
        detail += f"; {len(steps)} eval step(s), worst step {ws}: {per_step[ws]:.3f} pp"
    if over:
        detail += f"; over at step(s) {', '.join(map(str, over[:5]))}"
    if note:
        detail += f"; {note}"
    passed = final <= tol.eval_pp and not over and not note
    return Check("eval", value, tol.eval_pp, passed, detail, unit="pp",
                 first_step=_min_step(over[0] if over else None,
                                      _first_missing(set(ea), set(eb))))


def check_throughput(a: RunRecord, b: RunRecord) -> Check:
    la, lb = R.labels(a, b)
    ta = float(a.summary.get("train_samples_per_s") or 0.0)
    tb = float(b.summary.get("train_samples_per_s") or 0.0)
    ratio = tb / ta if ta > 0 else math.nan
    detail = f"{la} {ta:,.0f} samples/s, {lb} {tb:,.0f} samples/s (informational)"
    return Check("throughput", ratio, None, True, detail, unit=f"{lb}/{la}", informational=True)


def run_checks(a: RunRecord, b: RunRecord, twin: RunRecord | None = None) -> list[Check]:
    """Every check, in report order."""
    tol = tolerance_of(a, b)
    return [
        check_spec(a, b),
        check_sharding(a, b),
        check_init_weights(a, b),
        check_lr(a, b, tol),
        check_loss_scale(a, b),
        check_skipped(a, b),
        check_loss_early(a, b, tol),
        check_trajectory(a, b, twin, tol),
        check_final_weights(a, b, twin, tol),
        check_eval(a, b, tol),
        check_throughput(a, b),
    ]


def all_passed(checks: list[Check]) -> bool:
    return all(c.passed or c.informational for c in checks)

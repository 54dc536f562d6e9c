"""The compare-backends checks: pure functions over two run records and their fp64 reference pair.

Three groups, in report order (docs/report.md):

* ``records``: the inputs of the arithmetic must be exact (spec, sample ids, initial weights, lr,
  loss-scale decisions);
* ``semantics``: the fp64 reference pair (the same spec run in float64 on both backends) agrees to
  rounding over the whole run (:data:`dualtrain.parity.tolerances.REFERENCE`);
* ``numerics``: the requested precision's runs differ by at most ``factor`` times what that precision's
  rounding alone does to a run (each backend's distance to its own fp64 run), and agree on accuracy.

Each check returns a :class:`Check`. ``run_checks`` runs them all. The parity tests call these same
functions, so the report and the tests cannot disagree about what "equal" means. Thresholds come from
:mod:`dualtrain.parity.tolerances` only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from dualtrain.jsonio import json_safe
from dualtrain.parity import local as L
from dualtrain.parity import records as R
from dualtrain.parity.tolerances import (
    LOCAL,
    REFERENCE,
    LocalBound,
    Tolerance,
    precision_of,
    tolerance_for,
)
from dualtrain.records.record import RunRecord

RECORDS, SEMANTICS, NUMERICS, INFO = "records", "semantics", "numerics", "info"


@dataclass
class Reference:
    """The fp64 reference pair: run A's spec in float64 on A's backend (``a``) and on B's (``b``)."""

    a: RunRecord
    b: RunRecord


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
    """Never fails (throughput, and checks that did not run)."""
    group: str = RECORDS
    """records, semantics, numerics or info (see the module docstring)."""
    ran: bool = True
    """False: the check could not run (no fp64 reference); ``detail`` says why."""
    culprits: list[str] = field(default_factory=list)
    """Numerics checks that judge one backend's precision path: the failing paths ("tf fp16 path")."""
    data: dict[str, Any] | None = None
    """Per-step numbers behind the check, for the report (the local checks: probes and bounds)."""

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {**d, "value": json_safe(d["value"]), "tolerance": json_safe(d["tolerance"])}


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
    worst = max(diffs, key=diffs.__getitem__)
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


def scale_rule_violation(rec: RunRecord) -> str | None:
    """Where ``rec``'s recorded loss scales leave GradScaler's rule applied to its own recorded skip
    decisions (fp16: x backoff after a skipped step, x growth after ``growth_interval`` applied ones;
    otherwise 1.0 throughout), or None. The rule is defined once, so a run that breaks it is the one
    whose loss scaling is off, whatever the other run did."""
    from dualtrain.spec import from_dict

    try:
        ls = from_dict(rec.spec).precision.loss_scale
    except Exception:  # noqa: BLE001 - a spec this version cannot read: no verdict on the rule
        return None
    fp16 = precision_of(rec.spec) == "fp16"
    scales, skipped = R.step_map(rec, "loss_scale"), R.step_map(rec, "skipped")
    steps = sorted(scales)
    if not steps or steps[0] != 1:
        return None  # a continuation without its first steps: no known starting point
    # Both engines hold the scale in float32 (GradScaler's tensor, the tf engine's variable) and
    # multiply it there: the rule does the same (1e12 is 999999995904 in float32).
    f32 = np.float32
    scale, good = f32(ls.init if fp16 else 1.0), 0
    for s in steps:
        if scales[s] != float(scale):
            return f"step {s}: loss scale {scales[s]:.9g}, the rule gives {float(scale):.9g}"
        if not fp16:
            continue
        if skipped.get(s):
            scale, good = f32(scale * f32(ls.backoff_factor)), 0
        else:
            good += 1
            if good == ls.growth_interval:
                scale, good = f32(scale * f32(ls.growth_factor)), 0
    return None


#: The largest finite float16.
FP16_MAX = 65504.0


@dataclass
class SkipDifference:
    """A step where one fp16 run skipped (overflow) and the other applied its update."""

    step: int
    skipper: str
    other: str
    skipper_amax: float
    """The skipping run's largest |gradient element| (unscaled): must be inf or nan."""
    headroom: float
    """The other run's largest |gradient element| times the *skipper's* loss scale, over the fp16
    maximum: how close the other run's gradient came to overflowing under that scale."""
    at_threshold: bool


def skip_differences(a: RunRecord, b: RunRecord) -> list[SkipDifference] | None:
    """fp16 runs that record ``grad_amax``: every step whose skip decisions differ, each judged.

    An overflow decision is a threshold test on rounded numbers, so two correct fp16 paths can take
    different decisions where the gradient sits at the threshold: the run that skipped must have
    met a non-finite gradient, and the run that did not must have been within one growth factor of
    overflowing under the skipper's loss scale (its gradient's largest element x that scale >= the
    fp16 maximum / growth_factor). Measured (configs/pytorch_examples_mnist.yaml, fp16, world 1,
    2,600 samples): torch overflowed at step 20, where tf's gradient stood at 0.85 of the fp16
    maximum (0.25-0.43 at every other step; the two runs' values 12% apart at most before it).
    None where the runs are not both fp16 or did not record ``grad_amax`` (older runs)."""
    from dualtrain.spec import from_dict

    if precision_of(a.spec) != "fp16" or precision_of(b.spec) != "fp16":
        return None
    amax = [R.step_map(r, "grad_amax") for r in (a, b)]
    if not amax[0] or not amax[1]:
        return None
    try:
        growth = float(from_dict(a.spec).precision.loss_scale.growth_factor)
    except Exception:  # noqa: BLE001 - a spec this version cannot read
        return None
    skipped = [R.step_map(r, "skipped") for r in (a, b)]
    scales = [R.step_map(r, "loss_scale") for r in (a, b)]
    labels = R.labels(a, b)
    out = []
    for s in R.common_steps(*skipped):
        if bool(skipped[0][s]) == bool(skipped[1][s]):
            continue
        i = 0 if skipped[0][s] else 1
        j = 1 - i
        own, other = amax[i].get(s, math.nan), amax[j].get(s, math.nan)
        headroom = other * scales[i].get(s, math.nan) / FP16_MAX
        ok = not math.isfinite(own) and math.isfinite(headroom) and headroom >= 1.0 / growth
        out.append(SkipDifference(s, labels[i], labels[j], own, headroom, ok))
    return out


def _skip_note(diffs: list[SkipDifference]) -> str:
    parts = []
    for d in diffs:
        text = (f"step {d.step}: {d.skipper} skipped, {d.other}'s gradient at {d.headroom:.2f} of "
                f"the fp16 maximum under {d.skipper}'s scale")
        if math.isfinite(d.skipper_amax):
            text += f", but {d.skipper}'s own gradient was finite ({d.skipper_amax:.3g})"
        parts.append(text + ("" if d.at_threshold else " (not at the overflow threshold)"))
    return "; ".join(parts)


def check_loss_scale(a: RunRecord, b: RunRecord) -> Check:
    """Identical per-step loss scale (fp16's dynamic scale; 1.0 at every step for fp32/bf16); a run
    whose scales break GradScaler's rule on its own skip decisions is named. fp16: once the skip
    decisions part at the overflow threshold (:func:`skip_differences`), the scales after that step
    follow each run's own decisions, which the rule judges."""
    c = _sequence_check("loss_scale", "loss_scale", a, b)
    diffs = skip_differences(a, b)
    if not c.passed and diffs and all(d.at_threshold for d in diffs):
        parted = diffs[0].step
        ma, mb = R.step_map(a, "loss_scale"), R.step_map(b, "loss_scale")
        early = [s for s in R.common_steps(ma, mb) if s <= parted and ma[s] != mb[s]]
        note = _steps_note(set(ma), set(mb), *R.labels(a, b))
        if not early and not note:
            later = sum(1 for s in R.common_steps(ma, mb) if ma[s] != mb[s])
            c.passed, c.value, c.first_step = True, 0.0, None
            c.detail = (f"identical up to step {parted}, where the skip decisions part at the fp16 "
                        f"overflow threshold; after it each run's own decisions set its scale "
                        f"({later} steps differ), by the rule")
    for rec in (a, b):
        off = scale_rule_violation(rec)
        if off is not None:
            c.culprits.append(path_name(rec))
            c.detail += f"; {R.label(rec, 'A')} breaks the loss-scale rule at {off}"
            c.passed = False
    return c


def check_skipped(a: RunRecord, b: RunRecord) -> Check:
    """Identical per-step skip decisions (an overflow on any replica skips the step on all); fp16
    runs may part only at the overflow threshold (:func:`skip_differences`)."""
    c = _sequence_check("skipped", "skipped", a, b)
    diffs = skip_differences(a, b)
    if c.passed or not diffs:
        return c
    off = [d for d in diffs if not d.at_threshold]
    note = _steps_note(set(R.step_map(a, "skipped")), set(R.step_map(b, "skipped")),
                       *R.labels(a, b))
    c.value = float(len(off))
    c.passed = not off and not note
    c.first_step = off[0].step if off else None
    # A skip whose own gradient was finite broke the rule "skip exactly when the all-reduced gradient
    # is not finite" on that run's path; a non-finite one away from the threshold is judged by the
    # one-step probes (either path may be the one that is off).
    by_label = dict(zip(R.labels(a, b), (a, b)))
    c.culprits = sorted({path_name(by_label[d.skipper]) for d in off
                         if math.isfinite(d.skipper_amax)})
    c.detail = (f"{len(diffs)} step(s) differ, " + ("each at the fp16 overflow threshold"
                                                     if not off else f"{len(off)} not at the overflow "
                                                     "threshold") + f": {_skip_note(diffs)}"
                + (f"; {note}" if note else ""))
    return c


def not_run(name: str, group: str, why: str) -> Check:
    return Check(name, None, None, True, f"not run: {why}", informational=True, group=group, ran=False)


# ---- semantics: the fp64 reference pair ------------------------------------------------------------

def check_reference_loss(ref: Reference) -> Check:
    """Per-step |loss| difference of the fp64 pair over the whole run, against REFERENCE.loss_abs."""
    la, lb = R.labels(ref.a, ref.b)
    steps, diff = R.loss_diff(ref.a, ref.b)
    note = _steps_note(set(R.step_map(ref.a, "loss")), set(R.step_map(ref.b, "loss")), la, lb)
    if steps.size == 0:
        return Check("reference_loss", None, REFERENCE.loss_abs, False, "no common steps",
                     unit="abs", group=SEMANTICS)
    diff = np.where(np.isnan(diff), np.inf, diff)
    over = diff > REFERENCE.loss_abs
    worst = int(np.argmax(diff))
    first = int(steps[np.argmax(over)]) if over.any() else None
    detail = (f"fp64 pair, {steps.size} steps: max |loss diff| {_fmt(float(diff[worst]))} at step "
              f"{int(steps[worst])}")
    if first is not None:
        at = float(diff[np.argmax(over)])
        detail += f"; first over {_fmt(REFERENCE.loss_abs)} at step {first} ({_fmt(at)})"
    if note:
        detail += f"; {note}"
    return Check("reference_loss", float(diff[worst]), REFERENCE.loss_abs, first is None and not note,
                 detail, unit="abs", first_step=_min_step(first, _first_missing(
                     set(R.step_map(ref.a, "loss")), set(R.step_map(ref.b, "loss")))), group=SEMANTICS)


def check_reference_weights(ref: Reference) -> Check:
    """Per-tensor relative difference of the fp64 pair's final weights, against REFERENCE.weights_rel."""
    wa, wb = R.load_final(ref.a), R.load_final(ref.b)
    if wa is None or wb is None:
        return Check("reference_weights", None, REFERENCE.weights_rel, False,
                     "weights_final.npz missing in the fp64 " + ("A" if wa is None else "B") + " run",
                     unit="rel", group=SEMANTICS)
    problem = R.layout_problem(wa, wb)
    if problem:
        return Check("reference_weights", math.inf, REFERENCE.weights_rel, False, problem, unit="rel",
                     group=SEMANTICS)
    rel = {k: (math.inf if math.isnan(v) else v) for k, v in R.rel_diff(wa, wb).items()}
    worst = max(rel, key=rel.__getitem__)
    bad = [k for k, v in rel.items() if v > REFERENCE.weights_rel]
    dtypes = sorted({str(v.dtype) for v in (*wa.values(), *wb.values())})
    detail = f"fp64 pair, per tensor: worst {worst} {_fmt(rel[worst])} ({'/'.join(dtypes)} weights)"
    if dtypes != ["float64"]:
        detail += "; the reference runs' final weights are not float64"
    if bad:
        detail += f"; over: {', '.join(bad)}"
    return Check("reference_weights", rel[worst], REFERENCE.weights_rel,
                 not bad and dtypes == ["float64"], detail, unit="rel", group=SEMANTICS)


def check_reference_eval(ref: Reference) -> Check:
    """At every evaluation: |eval loss diff| <= REFERENCE.eval_loss_abs and identical accuracy."""
    la, lb = R.labels(ref.a, ref.b)
    loss_a, loss_b = R.step_map(ref.a, "loss", "eval"), R.step_map(ref.b, "loss", "eval")
    acc_a, acc_b = R.step_map(ref.a, "accuracy", "eval"), R.step_map(ref.b, "accuracy", "eval")
    steps = R.common_steps(loss_a, loss_b)
    note = _steps_note(set(loss_a), set(loss_b), la, lb)
    if not steps:
        return Check("reference_eval", None, REFERENCE.eval_loss_abs, False, "no common eval steps",
                     unit="abs", group=SEMANTICS)
    diff = {s: abs(loss_a[s] - loss_b[s]) for s in steps}
    diff = {s: (math.inf if math.isnan(v) else v) for s, v in diff.items()}
    bad = [s for s in steps if diff[s] > REFERENCE.eval_loss_abs or acc_a.get(s) != acc_b.get(s)]
    worst = max(steps, key=diff.__getitem__)
    same_acc = all(acc_a.get(s) == acc_b.get(s) for s in steps)
    detail = (f"fp64 pair, {len(steps)} evaluation(s): max |eval loss diff| {_fmt(diff[worst])} at step "
              f"{worst}; accuracy {'identical' if same_acc else 'differs'} "
              f"(final {100 * acc_a[steps[-1]]:.2f}%)")
    if bad:
        s = bad[0]
        detail += (f"; first over at step {s}: loss {loss_a[s]:.17g} vs {loss_b[s]:.17g}, accuracy "
                   f"{100 * acc_a.get(s, math.nan):.2f}% vs {100 * acc_b.get(s, math.nan):.2f}%")
    if note:
        detail += f"; {note}"
    return Check("reference_eval", diff[worst], REFERENCE.eval_loss_abs, not bad and not note, detail,
                 unit="abs", first_step=_min_step(bad[0] if bad else None,
                                                  _first_missing(set(loss_a), set(loss_b))),
                 group=SEMANTICS)


# ---- numerics: the requested precision against its rounding distance from fp64 --------------------

@dataclass
class Trajectory:
    """Per-step numbers behind the trajectory check (also what the report plots)."""

    steps: np.ndarray
    cross: np.ndarray
    """|loss_a - loss_b| at each step."""
    rounding_a: np.ndarray | None
    """|loss_a - loss_ref_a| at each step: A's distance to its own fp64 run (NaN where it did not run)."""
    rounding_b: np.ndarray | None
    noise: np.ndarray | None
    """The noise model: the larger of the two backends' distances to their fp64 runs (running max)."""
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
        noise[covered] = np.maximum(R.running_max(da[covered]),
                                    R.running_max(db[covered]))
    base = np.maximum(np.nan_to_num(noise, nan=0.0), tol.traj_abs_floor)
    allowed = np.where(covered, tol.factor * base, tol.traj_fixed)
    return Trajectory(steps, cross, da, db, noise, allowed, covered)


def check_trajectory(a: RunRecord, b: RunRecord, ref: Reference | None = None,
                     tol: Tolerance | None = None) -> Check:
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
        first_note = (f"; first over at step {first}: |diff| {_fmt(float(cross[i]))} > "
                      f"{_fmt(float(t.allowed[i]))}")
    if not t.covered.any():
        value = float(cross.max())
        why = "no fp64 reference" if ref is None else "the fp64 reference shares no step with the runs"
        detail = (f"{why}: fixed tolerance {_fmt(tol.traj_fixed)} ({tol.precision}) over {n} steps "
                  f"({span}); max |loss diff| {_fmt(value)}{first_note}")
        return Check("trajectory", value, tol.traj_fixed, first is None, detail, unit="abs",
                     first_step=first, group=NUMERICS)
    ratio = cross / t.allowed * tol.factor  # <= factor exactly where the step passes
    worst = int(np.argmax(ratio))
    n_cov = int(t.covered.sum())
    la, lb = R.labels(a, b)
    # covered steps exist: trajectory() had the fp64 runs' losses
    assert t.rounding_a is not None and t.rounding_b is not None and t.noise is not None
    end_a = float(np.nanmax(t.rounding_a[t.covered]))
    end_b = float(np.nanmax(t.rounding_b[t.covered]))
    detail = (f"{n_cov} of {n} steps ({span}) against {tol.factor:g} x max(distance to fp64 (running max, "
              f"farther backend), {_fmt(tol.traj_abs_floor)}); worst step {int(t.steps[worst])}: "
              f"|diff| {_fmt(float(cross[worst]))}, distance to fp64 "
              f"{_fmt(float(np.nan_to_num(t.noise[worst])))}; largest distance to fp64: {la} "
              f"{_fmt(end_a)}, {lb} {_fmt(end_b)}")
    if n_cov < n:
        uncovered = t.steps[~t.covered]
        detail += (f"; steps {int(uncovered[0])}-{int(uncovered[-1])} (no fp64 data) against the fixed "
                   f"tolerance {_fmt(tol.traj_fixed)}")
    detail += first_note
    return Check("trajectory", float(ratio[worst]), tol.factor, first is None, detail,
                 unit="x rounding", first_step=first, group=NUMERICS)


def check_final_weights(a: RunRecord, b: RunRecord, ref: Reference | None = None,
                        tol: Tolerance | None = None) -> Check:
    """Per-tensor relative difference of weights_final against each backend's distance to fp64."""
    tol = tol or tolerance_of(a, b)
    wa, wb = R.load_final(a), R.load_final(b)
    if wa is None or wb is None:
        return Check("final_weights", None, None, False, "weights_final.npz missing in "
                     + ("A" if wa is None else "B"), group=NUMERICS)
    problem = R.layout_problem(wa, wb)
    if problem:
        return Check("final_weights", math.inf, None, False, problem, group=NUMERICS)
    cross = R.rel_diff(wa, wb)
    noise = None
    if ref is not None:
        ra, rb = R.load_final(ref.a), R.load_final(ref.b)
        if ra is not None and rb is not None and R.layout_problem(wa, ra) is None \
                and R.layout_problem(wb, rb) is None:
            da, db = R.rel_diff(wa, ra), R.rel_diff(wb, rb)
            noise = {k: max(da[k], db[k]) for k in cross}
    if noise is None:
        worst = max(cross, key=cross.__getitem__)
        bad = [k for k, v in cross.items() if not v <= tol.weights_fixed]
        why = "no fp64 reference" if ref is None else "fp64 reference weights unusable"
        detail = (f"{why}: fixed relative tolerance {_fmt(tol.weights_fixed)}; worst {worst} "
                  f"{_fmt(cross[worst])}")
        if bad:
            detail += f"; over: {', '.join(bad)}"
        return Check("final_weights", cross[worst], tol.weights_fixed, not bad, detail, unit="rel",
                     group=NUMERICS)
    ratio = {k: cross[k] / max(noise[k], tol.weights_floor) for k in cross}
    ratio = {k: (math.inf if math.isnan(v) else v) for k, v in ratio.items()}
    worst = max(ratio, key=ratio.__getitem__)
    bad = [k for k, v in ratio.items() if v > tol.factor]
    detail = (f"per tensor rel diff vs {tol.factor:g} x max(distance to fp64 (farther backend), "
              f"{_fmt(tol.weights_floor)}); worst {worst}: {_fmt(cross[worst])} vs {_fmt(noise[worst])}")
    if bad:
        detail += f"; over: {', '.join(bad)}"
    return Check("final_weights", ratio[worst], tol.factor, not bad, detail, unit="x rounding",
                 group=NUMERICS)


def _accuracies(rec: RunRecord) -> dict[int | str, float]:
    """Test accuracy per eval step, and the final one under the key "final"."""
    acc: dict[int | str, float] = {k: v for k, v in R.step_map(rec, "accuracy", "eval").items()}
    final = rec.summary.get("test_accuracy")
    if final is not None:
        acc["final"] = float(final)
    return acc


def check_eval(a: RunRecord, b: RunRecord, ref: Reference | None = None,
               tol: Tolerance | None = None) -> Check:
    """Test accuracy, finally and at every eval step: |acc_A - acc_B| <= max(eval_pp, factor x the
    larger backend's accuracy distance to its fp64 run) (without a reference: eval_pp)."""
    tol = tol or tolerance_of(a, b)
    la, lb = R.labels(a, b)
    ea, eb = _accuracies(a), _accuracies(b)
    if "final" not in ea or "final" not in eb:
        return Check("eval", None, tol.eval_pp, False,
                     f"no final test accuracy in {la if 'final' not in ea else lb}", unit="pp",
                     group=NUMERICS)
    points = [s for s in sorted(k for k in ea if k != "final") if s in eb] + ["final"]
    ra, rb = (_accuracies(ref.a), _accuracies(ref.b)) if ref is not None else ({}, {})
    diff, allowed = {}, {}
    for s in points:
        d = 100.0 * abs(ea[s] - eb[s])
        diff[s] = math.inf if math.isnan(d) else d
        allowed[s] = tol.eval_pp
        if s in ra and s in rb:
            dist = 100.0 * max(abs(ea[s] - ra[s]), abs(eb[s] - rb[s]))
            allowed[s] = max(tol.eval_pp, tol.factor * dist) if not math.isnan(dist) else tol.eval_pp
    over = [s for s in points if diff[s] > allowed[s]]
    worst = max(points, key=lambda s: diff[s] / allowed[s])
    # the keys besides "final" are the int eval steps
    note = _steps_note({k for k in ea if isinstance(k, int)}, {k for k in eb if isinstance(k, int)},
                       la, lb)
    detail = f"final {la} {100 * ea['final']:.2f}% vs {lb} {100 * eb['final']:.2f}% ({diff['final']:.3f} pp)"
    if len(points) > 1:
        detail += f"; {len(points) - 1} eval step(s)"
    detail += (f"; worst {'final' if worst == 'final' else f'step {worst}'}: {diff[worst]:.3f} pp "
               f"against {allowed[worst]:.3g} pp")
    if ref is not None:
        detail += (f" = max({tol.eval_pp:g}, {tol.factor:g} x the farther backend's accuracy distance "
                   f"to fp64)")
    if over:
        detail += f"; over at {', '.join(map(str, over[:5]))}"
    if note:
        detail += f"; {note}"
    steps_over = [s for s in over if isinstance(s, int)]  # all but "final"
    return Check("eval", diff[worst], allowed[worst], not over and not note, detail, unit="pp",
                 first_step=_min_step(steps_over[0] if steps_over else None,
                                      _first_missing(set(R.step_map(a, "accuracy", "eval")),
                                                     set(R.step_map(b, "accuracy", "eval")))),
                 group=NUMERICS)


# ---- numerics: the requested precision's path, judged by one-step probes ----------------------------

def path_name(rec: RunRecord) -> str:
    """The precision path a run trains in: "tf fp16 path"."""
    return f"{R.label(rec, 'A')} {precision_of(rec.spec)} path"


def local_errors(a: RunRecord, b: RunRecord, ref: Reference,
                 bound: LocalBound) -> tuple[list[L.Probe], list[L.Probe]] | None:
    """Both runs' probes against the fp64 run of the reference pair that recorded the states (the
    fp64 torch run, for ``compare --config``); None when the runs did not replay probes or neither
    reference run recorded them. The reference pair is the compared spec in fp64 (compare_dirs
    checks it), so its recorded states are the ones the runs replayed, to fp64 rounding."""
    from dualtrain.spec import from_dict

    if not all((rec.summary.get("probes") or {}).get("mode") == "replay" for rec in (a, b)):
        return None
    source = next((r.path for r in (ref.a, ref.b)
                   if (r.summary.get("probes") or {}).get("mode") == "record"), None)
    if source is None:
        return None
    opt = from_dict(a.spec).optimizer
    pa, pb = (L.measure(rec.path, source, opt, bound) for rec in (a, b))
    if not pa or not pb:
        return None
    return pa, pb


def _grad_cross(mine: dict[int, L.Probe], other: dict[int, L.Probe], steps: list[int],
                floor: float, ratio: float, agg: float) -> float:
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


def check_local(quantity: str, a: RunRecord, b: RunRecord, errs: tuple[list[L.Probe], list[L.Probe]],
                bound: LocalBound) -> Check:
    """One quantity of the one-step probes: each backend's error at every probe step against the a
    priori bound, and its rms over the probes against the other backend's (dualtrain.parity.local)."""
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
    if quantity == "grad":  # tensor by tensor, each against the same tensor of the other backend
        cross = [_grad_cross(by[i], by[1 - i], steps, cross_floor, bound.ratio, agg[i])
                 for i in range(2)]
    ratio, culprits, first = 0.0, [], None
    per_backend = []
    for i, rec in enumerate(runs):
        r_prior = [v / p for v, p in zip(vals[i], prior)]
        if summary is L.median:  # the a priori bound judges the median too (one value per probe)
            r_judged = [summary(r_prior)]
            over = [steps[k] for k, r in enumerate(r_prior) if r > 1.0] if r_judged[0] > 1 else []
        else:
            r_judged = r_prior
            over = [steps[k] for k, r in enumerate(r_prior) if r > 1.0]
        r_cross = agg[i] / cross[i]
        worst = max(range(len(steps)), key=lambda k: r_prior[k])
        bad = bool(over) or r_cross > 1.0
        if bad:
            culprits.append(path_name(rec))
            s_first = over[0] if over else steps[max(range(len(steps)), key=lambda k: vals[i][k])]
            first = s_first if first is None else min(first, s_first)
        ratio = max(ratio, max(r_judged), r_cross)
        judged = f"; {what} {max(r_judged):.2g} x a priori" if what == "median" else ""
        tensor = by[i][steps[worst]].worst_tensor.get(quantity)
        tensor = f", most in {tensor}" if tensor else ""
        per_backend.append(f"{R.labels(a, b)[i]} {what} {_fmt(agg[i])} (max {_fmt(vals[i][worst])} at "
                           f"step {steps[worst]}{tensor}, {r_prior[worst]:.2g} x a priori{judged}; "
                           f"{what} {r_cross:.2g} x cross)")
    how = {"update": f"rounding floor + {bound.update_c:g} u_param",
           "loss": f"{bound.loss_c:g} u", "grad": f"{bound.grad_c:g} u"}[quantity]
    detail = (f"{L.WHAT[quantity]}, one step from the fp64 state at {len(steps)} probe steps "
              f"({', '.join(map(str, steps))}): " + "; ".join(per_backend) +
              f"; bounds: a priori {how} ({bound.precision} u = {bound.u:.3g})"
              f"{' on the median over the probes' if what == 'median' else ' at every probe'}, "
              + (f"cross {bound.ratio:g} x max(other backend's {what}, {_fmt(cross_floor)})"
                 if quantity != "grad" else
                 f"cross {bound.ratio:g} x max(the same tensor's median on the other backend, "
                 f"{bound.grad_floor:g} u + its accumulation allowance {bound.grad_lambda:g} "
                 f"sqrt(n) u_param); each tensor against its absolute scale x (1 + the allowance "
                 f"/ {bound.grad_c:g} u)"))
    if culprits:
        detail += f"; off: {', '.join(culprits)}"
    per_tensor = (" (tensor by tensor; each tensor's error against its absolute scale x its "
                  "accumulation allowance)") if quantity == "grad" else ""
    data = {"quantity": quantity, "steps": steps, "a": vals[0], "b": vals[1], "a_priori": prior,
            "summary": what, "aggregate": agg, "cross": cross, "rounding_floor": floors,
            "bound_source": f"a priori {how} ({'median over the probes' if what == 'median' else 'every probe'}); "
                            f"cross {bound.ratio:g} x the other backend's {what}{per_tensor}"}
    return Check(name, ratio, 1.0, not culprits, detail, unit="x bound", first_step=first,
                 group=NUMERICS, culprits=culprits, data=data)


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
    for rec, r64 in ((a, b), (b, a)) if cross else ((a, ref.a), (b, ref.b)):
        acc, acc64 = rec.summary.get("test_accuracy"), r64.summary.get("test_accuracy")
        label = R.label(rec, "A")
        if acc is None or acc64 is None:
            return Check("convergence", None, bound.accuracy_pp, False,
                         f"no final test accuracy in {label}'s run or its fp64 run", unit="pp",
                         group=NUMERICS)
        drop = 100.0 * (float(acc64) - float(acc))
        drop = math.inf if math.isnan(drop) else drop
        drops.append(drop)
        if drop > bound.accuracy_pp:
            culprits.append(path_name(rec))
        against = f"{R.label(r64, 'B')}'s run" if cross else "its fp64 run"
        parts.append(f"{label} {100 * float(acc):.2f}% vs {against} {100 * float(acc64):.2f}%")
    detail = "; ".join(parts) + (f"; a run may end at most {bound.accuracy_pp:g} pp below its own fp64 "
                                 f"run ({bound.precision})")
    if cross:
        detail += (f"; both runs skipped {100 * shares[0]:.0f}% / {100 * shares[1]:.0f}% of their "
                   f"steps by the loss-scale rule (the fp64 runs applied every update), so each is "
                   f"judged against the other backend's run")
    if culprits:
        detail += f"; off: {', '.join(culprits)}"
    return Check("convergence", max(drops), bound.accuracy_pp, not culprits, detail, unit="pp below fp64",
                 group=NUMERICS, culprits=culprits)


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
        why = ("no one-step probes in these runs (dualtrain compare --config records and replays "
               "them)")
        checks = [not_run(n, NUMERICS, why) for n in LOCAL_CHECKS[:3]]
    else:
        checks = [check_local(q, a, b, errs, bound) for q in L.QUANTITIES]
    return checks + [check_convergence(a, b, ref, bound)]


def check_throughput(a: RunRecord, b: RunRecord) -> Check:
    la, lb = R.labels(a, b)
    ta = float(a.summary.get("train_samples_per_s") or 0.0)
    tb = float(b.summary.get("train_samples_per_s") or 0.0)
    ratio = tb / ta if ta > 0 else math.nan
    detail = f"{la} {ta:,.0f} samples/s, {lb} {tb:,.0f} samples/s (informational)"
    return Check("throughput", ratio, None, True, detail, unit=f"{lb}/{la}", informational=True,
                 group=INFO)


def is_fp64_pair(a: RunRecord, b: RunRecord) -> bool:
    return precision_of(a.spec) == "fp64" and precision_of(b.spec) == "fp64"


def run_checks(a: RunRecord, b: RunRecord, ref: Reference | None = None) -> list[Check]:
    """Every check, in report order. Two fp64 runs are their own reference pair."""
    tol = tolerance_of(a, b)
    checks = [check_spec(a, b), check_sharding(a, b), check_init_weights(a, b), check_lr(a, b, tol),
              check_loss_scale(a, b), check_skipped(a, b)]
    fp64 = is_fp64_pair(a, b)
    if fp64:
        ref = Reference(a, b)
    if ref is not None:
        checks += [check_reference_loss(ref), check_reference_weights(ref), check_reference_eval(ref)]
    else:
        why = ("no fp64 reference pair (compare --config --reference none, or two run folders "
               "without --reference-runs): semantics were not checked")
        checks += [not_run(n, SEMANTICS, why)
                   for n in ("reference_loss", "reference_weights", "reference_eval")]
    if fp64:
        why = "the runs are fp64: the reference checks are their result checks"
        checks += [not_run("trajectory", NUMERICS, why), not_run("final_weights", NUMERICS, why)]
    else:
        checks += [check_trajectory(a, b, ref, tol), check_final_weights(a, b, ref, tol)]
    checks += [check_eval(a, b, None if fp64 else ref, tol)]
    if not fp64:
        checks += local_checks(a, b, ref)
    checks += [check_throughput(a, b)]
    return checks


def all_passed(checks: list[Check]) -> bool:
    return all(c.passed or c.informational for c in checks)

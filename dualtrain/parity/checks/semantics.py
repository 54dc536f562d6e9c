"""The ``semantics`` group: the fp64 reference pair agrees to rounding over the whole run."""

from __future__ import annotations

import math

import numpy as np

from dualtrain.parity import readings as R
from dualtrain.parity import twin
from dualtrain.parity.checks.base import (
    Reference,
    earliest_step,
    first_missing_step,
    fmt_num,
    missing_steps_note,
)
from dualtrain.parity.tolerances import (
    REFERENCE,
)
from dualtrain.records.verdict import SEMANTICS, Check

#: the semantic checks, in report order
REFERENCE_CHECKS = ("reference_loss", "reference_weights", "reference_eval")

# ---- semantics: the fp64 reference pair ----------------------------------------------------------


def check_reference_loss(ref: Reference) -> Check:
    """Per-step |loss| difference of the fp64 pair over the whole run, against
    REFERENCE.loss_abs, or, with a rounding twin, against what the twin makes of one rounding by
    that step (dualtrain.parity.twin.envelope)."""
    la, lb = R.labels(ref.a, ref.b)
    steps, _ = R.loss_diff(ref.a, ref.b)
    ma, mb = R.step_map(ref.a, "loss"), R.step_map(ref.b, "loss")
    diff = np.array([R.scaled_diff(ma[s], mb[s]) for s in steps.tolist()], dtype=np.float64)
    note = missing_steps_note(
        set(R.step_map(ref.a, "loss")), set(R.step_map(ref.b, "loss")), la, lb
    )
    if steps.size == 0:
        return Check(
            "reference_loss",
            None,
            REFERENCE.loss_abs,
            False,
            "no common steps",
            unit="abs",
            group=SEMANTICS,
        )
    diff = np.where(np.isnan(diff), np.inf, diff)
    bound = _loss_bounds(ref, steps.tolist(), "loss", "train", REFERENCE.loss_abs)
    over = diff > bound
    worst = int(np.argmax(diff / bound))
    first = int(steps[np.argmax(over)]) if over.any() else None
    detail = (
        f"fp64 pair, {steps.size} steps: max |loss diff| {fmt_num(float(np.max(diff)))} at step "
        f"{int(steps[int(np.argmax(diff))])}"
    )
    if first is not None:
        at = int(np.argmax(over))
        detail += (
            f"; first over {fmt_num(float(bound[at]))} at step {first} ({fmt_num(float(diff[at]))})"
            f"{_no_twin(ref, first)}"
        )
    if ref.twin is not None:
        near = f"step {int(steps[worst])}, {fmt_num(float(diff[worst]))} of {fmt_num(bound[worst])}"
        detail += f"; {_twin_clause(ref, REFERENCE.loss_abs, near)}"
    if note:
        detail += f"; {note}"
    return Check(
        "reference_loss",
        float(diff[worst]),
        float(bound[worst]),
        first is None and not note,
        detail,
        unit="abs",
        first_step=earliest_step(
            first,
            first_missing_step(set(R.step_map(ref.a, "loss")), set(R.step_map(ref.b, "loss"))),
        ),
        group=SEMANTICS,
    )


def _loss_bounds(ref: Reference, steps: list[int], key: str, kind: str, fixed: float) -> np.ndarray:
    """The bound at each step: ``fixed``, or with a rounding twin the twin's envelope over it."""
    if ref.twin is None:
        return np.full(len(steps), fixed)
    bound = twin.envelope(ref.a, ref.twin, key, kind, floor=fixed)
    return np.array([bound(s) for s in steps], dtype=np.float64)


def _twin_clause(ref: Reference, fixed: float, nearest: str) -> str:
    assert ref.twin is not None
    grown, raised = twin.measured(ref.a, ref.twin, fixed)
    if raised:
        return (
            f"bounds grow to {REFERENCE.twin_factor:g}x what training makes of one rounding "
            f"({grown}), at least {fmt_num(fixed)}; nearest its bound: {nearest}"
        )
    return f"{grown}: training does not amplify rounding past the fixed {fmt_num(fixed)} here"


def _no_twin(ref: Reference, first: int | None = None) -> str:
    """Where a fixed bound failed without a rounding twin: how to learn whether training amplifies
    rounding this far (not a question at step 1: its loss is on the initial weights)."""
    if ref.twin is not None:
        return ""
    if first == 1:
        return " (fixed bound: step 1's loss is on the initial weights, no rounding carried yet)"
    return (
        " (fixed bound, no rounding twin: dualtrain compare --config runs one, to tell a pair "
        "that training parts by rounding from one that computes something else)"
    )


def check_reference_weights(ref: Reference) -> Check:
    """Per-tensor relative difference of the fp64 pair's final weights, against
    REFERENCE.weights_rel."""
    wa, wb = R.load_final(ref.a), R.load_final(ref.b)
    if wa is None or wb is None:
        return Check(
            "reference_weights",
            None,
            REFERENCE.weights_rel,
            False,
            "weights_final.npz missing in the fp64 " + ("A" if wa is None else "B") + " run",
            unit="rel",
            group=SEMANTICS,
        )
    problem = R.layout_problem(wa, wb)
    if problem:
        return Check(
            "reference_weights",
            math.inf,
            REFERENCE.weights_rel,
            False,
            problem,
            unit="rel",
            group=SEMANTICS,
        )
    rel = {k: (math.inf if math.isnan(v) else v) for k, v in R.rel_diff(wa, wb).items()}
    bounds = dict.fromkeys(rel, REFERENCE.weights_rel)
    if ref.twin is not None:
        bounds = twin.tensor_bounds(ref.a, ref.twin, REFERENCE.weights_rel) or bounds
    largest = max(rel, key=rel.__getitem__)
    worst = max(rel, key=lambda k: rel[k] / bounds[k])
    bad = [k for k, v in rel.items() if v > bounds[k]]
    dtypes = sorted({str(v.dtype) for v in (*wa.values(), *wb.values())})
    detail = (
        f"fp64 pair, per tensor: worst {largest} {fmt_num(rel[largest])} "
        f"({'/'.join(dtypes)} weights)"
    )
    if ref.twin is not None:
        near = f"{worst}, {fmt_num(rel[worst])} of {fmt_num(bounds[worst])}"
        detail += f"; {_twin_clause(ref, REFERENCE.weights_rel, near)}"
    if dtypes != ["float64"]:
        detail += "; the reference runs' final weights are not float64"
    if bad:
        shown = sorted(bad, key=lambda k: -rel[k] / bounds[k])[:5]
        more = f" and {len(bad) - len(shown)} more" if len(bad) > len(shown) else ""
        detail += f"; over: {', '.join(shown)}{more}{_no_twin(ref)}"
    return Check(
        "reference_weights",
        rel[worst],
        bounds[worst],
        not bad and dtypes == ["float64"],
        detail,
        unit="rel",
        group=SEMANTICS,
    )


def _metric_agreement(
    ref: Reference, metric: str, steps: list[int], bound: dict[int, float]
) -> tuple[dict[int, bool], set[int]]:
    """Per eval step, whether the pair's metric agrees (test and validation split): accuracy
    identical, an mae within the step's bound; and the steps where the rounding twin shows
    training carrying a rounding past the fixed bound (its accuracy moves, or it raised the eval
    loss's bound), where accuracy is not held identical and the eval loss, which every sample
    moves, judges the step."""
    flips = set() if ref.twin is None else twin.accuracy_flips(ref.a, ref.twin, metric)
    # where the twin raised the bound, training carries a rounding far enough to move samples
    # across the boundary, whether or not the twin's own accuracy happened to move
    flips |= {s for s in steps if bound[s] > REFERENCE.eval_loss_abs}

    def same(s: int, x: float | None, y: float | None) -> bool:
        if x is None or y is None or (metric == "accuracy" and s not in flips):
            return x == y
        return metric == "accuracy" or R.scaled_diff(x, y) <= bound[s]

    pairs = [
        (R.step_map(r.a, key, "eval", present=True), R.step_map(r.b, key, "eval", present=True))
        for r, key in ((ref, metric), (ref, f"val_{metric}"))
    ]
    agree = {s: all(same(s, a.get(s), b.get(s)) for a, b in pairs) for s in steps}
    return agree, flips


def check_reference_eval(ref: Reference) -> Check:
    """At every evaluation, of the test split and of the validation split where there is one:
    |eval loss diff| <= REFERENCE.eval_loss_abs (relative above 1, :func:`records.scaled_diff`)
    and identical accuracy (classification) or an mae within the same bound (regression). With a
    rounding twin, the bound is the twin's envelope, and accuracy may differ at the evaluations
    where the twin's differs too."""
    la, lb = R.labels(ref.a, ref.b)
    metric = R.metric_name(ref.a)
    loss_a, loss_b = R.step_map(ref.a, "loss", "eval"), R.step_map(ref.b, "loss", "eval")
    acc_a, acc_b = R.step_map(ref.a, metric, "eval"), R.step_map(ref.b, metric, "eval")
    val_a = R.step_map(ref.a, "val_loss", "eval", present=True)
    val_b = R.step_map(ref.b, "val_loss", "eval", present=True)
    steps = R.common_steps(loss_a, loss_b)
    note = missing_steps_note(set(loss_a), set(loss_b), la, lb)
    if not steps:
        return Check(
            "reference_eval",
            None,
            REFERENCE.eval_loss_abs,
            False,
            "no common eval steps",
            unit="abs",
            group=SEMANTICS,
        )

    bounds = _loss_bounds(ref, steps, "loss", "eval", REFERENCE.eval_loss_abs)
    bound = {s: float(b) for s, b in zip(steps, bounds, strict=True)}
    agree, flips = _metric_agreement(ref, metric, steps, bound)
    diff = {s: R.scaled_diff(loss_a[s], loss_b[s]) for s in steps}
    for s in steps:  # the validation split, evaluated at the same steps
        if s in val_a or s in val_b:
            diff[s] = max(diff[s], R.scaled_diff(val_a.get(s, math.nan), val_b.get(s, math.nan)))
    diff = {s: (math.inf if math.isnan(v) else v) for s, v in diff.items()}
    bad = [s for s in steps if diff[s] > bound[s] or not agree[s]]
    worst = max(steps, key=lambda s: diff[s] / bound[s])
    same_acc = all(acc_a.get(s) == acc_b.get(s) for s in steps)
    final = acc_a[steps[-1]]
    shown = f"{100 * final:.2f}%" if metric == "accuracy" else f"{final:.6g}"
    split = "test and validation" if val_a else "test"
    verdict = "differs" if not same_acc else ("identical" if metric == "accuracy" else "agrees")
    detail = (
        f"fp64 pair, {len(steps)} evaluation(s) of the {split} split: max |eval loss diff| "
        f"{fmt_num(diff[worst])} at step {worst}; {metric} {verdict} (final {shown})"
    )
    if ref.twin is not None:
        near = f"step {worst}, {fmt_num(diff[worst])} of {fmt_num(bound[worst])}"
        detail += f"; {_twin_clause(ref, REFERENCE.eval_loss_abs, near)}"
    if flips:
        detail += (
            f"; at step(s) {', '.join(map(str, sorted(flips)))} training carries one rounding "
            f"far enough to move samples (the twin): the eval loss judges those"
        )
    if bad:
        s = bad[0]
        detail += (
            f"; first over at step {s}: loss {loss_a[s]:.17g} vs {loss_b[s]:.17g}, {metric} "
            f"{acc_a.get(s, math.nan):.17g} vs {acc_b.get(s, math.nan):.17g}"
        )
    if note:
        detail += f"; {note}"
    return Check(
        "reference_eval",
        diff[worst],
        bound[worst],
        not bad and not note,
        detail,
        unit="abs",
        first_step=earliest_step(
            bad[0] if bad else None, first_missing_step(set(loss_a), set(loss_b))
        ),
        group=SEMANTICS,
    )

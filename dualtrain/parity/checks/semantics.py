"""The ``semantics`` group: the fp64 reference pair agrees to rounding over the whole run."""

from __future__ import annotations

import math

import numpy as np

from dualtrain.parity import readings as R
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

# ---- semantics: the fp64 reference pair ----------------------------------------------------------


def check_reference_loss(ref: Reference) -> Check:
    """Per-step |loss| difference of the fp64 pair over the whole run, against
    REFERENCE.loss_abs."""
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
    over = diff > REFERENCE.loss_abs
    worst = int(np.argmax(diff))
    first = int(steps[np.argmax(over)]) if over.any() else None
    detail = (
        f"fp64 pair, {steps.size} steps: max |loss diff| {fmt_num(float(diff[worst]))} at step "
        f"{int(steps[worst])}"
    )
    if first is not None:
        at = float(diff[np.argmax(over)])
        detail += f"; first over {fmt_num(REFERENCE.loss_abs)} at step {first} ({fmt_num(at)})"
    if note:
        detail += f"; {note}"
    return Check(
        "reference_loss",
        float(diff[worst]),
        REFERENCE.loss_abs,
        first is None and not note,
        detail,
        unit="abs",
        first_step=earliest_step(
            first,
            first_missing_step(set(R.step_map(ref.a, "loss")), set(R.step_map(ref.b, "loss"))),
        ),
        group=SEMANTICS,
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
    worst = max(rel, key=rel.__getitem__)
    bad = [k for k, v in rel.items() if v > REFERENCE.weights_rel]
    dtypes = sorted({str(v.dtype) for v in (*wa.values(), *wb.values())})
    detail = (
        f"fp64 pair, per tensor: worst {worst} {fmt_num(rel[worst])} ({'/'.join(dtypes)} weights)"
    )
    if dtypes != ["float64"]:
        detail += "; the reference runs' final weights are not float64"
    if bad:
        detail += f"; over: {', '.join(bad)}"
    return Check(
        "reference_weights",
        rel[worst],
        REFERENCE.weights_rel,
        not bad and dtypes == ["float64"],
        detail,
        unit="rel",
        group=SEMANTICS,
    )


def check_reference_eval(ref: Reference) -> Check:
    """At every evaluation, of the test split and of the validation split where there is one:
    |eval loss diff| <= REFERENCE.eval_loss_abs (relative above 1, :func:`records.scaled_diff`)
    and identical accuracy (classification) or an mae within the same bound (regression)."""
    la, lb = R.labels(ref.a, ref.b)
    metric = R.metric_name(ref.a)
    loss_a, loss_b = R.step_map(ref.a, "loss", "eval"), R.step_map(ref.b, "loss", "eval")
    acc_a, acc_b = R.step_map(ref.a, metric, "eval"), R.step_map(ref.b, metric, "eval")
    val_a = R.step_map(ref.a, "val_loss", "eval", present=True)
    val_b = R.step_map(ref.b, "val_loss", "eval", present=True)
    vm_a = R.step_map(ref.a, f"val_{metric}", "eval", present=True)
    vm_b = R.step_map(ref.b, f"val_{metric}", "eval", present=True)
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

    def same_metric(x: float | None, y: float | None) -> bool:
        if metric == "accuracy" or x is None or y is None:
            return x == y
        return R.scaled_diff(x, y) <= REFERENCE.eval_loss_abs

    diff = {s: R.scaled_diff(loss_a[s], loss_b[s]) for s in steps}
    for s in steps:  # the validation split, evaluated at the same steps
        if s in val_a or s in val_b:
            diff[s] = max(diff[s], R.scaled_diff(val_a.get(s, math.nan), val_b.get(s, math.nan)))
    diff = {s: (math.inf if math.isnan(v) else v) for s, v in diff.items()}
    agree = {
        s: same_metric(acc_a.get(s), acc_b.get(s)) and same_metric(vm_a.get(s), vm_b.get(s))
        for s in steps
    }
    bad = [s for s in steps if diff[s] > REFERENCE.eval_loss_abs or not agree[s]]
    worst = max(steps, key=diff.__getitem__)
    same_acc = all(agree.values())
    final = acc_a[steps[-1]]
    shown = f"{100 * final:.2f}%" if metric == "accuracy" else f"{final:.6g}"
    split = "test and validation" if val_a else "test"
    verdict = "differs" if not same_acc else ("identical" if metric == "accuracy" else "agrees")
    detail = (
        f"fp64 pair, {len(steps)} evaluation(s) of the {split} split: max |eval loss diff| "
        f"{fmt_num(diff[worst])} at step {worst}; {metric} {verdict} (final {shown})"
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
        REFERENCE.eval_loss_abs,
        not bad and not note,
        detail,
        unit="abs",
        first_step=earliest_step(
            bad[0] if bad else None, first_missing_step(set(loss_a), set(loss_b))
        ),
        group=SEMANTICS,
    )

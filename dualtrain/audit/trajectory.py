"""The loss-trajectory check of two recorded runs: the mean loss per window of common steps
within a bound stated from its causes (docs/audit.md, "The loss bound")."""

from __future__ import annotations

import math
from typing import TypeGuard

import numpy as np

from dualtrain.audit.read import Recorded
from dualtrain.records.verdict import FAIL, NOT_JUDGED, PASS, Check, judged_check

#: the loss trajectory's bound per window of steps: LOSS_RTOL of the window's mean loss plus
#: LOSS_SIGMAS standard errors of the window's mean step-by-step difference (docs/audit.md)
LOSS_RTOL = 0.05
LOSS_SIGMAS = 3.0
WINDOWS = 8


def _finite(x: float | None) -> TypeGuard[float]:
    return x is not None and math.isfinite(x)


def loss_pairs(a: Recorded, b: Recorded) -> list[tuple[int, float, float]]:
    """(step, loss A, loss B) at every common step where both runs have a finite loss."""
    return [
        (s, float(x), float(y))
        for s, (x, y) in enumerate(zip(a.series("loss"), b.series("loss"), strict=False), 1)
        if _finite(x) and _finite(y)
    ]


def loss_windows(a: Recorded, b: Recorded) -> list[dict[str, float]]:
    """Per window of common steps: both means, their difference and its bound."""
    pairs = loss_pairs(a, b)
    n = len(pairs)
    size = max(1, math.ceil(n / WINDOWS))
    out = []
    for start in range(0, n, size):
        part = pairs[start : start + size]
        xa, xb = np.array([p[1] for p in part]), np.array([p[2] for p in part])
        k = len(xa)
        se = float(np.std(xa - xb, ddof=1) / math.sqrt(k)) if k > 1 else 0.0
        mean = (xa.mean() + xb.mean()) / 2
        out.append(
            {
                "first": part[0][0],
                "last": part[-1][0],
                "a": float(xa.mean()),
                "b": float(xb.mean()),
                "diff": float(abs(xa.mean() - xb.mean())),
                "bound": float(LOSS_RTOL * abs(mean) + LOSS_SIGMAS * se),
            }
        )
    return out


def _unfinished_loss(a: Recorded, b: Recorded) -> str | None:
    """Why the loss cannot be judged (a run recorded none), or the first common step where one
    run's loss is finite and the other's is not (a run that diverged), as the check's detail."""
    sa, sb = a.series("loss"), b.series("loss")
    for tag, run, series in (("A", a, sa), ("B", b, sb)):
        if series and not any(_finite(x) for x in series):
            why = (
                "its train step updates no `loss` tracker (a custom train_step)"
                if run.framework == "tf"
                else "rec.step was given no finite loss"
            )
            return f"no loss recorded: {tag} has none at any step ({why})"
    return None


def _diverged(a: Recorded, b: Recorded) -> tuple[int, str] | None:
    for s, (x, y) in enumerate(zip(a.series("loss"), b.series("loss"), strict=False), 1):
        if _finite(x) != _finite(y):
            return s, f"step {s}: loss {x} in A, {y} in B (one run's loss is not finite)"
    return None


def check_loss(a: Recorded, b: Recorded) -> Check:
    judged = (
        f"the mean loss over {WINDOWS} windows of common steps: |A - B| <= {LOSS_RTOL:g} x the "
        f"window's mean + {LOSS_SIGMAS:g} standard errors of its mean step-by-step difference"
    )
    not_judged = "single steps (dropout masks and rounding differ per step), evaluation"
    missing = _unfinished_loss(a, b)
    if missing:
        return judged_check("loss trajectory", NOT_JUDGED, missing, judged, not_judged)
    diverged = _diverged(a, b)
    if diverged:
        step, detail = diverged
        return judged_check("loss trajectory", FAIL, detail, judged, not_judged, first_step=step)
    windows = loss_windows(a, b)
    if not windows:
        return judged_check(
            "loss trajectory", NOT_JUDGED, "no common step with a loss", judged, not_judged
        )
    bad = [w for w in windows if not w["diff"] <= w["bound"]]
    worst = max(windows, key=lambda w: w["diff"] / w["bound"] if w["bound"] else math.inf)
    detail = (
        f"steps {worst['first']}-{worst['last']}: mean loss {worst['a']:.4g} in A, "
        f"{worst['b']:.4g} in B (bound {worst['bound']:.3g})"
    )
    if bad:
        return judged_check(
            "loss trajectory",
            FAIL,
            detail,
            judged,
            not_judged,
            first_step=int(bad[0]["first"]),
            value=worst["diff"],
            bound=worst["bound"],
        )
    return judged_check(
        "loss trajectory",
        PASS,
        f"all windows within their bound; closest: {detail}",
        judged,
        not_judged,
        value=worst["diff"],
        bound=worst["bound"],
    )

"""The ``numerics`` group's convergence check: each run's final test metric against its own fp64
run's (or, when both fp16 runs skipped many steps, against the other backend's run)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from dualtrain.parity import readings as R
from dualtrain.parity.checks.base import Reference, path_name
from dualtrain.parity.tolerances import LocalBound
from dualtrain.records.record import TEST_CORRECT, RunRecord
from dualtrain.records.verdict import NUMERICS, Check

#: convergence: when both fp16 runs skipped at least this share of their steps by the loss-scale
#: rule (a spec whose initial scale overflows for many steps), they applied materially fewer
#: updates than their fp64 runs, so each is judged against the other backend's run instead.
SKIPPED_SHARE = 0.1


#: convergence: a drop beyond ``accuracy_pp`` fails where it stands out of the test split's
#: sampling noise: McNemar's exact test on the samples the two runs classify differently (their
#: TEST_CORRECT files) gives a one-sided p-value below this. A run of the same model that differs
#: only by rounding flips a few samples each way; on a split of a few hundred, 7 samples are 2 pp.
SIGNIFICANCE = 1e-3


def discordant(rec: RunRecord, other: RunRecord) -> tuple[int, int] | None:
    """(samples ``other`` got right and ``rec`` wrong, the reverse) at the final evaluation of the
    test split; None where either run has no per-sample record (a loss on float targets, a run
    from before it was written) or they differ in length."""
    a, b = (Path(r.path) / TEST_CORRECT for r in (rec, other))
    if not (a.is_file() and b.is_file()):
        return None
    mine, theirs = np.load(a).astype(bool), np.load(b).astype(bool)
    if mine.shape != theirs.shape:
        return None
    return int(np.sum(theirs & ~mine)), int(np.sum(mine & ~theirs))


def mcnemar_p(worse: int, better: int) -> float:
    """P(X >= worse) for X ~ Binomial(worse + better, 1/2): how likely a run no worse than the
    other loses at least ``worse`` of the samples they disagree on (exact, in log space)."""
    n = worse + better
    if worse == 0:
        return 1.0
    logs = [
        math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - n * math.log(2.0)
        for k in range(worse, n + 1)
    ]
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(x - top) for x in logs))


def _skipped_share(rec: RunRecord) -> float:
    skipped = R.step_map(rec, "skipped")
    return sum(1 for v in skipped.values() if v) / len(skipped) if skipped else 0.0


def check_convergence(a: RunRecord, b: RunRecord, ref: Reference, bound: LocalBound) -> Check:
    """Each run's final test accuracy against its own fp64 run's: at most ``accuracy_pp`` below,
    unless the samples the two runs classify differently say the drop is the test split's
    sampling noise (:data:`SIGNIFICANCE`); against the other backend's run when both skipped a
    large share of their steps by the loss-scale rule (:data:`SKIPPED_SHARE`)."""
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
        split = discordant(rec, r64)
        noise = split is not None and mcnemar_p(*split) >= SIGNIFICANCE
        if drop > bound.accuracy_pp and not noise:
            culprits.append(path_name(rec))
        against = f"{R.label(r64, 'B')}'s run" if cross else "its fp64 run"
        # both present: metric_points found "final" in each
        v, v64 = rec.summary[f"test_{metric}"], r64.summary[f"test_{metric}"]
        parts.append(
            f"{label} {100 * float(v):.2f}% vs {against} {100 * float(v64):.2f}%"
            if metric == "accuracy"
            else f"{label} {metric} {float(v):.6g} vs {against} {float(v64):.6g}"
        )
        if split is not None and drop > bound.accuracy_pp:
            parts[-1] += (
                f" ({split[0]} test samples right only in {against}, {split[1]} only in "
                f"{label}'s: McNemar p = {mcnemar_p(*split):.2g}, "
                + (
                    "within the test split's sampling noise)"
                    if noise
                    else f"below {SIGNIFICANCE:g}: a real drop)"
                )
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

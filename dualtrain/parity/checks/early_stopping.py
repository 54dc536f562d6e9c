"""The ``records`` group's check on train.early_stopping: each run's decisions (best, stop) follow
the rule on its own evaluations, and the two runs decide alike (or part only by rounding)."""

from __future__ import annotations

from typing import Any

from dualtrain.core.stopping import Stopper
from dualtrain.parity import readings as R
from dualtrain.records.record import RunRecord
from dualtrain.records.verdict import Check


def check_early_stopping(a: RunRecord, b: RunRecord, exact: bool = False) -> Check:
    """train.early_stopping: each run's decisions (best, stop) follow the rule
    (dualtrain.core.stopping) on its own evaluations, and the two runs decide alike. ``exact``
    (the fp64 pair): their decisions must be identical; otherwise they may part only where their
    values part (rounding moves a value across the threshold), which the eval and trajectory
    checks judge; after it each run decides on its own."""
    la, lb = R.labels(a, b)
    sa = a.summary.get("early_stopping") or {}
    sb = b.summary.get("early_stopping") or {}
    broken = []
    for label, rec, st in ((la, a, sa), (lb, b, sb)):
        if not st:
            broken.append(f"{label} records no early-stopping state")
            continue
        rule = Stopper(
            str(st["metric"]), st["mode"] == "max", st.get("patience"), float(st["min_delta"])
        )
        for r in sorted(rec.eval, key=lambda r: int(r["step"])):
            if st["metric"] not in r:
                continue
            want = rule.update(float(r[st["metric"]]), int(r["step"]))
            got = (bool(r.get("best")), bool(r.get("stop")))
            if got != want:
                broken.append(
                    f"{label} breaks the rule after step {r['step']} (recorded best={got[0]}, "
                    f"stop={got[1]}; the rule gives best={want[0]}, stop={want[1]})"
                )
                break
    keys = ("stopped_at", "best_step")
    diffs = [k for k in keys if sa.get(k) != sb.get(k)]
    shown = "; ".join(
        f"{k}: {la} {sa.get(k) if sa.get(k) is not None else 'none'}, "
        f"{lb} {sb.get(k) if sb.get(k) is not None else 'none'}"
        for k in keys
    )
    parted = _stop_parting(a, b, sa) if diffs and sa else None
    first = parted[0] if parted is not None else None
    if broken:
        passed, detail = False, "; ".join(broken) + f"; {shown}"
    elif not diffs:
        stopped = sa.get("stopped_at")
        detail = (
            f"both stop after step {stopped}" if stopped is not None else "neither stops early"
        ) + f", best {sa.get('metric')} after step {sa.get('best_step')}"
        passed = True
    elif exact:
        passed = False
        detail = (parted[1] + "; " if parted else "") + f"the fp64 pair decides apart: {shown}"
    else:
        passed, first = True, None
        detail = (
            parted[1] + "; " if parted else ""
        ) + f"each run follows the rule on its own values, which part by rounding: {shown}"
    return Check(
        "early_stopping",
        float(len(diffs) + len(broken)) if not passed else 0.0,
        0.0,
        passed,
        detail,
        unit="decisions",
        first_step=first,
    )


def _stop_parting(a: RunRecord, b: RunRecord, stop: dict[str, Any]) -> tuple[int, str] | None:
    """The first evaluation whose early-stopping decision (best, stop) differs, and by what
    margin each run decided there: how far its value was past, or short of, its best by
    min_delta, against how far apart the two runs' values are (in fp32/fp16/bf16 a decision
    within that distance of the threshold may part by rounding alone)."""
    metric, min_delta = str(stop.get("metric")), float(stop.get("min_delta") or 0.0)
    sign = 1.0 if stop.get("mode") == "max" else -1.0
    la, lb = R.labels(a, b)
    ea = {int(r["step"]): r for r in a.eval if metric in r}
    eb = {int(r["step"]): r for r in b.eval if metric in r}
    best: dict[str, float | None] = {la: None, lb: None}
    for step in sorted(set(ea) & set(eb)):
        ra, rb = ea[step], eb[step]
        if (bool(ra.get("best")), bool(ra.get("stop"))) != (
            bool(rb.get("best")),
            bool(rb.get("stop")),
        ):
            parts = []
            for label, r in ((la, ra), (lb, rb)):
                value, ref = float(r[metric]), best[label]
                gain = "first" if ref is None else f"improvement {sign * (value - ref):+.4g}"
                parts.append(f"{label} {value:.6g} ({gain})")
            gap = abs(float(ra[metric]) - float(rb[metric]))
            return step, (
                f"decisions part at the evaluation after step {step}: {metric} "
                f"{', '.join(parts)}, min_delta {min_delta:g}; the runs' values differ by "
                f"{gap:.3g} there"
            )
        for label, r in ((la, ra), (lb, rb)):
            if r.get("best"):
                best[label] = float(r[metric])
    return None

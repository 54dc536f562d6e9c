"""A compare whose runs did not all finish: the verdict is still written, for what it can judge.

A run can fail for a reason of the port, not of the machine (a probe state recorded by the other
backend that this one cannot load: an optimizer state with a slot this side does not keep; a
model that fails in one precision only). compare then judges what the finished runs allow: the
requested-precision pair when both finished (with the fp64 pair when it finished too), else the
fp64 pair alone (the semantic check), and adds a failing ``runs_finished`` check that names each
run that did not finish, its reason, and what it means for the port. The verdict line leads with
it (``verdict: FAIL, run failed: tf fp32 could not finish: ...``); with nothing left to compare,
verdict.json and report.md still say which run failed and why.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from dualtrain.driver.compare_plan import PlannedRun
from dualtrain.parity.report import REPORT_MD, VERDICT_FILE, Comparison, compare_dirs
from dualtrain.records.verdict import Check

RUN_FAILED = "run failed"

#: what a run that did not finish leaves unjudged, by its label
_MEANS = {
    "fp64-torch": (
        "the fp64 pair (the semantic check) and the one-step probes (whose states this run "
        "records) are not judged"
    ),
    "fp64-tf": "the fp64 pair (the semantic check) is not judged",
    "torch": "the requested-precision checks (trajectory, weights, eval, probes) are not judged",
    "tf": "the requested-precision checks (trajectory, weights, eval, probes) are not judged",
}


def _reason(text: str) -> str:
    return text.split(" (partial run left in")[0].strip()


def failure_check(runs: list[PlannedRun], failed: dict[str, str]) -> Check:
    by = {r.label: r for r in runs}
    parts = [
        f"{by[label].what} could not finish: {_reason(why)}; {_MEANS.get(label, 'not judged')}"
        for label, why in failed.items()
    ]
    return Check(
        "runs_finished",
        float(len(failed)),
        0.0,
        False,
        "; ".join(parts),
        unit="runs failed",
    )


def judge_partial(
    runs: list[PlannedRun], dirs: list[Path | None], failed: dict[str, str], notes: list[str]
) -> Comparison | None:
    """The comparison of the runs that finished, with the failure check; None when no pair of
    runs finished."""
    by = {run.label: d for run, d in zip(runs, dirs, strict=True)}
    ref_a, ref_b = by.get("fp64-torch"), by.get("fp64-tf")
    ref = (ref_a, ref_b) if ref_a is not None and ref_b is not None else None
    a, b = by.get("torch"), by.get("tf")
    if a is not None and b is not None:
        cmp = compare_dirs(a, b, ref, notes)
    elif ref is not None:
        notes.append("only the fp64 pair finished: it is compared on its own (the semantic check)")
        cmp = compare_dirs(ref[0], ref[1], None, notes)
    else:
        return None
    check = failure_check(runs, failed)
    cmp.checks.insert(0, check)
    d = cmp.diagnosis
    d.passed = False
    d.category = RUN_FAILED
    d.cause = RUN_FAILED
    d.failed_checks = [check.name, *d.failed_checks]
    d.finding = check.detail
    return cmp


def write_failed_only(out: Path, runs: list[PlannedRun], failed: dict[str, str]) -> str:
    """verdict.json and report.md when no two runs finished; returns the verdict line."""
    check = failure_check(runs, failed)
    line = f"verdict: FAIL, {RUN_FAILED}: {check.detail} (no runs left to compare)"
    doc = {
        "passed": False,
        "verdict": line,
        "category": RUN_FAILED,
        "checks": [check.as_dict()],
        "runs": {r.label: {"label": r.what, "path": str(r.where)} for r in runs},
        "failed_runs": {label: _reason(why) for label, why in failed.items()},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (out / VERDICT_FILE).write_text(json.dumps(doc, indent=1) + "\n")
    md = ["# dualtrain compare", "", f"**{line}**", "", "## Diagnosis", ""]
    md += [f"- {r.what} ({r.where}): {_reason(failed[r.label])}" for r in runs if r.label in failed]
    (out / REPORT_MD).write_text("\n".join(md) + "\n")
    return line

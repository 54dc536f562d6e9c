"""A compare against a saved one (``dualtrain compare --against OLD``): the saved compare's spec run
again with today's frameworks, each backend's runs held to the saved runs of the same backend.

A backend whose fp64 run parts from its saved fp64 run beyond rounding (1e-10, the fp64 pair's own
bound: same backend, same spec, same initial weights) changed; the framework versions both runs
recorded say between which releases. Where one backend changed and today's compare names the first
divergent operation (dualtrain.parity.replay), the verdict leads with it as a change of that op
between the two versions: "changed between keras 3.15.1 and 3.16.0: the output of layer '2'
(gelu) ...". A change with the same versions is told as such (another machine's kernels, a
patched framework). Framework-free: it reads run folders only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

from dualtrain.parity import readings as R
from dualtrain.parity.mechanisms import rel
from dualtrain.records.record import WEIGHTS_FINAL, RunRecord, read_run

#: compare --against's record in OUT
AGAINST_FILE = "against.json"
#: The runs compare writes, in OUT (fp64 ones decide what changed; the others are shown)
LABELS = ("fp64-torch", "fp64-tf", "torch", "tf")
#: Relative difference that counts as a change (the fp64 pair's fixed bound)
TOL = 1e-10
#: Recorded versions that are not a framework's
NOT_FRAMEWORKS = ("python",)


@dataclass(frozen=True)
class RunChange:
    """One run of today's compare held to the saved run of the same label."""

    label: str
    versions: list[str]
    """What changed between the saved run's versions and today's: ``"keras 3.15.1 -> 3.16.0"``."""
    first_step: int | None
    """The first step whose loss parts beyond TOL (None: none)."""
    loss_diff: float
    """The largest per-step loss difference (relative above 1)."""
    weights_rel: float
    """The largest per-tensor relative difference of the final weights."""

    @property
    def changed(self) -> bool:
        return self.first_step is not None or self.weights_rel > TOL


@dataclass(frozen=True)
class Against:
    saved: str
    runs: list[RunChange]
    lead: str
    """One line: which backend changed, between which versions (or none did)."""

    def changed(self) -> list[RunChange]:
        """The runs that decide (the fp64 ones, or the runs where they are fp64) that changed."""
        return [r for r in _deciding(self.runs) if r.changed]

    def to_json(self) -> dict[str, object]:
        out = asdict(self)
        for run, raw in zip(self.runs, out["runs"], strict=True):
            raw["changed"] = run.changed
            raw["weights_rel"] = run.weights_rel if math.isfinite(run.weights_rel) else "inf"
        return out


def version_changes(old: RunRecord, new: RunRecord) -> list[str]:
    va, vb = old.summary.get("versions") or {}, new.summary.get("versions") or {}
    return [
        f"{k} {va.get(k, '?')} -> {vb.get(k, '?')}"
        for k in sorted(set(va) | set(vb))
        if k not in NOT_FRAMEWORKS and va.get(k) != vb.get(k)
    ]


def same_backend_versions(a: RunRecord, b: RunRecord) -> str:
    """Two runs of one backend whose framework versions differ: ``"torch changed between torch
    2.13.0 and 2.14.0"``, else ""."""
    backend = a.summary.get("backend")
    changes = version_changes(a, b)
    if not backend or backend != b.summary.get("backend") or not changes:
        return ""
    return f"{backend} changed between {between(changes)}"


def _held(label: str, old: RunRecord, new: RunRecord) -> RunChange:
    lo, ln = R.step_map(old, "loss"), R.step_map(new, "loss")
    diffs = {s: R.scaled_diff(lo[s], ln[s]) for s in sorted(set(lo) & set(ln))}
    parted = [s for s, d in diffs.items() if not d <= TOL]  # NaN parts too
    wo, wn = R.load(old, WEIGHTS_FINAL), R.load(new, WEIGHTS_FINAL)
    worst = 0.0
    if wo is None or wn is None or set(wo) != set(wn):
        worst = math.inf
    else:
        worst = max((rel(wo[k], wn[k]) for k in wo), default=0.0)
    return RunChange(
        label,
        version_changes(old, new),
        parted[0] if parted else None,
        max(diffs.values(), default=0.0),
        worst,
    )


def against(saved: Path, today: Path) -> Against:
    """Today's compare in ``today`` held to the saved compare in ``saved``, run by run."""
    runs = []
    for label in LABELS:
        if (Path(saved) / label).is_dir() and (Path(today) / label).is_dir():
            runs.append(_held(label, read_run(Path(saved) / label), read_run(Path(today) / label)))
    return Against(str(saved), runs, _lead(runs))


def _deciding(runs: list[RunChange]) -> list[RunChange]:
    return [r for r in runs if r.label.startswith("fp64-")] or runs


def _lead(runs: list[RunChange]) -> str:
    fp64 = _deciding(runs)
    changed = [r for r in fp64 if r.changed]
    if not changed:
        moved = max((r.weights_rel for r in fp64), default=0.0)
        return (
            f"no change since the saved compare: each backend's runs agree with its saved ones "
            f"(final weights {moved:.2g} apart at most)"
        )
    parts = []
    for r in changed:
        backend = r.label.removeprefix("fp64-")
        where = f"from step {r.first_step}" if r.first_step else "in its final weights"
        if r.versions:
            parts.append(
                f"{backend} changed between {between(r.versions)} (its fp64 run parts from the "
                f"saved one {where})"
            )
        else:
            parts.append(
                f"{backend} changed with the same framework versions (its fp64 run parts from the "
                f"saved one {where}): another machine's kernels, or a patched framework"
            )
    return "; ".join(parts)


def between(changes: list[str]) -> str:
    """``["keras 3.15.1 -> 3.16.0"]`` -> ``"keras 3.15.1 and 3.16.0"``; several read as two sets
    (``"keras 3.15.1 / tensorflow 2.21.0 and keras 3.16.0 / tensorflow 2.22.0"``)."""
    if len(changes) == 1:  # the issue's own words: "keras 3.15.1 and 3.16.0"
        return changes[0].replace(" -> ", " and ")
    olds, news = [], []
    for c in changes:
        name, _, pair = c.partition(" ")
        a, _, b = pair.partition(" -> ")
        olds.append(f"{name} {a}")
        news.append(f"{name} {b}")
    return f"{' / '.join(olds)} and {' / '.join(news)}"

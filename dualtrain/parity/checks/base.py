"""What a check is (:class:`Check`), the fp64 pair it may use (:class:`Reference`), and the
formatting the checks share."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from dualtrain.jsonio import json_safe
from dualtrain.parity import readings as R
from dualtrain.parity.tolerances import (
    Tolerance,
    precision_of,
    tolerance_for,
)
from dualtrain.records.record import RunRecord

RECORDS, SEMANTICS, NUMERICS, INFO = "records", "semantics", "numerics", "info"


@dataclass
class Reference:
    """The fp64 reference pair: run A's spec in float64 on A's backend (``a``) and on B's
    (``b``)."""

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
    """Numerics checks that judge one backend's precision path: the failing paths ("tf fp16
    path")."""
    data: dict[str, Any] | None = None
    """Per-step numbers behind the check, for the report (the local checks: probes and bounds)."""

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {**d, "value": json_safe(d["value"]), "tolerance": json_safe(d["tolerance"])}


def tolerance_of(a: RunRecord, b: RunRecord) -> Tolerance:
    return tolerance_for(precision_of(a.spec), precision_of(b.spec))


def fmt_num(v: float) -> str:
    return f"{v:.3g}"


def missing_steps_note(sa: set[int], sb: set[int], la: str, lb: str) -> str:
    if sa == sb:
        return ""
    only_a, only_b = sorted(sa - sb), sorted(sb - sa)
    parts = []
    if only_a:
        parts.append(f"{len(only_a)} step(s) only in {la} (first {only_a[0]})")
    if only_b:
        parts.append(f"{len(only_b)} step(s) only in {lb} (first {only_b[0]})")
    return "; ".join(parts)


def first_missing_step(sa: set[int], sb: set[int]) -> int | None:
    diff = sa ^ sb
    return min(diff) if diff else None


def earliest_step(*steps: int | None) -> int | None:
    real = [s for s in steps if s is not None]
    return min(real) if real else None


def path_name(rec: RunRecord) -> str:
    """The precision path a run trains in: "tf fp16 path"."""
    return f"{R.label(rec, 'A')} {precision_of(rec.spec)} path"


def not_run(name: str, group: str, why: str) -> Check:
    return Check(
        name, None, None, True, f"not run: {why}", informational=True, group=group, ran=False
    )

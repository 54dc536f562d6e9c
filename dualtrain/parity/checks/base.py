"""The fp64 pair a check may use (:class:`Reference`), and the formatting the checks share; a
check is dualtrain.records.verdict's :class:`Check`, the audit's too."""

from __future__ import annotations

from dataclasses import dataclass

from dualtrain.parity import readings as R
from dualtrain.parity.tolerances import (
    Tolerance,
    precision_of,
    tolerance_for,
)
from dualtrain.records.record import RunRecord
from dualtrain.records.verdict import Check

#: the info group: checks that never fail (throughput)
INFO = "info"


@dataclass
class Reference:
    """The fp64 reference pair: run A's spec in float64 on A's backend (``a``) and on B's
    (``b``)."""

    a: RunRecord
    b: RunRecord
    twin: RunRecord | None = None
    """The rounding twin of ``a`` (dualtrain.parity.twin), where compare ran one: the scale the
    semantic bounds grow to where training amplifies rounding."""


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

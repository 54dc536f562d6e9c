"""Two recorded runs compared: their checks and the differences found (:class:`AuditComparison`).
dualtrain.parity.report writes its report, as it does a spec compare's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dualtrain.audit.checks import run_checks
from dualtrain.audit.diagnose import diagnose
from dualtrain.audit.read import Recorded, read_recorded
from dualtrain.records.verdict import FAIL, NOT_JUDGED, Check, Finding, all_passed


@dataclass
class AuditComparison:
    a: Recorded
    b: Recorded
    checks: list[Check]
    findings: list[Finding]

    @property
    def passed(self) -> bool:
        return all_passed(self.checks)

    @property
    def verdict(self) -> str:
        failed = [c.name for c in self.checks if c.status == FAIL]
        n = len(self.checks)
        unjudged = [c.name for c in self.checks if c.status == NOT_JUDGED]
        if not failed and unjudged:
            m = n - len(unjudged)
            return (
                f"verdict: PASS ({m}/{m} judged checks of two recorded runs; not judged: "
                f"{', '.join(unjudged)})"
            )
        if not failed:
            return f"verdict: PASS ({n}/{n} checks of two recorded runs)"
        names = ", ".join(f.name for f in self.findings[:4])
        return f"verdict: FAIL ({n - len(failed)}/{n} checks; failed: {', '.join(failed)})" + (
            f"; differences: {names}" if names else ""
        )


def compare_recorded(run_a: str | Path, run_b: str | Path) -> AuditComparison:
    """Read two audit records (UserError if one is not) and compare them; nothing is written
    (``dualtrain.compare(run_a, run_b)`` writes the report)."""
    a, b = read_recorded(run_a), read_recorded(run_b)
    return AuditComparison(a, b, run_checks(a, b), diagnose(a, b))

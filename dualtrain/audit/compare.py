"""Two recorded runs compared: their checks and the differences found (:class:`AuditComparison`).
dualtrain.parity.report writes its report, as it does a spec compare's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dualtrain.audit.checks import run_checks
from dualtrain.audit.diagnose import diagnose
from dualtrain.audit.read import Recorded, read_recorded
from dualtrain.audit.remedy import check_fixes
from dualtrain.records.verdict import (
    CONVENTION,
    FAIL,
    NOT_JUDGED,
    PASS,
    Check,
    Finding,
    all_passed,
)


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
    def convention(self) -> list[Finding]:
        """The frameworks' conventions that explain every failed check, or [] (where a failure
        stays a FAIL): only the loss trajectory failed, no difference a line can change was
        found, and the first failing window begins at or after the step where a convention first
        shows. The verdict's word is then CONVENTION, not PASS and not a FAIL to fix."""
        failed = [c for c in self.checks if c.status == FAIL]
        if not failed or any(c.name != "loss trajectory" for c in failed):
            return []
        if any(not f.inherent for f in self.findings):
            return []
        first = failed[0].first_step or 1
        return [f for f in self.findings if f.inherent and f.step is not None and f.step <= first]

    @property
    def word(self) -> str:
        """PASS, FAIL or CONVENTION (dualtrain compare's exit code 0, 1 or 3)."""
        return PASS if self.passed else CONVENTION if self.convention else FAIL

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
        if self.convention:
            return self._convention_line(n, failed)
        names = ", ".join(f.name for f in self.findings[:4])
        return f"verdict: FAIL ({n - len(failed)}/{n} checks; failed: {', '.join(failed)})" + (
            f"; differences: {names}" if names else ""
        )

    def _convention_line(self, n: int, failed: list[str]) -> str:
        (loss,) = [c for c in self.checks if c.status == FAIL]
        effect = (
            f"the mean loss parts by {loss.value:.3g} at most, {loss.value / loss.tolerance:.0%} "
            f"of its bound"
            if loss.value is not None and loss.tolerance
            else loss.detail
        )
        shown = ", ".join(f"{f.name} (from step {f.step})" for f in self.convention)
        return (
            f"verdict: {CONVENTION} ({n - len(failed)}/{n} checks; {', '.join(failed)}: "
            f"{effect}; explained by {shown}: a convention of the frameworks that no line of "
            f"either script changes)"
        )


def compare_recorded(run_a: str | Path, run_b: str | Path) -> AuditComparison:
    """Read two audit records (UserError if one is not) and compare them, each fix with values
    checked (dualtrain.audit.remedy); nothing is written (``dualtrain.compare(run_a, run_b)``
    writes the report)."""
    a, b = read_recorded(run_a), read_recorded(run_b)
    return AuditComparison(a, b, run_checks(a, b), check_fixes(a, b, diagnose(a, b), diagnose))

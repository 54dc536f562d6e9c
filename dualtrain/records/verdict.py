"""One verdict model for every compare: a :class:`Check` (what was judged, and whether it held) and
a :class:`Finding` (a difference named, the evidence it stands on, where it shows, the change to
make), with the report files' names.

Both kinds of compare build these: two dualtrain runs and their fp64 pair (dualtrain.parity) and
two recorded runs of the user's own scripts (dualtrain.audit). dualtrain.parity.report renders
either; verdict.json holds the same fields for both.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from dualtrain.jsonio import json_safe

#: the report files every compare writes into its folder
VERDICT_FILE, REPORT_MD, REPORT_HTML = "verdict.json", "report.md", "report.html"

#: a check's result, as reports print it
PASS, FAIL, INFO, NOT_JUDGED = "PASS", "FAIL", "INFO", "NOT JUDGED"
#: the verdict of two recorded runs whose only failure a convention of the frameworks explains
CONVENTION = "CONVENTION"
#: its category in a compare's result
CONVENTION_CATEGORY = "convention"
#: the verdict of a model pair whose only failures are the fp64 pair's, located at a library's
#: float32 arithmetic inside a layer (a limit of the proof in float64, not a porting mistake)
LIMIT = "LIMIT"
LIMIT_CATEGORY = "limit"
#: the categories whose verdict is neither PASS nor a FAIL to fix: ``dualtrain compare`` exits 3
EXPLAINED = (CONVENTION_CATEGORY, LIMIT_CATEGORY)

#: the groups a check belongs to: a spec compare's three (docs/report.md) and the audit's
RECORDS, SEMANTICS, NUMERICS, RECORDED = "records", "semantics", "numerics", "recorded runs"

#: how a report marks a fix whose values, applied to a copy of the records, clear its finding
CHECKED = (
    "checked: applied to a copy of the recorded configuration, it clears this finding and adds none"
)

#: how a report marks an inherent finding
INHERENT = "a convention of the frameworks: no line changes it, not a failure"


@dataclass
class Check:
    name: str
    value: float | None
    """What was measured (``unit`` says in what)."""
    tolerance: float | None
    """The largest passing value (None: informational, or no bound applies)."""
    passed: bool
    detail: str
    unit: str = ""
    first_step: int | None = None
    """First step (1-based) at which this check's per-step condition fails; 0 = before training."""
    informational: bool = False
    """Never fails (throughput, and checks that did not run)."""
    group: str = RECORDS
    """records, semantics, numerics (a spec compare) or recorded runs (an audit)."""
    ran: bool = True
    """False: the check could not judge (no fp64 reference, no common step); ``detail`` says why."""
    culprits: list[str] = field(default_factory=list)
    """Numerics checks that judge one backend's precision path: the failing paths ("tf fp16
    path")."""
    data: dict[str, Any] | None = None
    """Per-step numbers behind the check, for the report (the local checks: probes and bounds)."""
    judged: str = ""
    """What the check looked at (an audit's checks say it, since a record may lack some of it)."""
    not_judged: str = ""
    """What it could not look at, and why."""

    @property
    def status(self) -> str:
        """PASS, FAIL, INFO or NOT JUDGED."""
        if not self.ran:
            return NOT_JUDGED
        return INFO if self.informational else (PASS if self.passed else FAIL)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {
            **d,
            "status": self.status,
            "value": json_safe(d["value"]),
            "tolerance": json_safe(d["tolerance"]),
        }


def judged_check(
    name: str,
    status: str,
    detail: str,
    judged: str,
    not_judged: str,
    first_step: int | None = None,
    value: float | None = None,
    bound: float | None = None,
) -> Check:
    """A check of two recorded runs: its result (PASS, FAIL or NOT JUDGED) and what it judged."""
    if status not in (PASS, FAIL, NOT_JUDGED):
        raise ValueError(f"a recorded-run check is PASS, FAIL or NOT JUDGED, not {status!r}")
    return Check(
        name,
        value,
        bound,
        status != FAIL,
        detail,
        first_step=first_step,
        group=RECORDED,
        ran=status != NOT_JUDGED,
        judged=judged,
        not_judged=not_judged,
    )


@dataclass(frozen=True)
class Edit:
    """One value a fix writes, as a change of the recorded configuration: the run (``A`` or
    ``B``), the configuration's keys down to the option (``("optimizer", "epsilon")``; a last
    key ``betas.0`` is an element of a tuple option) and the value."""

    run: str
    path: tuple[str, ...]
    value: Any


@dataclass(frozen=True)
class FixCheck:
    """A fix's edits written into a copy of the records, the differences found again: whether
    the fix ``holds`` (its finding gone, no other difference came) and what it said (what
    remained or came; where it holds, a convention of the frameworks it brings, if any)."""

    holds: bool
    said: str = ""


#: an Edit's path that scales every recorded step's lr by its value (a base lr written: the
#: schedule scales with it)
LR_SCALE = ("steps", "lr", "scale")
#: an Edit's path whose value is every recorded step's lr in order (a schedule written: the lrs
#: it gives; a step past the list keeps its lr)
LR_SERIES = ("steps", "lr", "series")


@dataclass
class Finding:
    name: str
    """The difference, named (``set_epoch forgotten``, ``different sample ids``)."""
    evidence: str
    """What in the records shows it."""
    fixes: list[str] = field(default_factory=list)
    """The line(s) to change: ``A ddp_mnist.py:88: <line> -> <what to write>``."""
    step: int | None = None
    """The first step it shows at (0: before training; None: the configuration shows it)."""
    inherent: bool = False
    """A framework's convention no line of either script changes (reported, not a failure)."""
    edits: list[list[Edit]] = field(default_factory=list)
    """Each fix's values as edits of the recorded configuration (in the order of ``fixes``; []
    for a fix that is no value, or a finding whose evidence is no configuration)."""
    fix_checks: list[FixCheck | None] = field(default_factory=list)
    """For each fix: its edits' check (None: a fix without edits, given unchecked)."""

    def fix_lines(self) -> list[tuple[str, str]]:
        """Each fix with what its check found, as a report prints them: ``(line, note)``, the
        note "" where the fix has no check."""
        checks = self.fix_checks + [None] * (len(self.fixes) - len(self.fix_checks))
        return [(line, _note(check)) for line, check in zip(self.fixes, checks, strict=False)]

    @property
    def title(self) -> str:
        """The name and where it shows: ``shuffle seeds (step 1)``."""
        name = f"{self.name} [{INHERENT}]" if self.inherent else self.name
        if self.step is None:
            return name
        return f"{name} ({'before training' if self.step == 0 else f'step {self.step}'})"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _note(check: FixCheck | None) -> str:
    if check is None:
        return ""
    if not check.holds:
        return f"NOT confirmed: {check.said}"
    return CHECKED + (f"; {check.said}" if check.said else "")


def all_passed(checks: list[Check]) -> bool:
    """Every scored check held (informational ones never fail)."""
    return all(c.passed or c.informational for c in checks)

"""What compare says of two recorded runs: a check (what it judged, PASS, FAIL or NOT JUDGED)
and a diagnosis (a classic difference, its evidence and the line to change)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from dualtrain.audit.read import Recorded

PASS, FAIL, NOT_JUDGED = "PASS", "FAIL", "NOT JUDGED"


#: how the report marks an inherent finding
INHERENT = "a convention of the frameworks: no line changes it, not a failure"


@dataclass
class Finding:
    name: str
    """The difference, named (``set_epoch forgotten``)."""
    evidence: str
    """What in the records shows it."""
    fixes: list[str] = field(default_factory=list)
    """The line(s) to change: ``A ddp_mnist.py:88: <line> -> <what to write>``."""
    step: int | None = None
    """The first step it shows at (0: before training; None: the configuration shows it)."""
    inherent: bool = False
    """A framework's convention no line of either script changes (reported, not a failure)."""

    @property
    def title(self) -> str:
        """The name and where it shows: ``shuffle seeds (step 1)``."""
        name = f"{self.name} [{INHERENT}]" if self.inherent else self.name
        if self.step is None:
            return name
        return f"{name} ({'before training' if self.step == 0 else f'step {self.step}'})"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


#: an optimizer's construction line, in either framework's scripts
OPT_LINES = ("optim.", "optimizers.")


def opt_lines(run: Recorded) -> tuple[str, ...]:
    """Where ``run``'s script makes its optimizer: its recorded class first (a script with
    argparse branches for several optimizers has the one it ran quoted), then any optimizer."""
    kind = run.config.get("optimizer", {}).get("type")
    return (f"{kind}(", f'"{kind.lower()}"', *OPT_LINES) if kind else OPT_LINES


def fix(
    run: Recorded, tag: str, needles: tuple[str, ...], change: str, at: int | None = None
) -> str:
    """``A (torch) ddp_mnist.py:88: <the line> -> change`` (the script's line when found; line
    ``at`` where the recorder saw the call run there)."""
    where = (run.line_at(at) if at else None) or run.line_of(*needles)
    return f"{tag} ({run.framework}) {where or run.script_name} -> {change}"


@dataclass
class Check:
    name: str
    status: str
    detail: str
    judged: str
    not_judged: str
    first_step: int | None = None
    value: float | None = None
    bound: float | None = None

    @property
    def passed(self) -> bool:
        return self.status != FAIL

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

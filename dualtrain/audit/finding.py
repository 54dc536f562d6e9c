"""Where a finding of two recorded runs points: the script line to change (:func:`fix`) and where
a script makes its optimizer. The check and the finding themselves are dualtrain.records.verdict's,
the model every compare shares; the audit's checks are made by :func:`judged_check`."""

from __future__ import annotations

from dualtrain.audit.read import Recorded

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

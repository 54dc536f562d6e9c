"""``dualtrain compare --against SAVED``: the saved compare's spec run again with today's
frameworks (its reference as it ran), then each backend's runs held to the saved ones
(dualtrain.parity.against); where a backend changed, the verdict says between which versions, and
leads with today's first divergent operation as a change of that op."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from dualtrain.errors import UserError
from dualtrain.jsonio import write_atomic
from dualtrain.parity.against import AGAINST_FILE, Against, against
from dualtrain.parity.report import VERDICT_FILE, Comparison
from dualtrain.records.record import SPEC_FILE, SUMMARY_FILE
from dualtrain.spec import Precision
from dualtrain.spec.load import load_spec


def saved_compare(saved: str | Path) -> tuple[Path, str]:
    """The saved compare's spec (its torch run's spec.yaml) and its reference ("fp64" where it ran
    the pair, else "none"); UserError where ``saved`` is not a finished compare's folder."""
    d = Path(saved)
    missing = [
        f"{run}/{name}"
        for run in ("torch", "tf")
        for name in (SPEC_FILE, SUMMARY_FILE)
        if not (d / run / name).is_file()
    ]
    if not d.is_dir() or missing:
        raise UserError(
            f"--against takes the folder of a finished `dualtrain compare --config` (its "
            f"torch/ and tf/ runs and {VERDICT_FILE}). Received: {str(d)!r}"
            + (f" (no {', '.join(missing)})" if d.is_dir() else " (not a folder)")
        )
    spec = d / "torch" / SPEC_FILE
    fp64 = load_spec(spec).precision.dtype is Precision.FP64  # its runs were the reference pair
    ran = fp64 or (d / "fp64-torch" / SUMMARY_FILE).is_file()
    return spec, "fp64" if ran else "none"


def saved_verdict(saved: Path) -> str | None:
    """The saved compare's verdict line, where it wrote one."""
    p = Path(saved) / VERDICT_FILE
    if not p.is_file():
        return None
    try:
        return str(json.loads(p.read_text()).get("verdict", "")) or None
    except (OSError, json.JSONDecodeError):
        return None


def judge_against(cmp: Comparison, saved: Path, out: Path, say: Callable[[str], None]) -> Against:
    """Hold today's runs in ``out`` to the saved ones; the finding joins the diagnosis and the
    notes, and OUT/against.json records it."""
    found = against(saved, out)
    cmp.against = found
    before = saved_verdict(saved)
    if before is not None and not before.startswith("PASS"):
        cmp.notes.append(f"against: the saved compare did not pass ({before})")
    cmp.notes.append(f"against {saved}: {found.lead}")
    changed = found.changed()
    d = cmp.diagnosis
    if d.finding and changed:
        d.finding = f"{found.lead}: {d.finding}"
    elif changed and not cmp.passed:
        d.finding = found.lead
    write_atomic(out / AGAINST_FILE, json.dumps(found.to_json(), indent=1) + "\n")
    say(f"against {saved}: {found.lead}")
    return found

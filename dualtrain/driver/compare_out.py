"""compare's output folder: OUT made ready before any run starts (a new or empty folder, or an
earlier compare of the same spec taken up where it stopped, or replaced with --overwrite), what it
already holds per planned run, and where a rerun sets aside a run that stopped before its first
checkpoint."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from dualtrain.core import pair
from dualtrain.driver.compare_plan import PlannedRun
from dualtrain.driver.outdir import check_creatable
from dualtrain.driver.pair import pair_layout
from dualtrain.errors import UserError
from dualtrain.parity.replay import REPLAY
from dualtrain.parity.report import REPORT_HTML, REPORT_MD, VERDICT_FILE
from dualtrain.parity.twin import TWIN, TWIN_INIT
from dualtrain.records.record import SPEC_FILE, SUMMARY_FILE, WEIGHTS_FINAL
from dualtrain.runtime import checkpoint
from dualtrain.spec import load_spec

#: What a compare writes into OUT besides its run folders.
#: the locator's finding, when a model pair's fp64 pair failed
LOCATOR_FILE = "locator.json"
REPORT_FILES = (VERDICT_FILE, REPORT_MD, REPORT_HTML, LOCATOR_FILE)


@dataclasses.dataclass
class Existing:
    """What OUT already holds for one planned run (a rerun of the same compare)."""

    state: str
    """``finished`` (reused as it is), ``resumable`` (continued from its latest checkpoint),
    ``partial`` (stopped before a checkpoint: set aside and run again) or ``absent``."""
    checkpoint: Path | None = None


def _existing(run: PlannedRun) -> Existing:
    where = run.where
    if not where.exists():
        return Existing("absent")
    if not (where / SPEC_FILE).is_file():
        raise UserError(
            f"--out holds {where.name}, which is not a dualtrain run; choose another "
            f"folder. Received: {str(where.parent)!r}"
        )
    try:
        same = load_spec(where / SPEC_FILE).to_dict() == run.spec.to_dict()
    except UserError:
        same = False
    if not same:
        raise UserError(
            f"--out holds a compare of another spec ({where.name}/{SPEC_FILE} differs "
            f"from this one); pass --overwrite to replace it, or choose another "
            f"folder. Received: {str(where.parent)!r}"
        )
    if run.spec.model.is_pair:  # the same spec, but the model's code may have changed since
        held = pair.read(where)
        if held is not None and held.to_json() != pair_layout(run.spec)[0].to_json():
            raise UserError(
                f"--out holds a compare of another version of the model pair ({where.name}/"
                f"{pair.PAIR_FILE}: its code or weight map differs from today's); pass "
                f"--overwrite to replace it, or choose another folder. Received: "
                f"{str(where.parent)!r}"
            )
    if (where / SUMMARY_FILE).is_file() and (where / WEIGHTS_FINAL).is_file():
        return Existing("finished")
    latest = checkpoint.latest(where)
    return Existing("resumable", latest) if latest is not None else Existing("partial")


def claim_out(out: Path, runs: list[PlannedRun], overwrite: bool) -> dict[str, Existing]:
    """Make OUT ready (reads only until every check has passed): a new or empty folder; or a
    folder holding an earlier compare of the same spec, whose finished runs are reused and whose
    interrupted ones continue (``overwrite``: a folder holding an earlier compare, of any spec,
    whose runs and report are replaced). Returns what OUT holds per planned run."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out exists and is not a folder. Received: {str(out)!r}")
    check_creatable(out)
    labels = {r.where.name for r in runs} | {"fp64-torch", "fp64-tf", "torch", "tf", TWIN}
    content = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    ours = [n for n in content if n in labels or n in (*REPORT_FILES, TWIN_INIT, REPLAY, PARTIAL)]
    if len(ours) < len(content) or (content and not any(n in labels for n in content)):
        raise UserError(
            f"--out must be a new or empty folder, or one an earlier compare wrote "
            f"(compare writes its runs and the report into it); it holds "
            f"{', '.join(n for n in content if n not in ours) or ', '.join(content)}. "
            f"Received: {str(out)!r}"
        )
    if overwrite:
        for name in content:
            if name in labels and not (out / name / SPEC_FILE).is_file():
                raise UserError(
                    f"--overwrite replaces an earlier compare; {name} in --out is not a "
                    f"dualtrain run. Received: {str(out)!r}"
                )
        for name in content:  # an earlier compare's own output, and nothing else
            path = out / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        existing = {r.label: Existing("absent") for r in runs}
    else:
        existing = {r.label: _existing(r) for r in runs}
    out.mkdir(parents=True, exist_ok=True)
    return existing


#: Where a rerun of a compare sets aside a run that stopped before its first checkpoint.
PARTIAL = "partial"


def set_aside(run: PlannedRun) -> Path:
    """Move an interrupted run without a checkpoint out of the way (nothing is deleted)."""
    shelf = run.where.parent / PARTIAL
    shelf.mkdir(exist_ok=True)
    n = 1
    while (shelf / f"{run.label}-{n}").exists():
        n += 1
    target = shelf / f"{run.label}-{n}"
    run.where.rename(target)
    return target

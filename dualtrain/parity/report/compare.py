"""Two runs' records, their fp64 pair and their checks, gathered once: :class:`Comparison`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dualtrain.errors import UserError
from dualtrain.parity import readings as R
from dualtrain.parity.against import Against, same_backend_versions
from dualtrain.parity.checks import (
    Check,
    Reference,
    is_fp64_pair,
    run_checks,
    tolerance_of,
)
from dualtrain.parity.diagnose import Diagnosis, diagnose
from dualtrain.parity.op_finding import OpFinding
from dualtrain.parity.tolerances import Tolerance, precision_of
from dualtrain.records.record import RunRecord, read_run
from dualtrain.records.verdict import all_passed


@dataclass
class Comparison:
    a: RunRecord
    b: RunRecord
    reference: Reference | None
    """The fp64 reference pair (A's spec in float64 on A's and on B's backend); None: not run."""
    tolerance: Tolerance
    checks: list[Check]
    diagnosis: Diagnosis
    notes: list[str] = field(default_factory=list)
    replay: OpFinding | None = None
    """compare's replay of the fp64 pair: the first divergent operation (its per-layer picture)."""
    against: Against | None = None
    """compare --against: today's runs held to a saved compare's."""

    @property
    def passed(self) -> bool:
        return all_passed(self.checks)

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)


def compare_records(
    a: RunRecord, b: RunRecord, reference: Reference | None = None, notes: list[str] | None = None
) -> Comparison:
    checks = run_checks(a, b, reference)
    if reference is None and is_fp64_pair(a, b):
        reference = Reference(a, b)
    d = diagnose(a, b, checks)
    upgrade = same_backend_versions(a, b)  # two runs of one backend: a framework upgrade?
    notes = list(notes or []) + ([f"the runs' versions differ: {upgrade}"] if upgrade else [])
    if upgrade and not d.passed:
        d.finding = f"{upgrade}: {d.finding or d.cause}"
    return Comparison(a, b, reference, tolerance_of(a, b), checks, d, notes)


def _check_reference(ref_dir: Path, rec: RunRecord, of: RunRecord) -> None:
    """A reference run is ``of``'s spec in fp64: anything else would make it no yardstick."""
    if precision_of(rec.spec) != "fp64":
        raise UserError(
            f"a reference run must be fp64 (precision.dtype). Received: {str(ref_dir)!r} "
            f"with {precision_of(rec.spec)}"
        )
    other = [
        k
        for k, _, _ in R.spec_differences(of.spec, rec.spec)
        if not R.is_cosmetic(k) and not k.startswith("precision.")
    ]
    if other:
        raise UserError(
            f"a reference run must be the compared run's spec in fp64; {ref_dir} differs in "
            f"{', '.join(other[:5])}. Received: {str(ref_dir)!r}"
        )


def compare_dirs(
    run_a: str | Path,
    run_b: str | Path,
    reference: tuple[str | Path, str | Path] | None = None,
    notes: list[str] | None = None,
    twin: str | Path | None = None,
) -> Comparison:
    """Load finished run directories (UserError if one is not) and run every check. ``reference``:
    the fp64 runs of A's spec on A's backend and on B's backend (two fp64 runs are their own).
    ``twin``: the rounding twin of the reference's A run (dualtrain.parity.twin), where one ran."""
    a, b = read_run(run_a), read_run(run_b)
    ref = None
    if reference is not None:
        ref = Reference(read_run(reference[0]), read_run(reference[1]))
        # reference is the caller's pair: its first two items are the ones read above
        for d, rec, of in zip(reference, (ref.a, ref.b), (a, b), strict=False):
            _check_reference(Path(d), rec, of)
    elif twin is not None and is_fp64_pair(a, b):
        ref = Reference(a, b)
    if twin is not None and ref is not None:
        ref.twin = read_run(twin)
        _check_reference(Path(twin), ref.twin, ref.a)
        if R.label(ref.twin, "") != R.label(ref.a, ""):
            raise UserError(
                f"a rounding twin runs on its reference run's backend ({R.label(ref.a, '?')}). "
                f"Received: {str(twin)!r} on {R.label(ref.twin, '?')}"
            )
    return compare_records(a, b, ref, notes)

"""``dualtrain.compare``: two backends on one spec, two finished runs, or two audit records, and
the report; what ``dualtrain compare`` does (the CLI calls it)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dualtrain.api.output import say as print_line
from dualtrain.api.output import silenced
from dualtrain.api.overrides import PathLike, SpecLike, experiment
from dualtrain.api.results import CompareResult, RunResult
from dualtrain.audit.compare import AuditComparison, compare_recorded
from dualtrain.audit.record import is_recorded
from dualtrain.driver.compare import check_reference, compare_backends, default_out
from dualtrain.driver.compare_against import saved_compare
from dualtrain.driver.compare_replay import replay_continuation
from dualtrain.errors import UserError
from dualtrain.jsonio import new_folder
from dualtrain.parity.report import (
    REPORT_HTML,
    REPORT_MD,
    VERDICT_FILE,
    AnyComparison,
    Comparison,
    compare_dirs,
    terminal_text,
    verdict_line,
    write_report,
)
from dualtrain.records.verdict import CONVENTION_CATEGORY
from dualtrain.spec import Experiment


def compare(
    spec_or_run_a: SpecLike | RunResult | None = None,
    run_b: PathLike | RunResult | None = None,
    /,
    *,
    against: PathLike | None = None,
    reference: str | None = None,
    reference_runs: tuple[PathLike | RunResult, PathLike | RunResult] | None = None,
    out: PathLike | None = None,
    overwrite: bool = False,
    world_size: int | None = None,
    precision: str | Mapping[str, Any] | None = None,
    set: Sequence[str] = (),
    quiet: bool = False,
    **overrides: Any,
) -> CompareResult:
    """Check that the torch and tf backends train the same way, like ``dualtrain compare``.

    * ``compare(spec, **overrides)``: run the spec on torch (OUT/torch) and tf (OUT/tf), then, with
      ``reference="fp64"`` (the default), both again in float64 (OUT/fp64-torch, OUT/fp64-tf: the
      semantic check); ``reference="none"`` skips that pair. ``out``: a new or empty folder (default
      ``<output_dir>/compare-<name>-<time>``), or one an earlier compare of the same spec wrote:
      its finished runs are reused, interrupted ones continue (``overwrite=True``: replace an
      earlier compare's runs and report instead).
    * ``compare(run_a, run_b, reference_runs=(ref_a, ref_b))``: compare two finished run directories
      (or RunResults); ``reference_runs``: their fp64 runs. ``out`` default:
      ``<output_dir of A>/compare-<name of A>-<time>``.
    * ``compare(against=SAVED)``: the saved compare in folder SAVED (a finished ``compare`` of a
      spec) run again with today's frameworks, each backend's runs held to the saved ones: which
      backend changed, between which framework versions, and today's first divergent operation
      as a change of that op (OUT/against.json).
    * ``compare(record_a, record_b)``: two audit records of the user's own scripts
      (dualtrain.audit): the recorded-run checks and the differences found (``result.findings``),
      as ``dualtrain compare RECORD_A RECORD_B`` gives them. ``out`` default: beside the first
      record, ``compare-<name of A>-<name of B>-<time>``.

    Writes verdict.json, report.md and report.html into ``out`` and prints what the CLI prints
    (``quiet=True``: nothing from dualtrain itself; the workers' progress still shows). A failed
    check is not an exception: look at ``result.passed``.

    Raises:
        UserError: a usage mistake (bad spec or override, ``out`` in use, a run dir that is not a
            finished run, an audit record against a dualtrain run); for a spec, nothing was run
            or written.
        RunFailed: one of the runs failed (its partial run directory stays under ``out``).
    """
    say = None if quiet else print_line
    if against is not None:
        given = {"world_size": world_size, "precision": precision, "set": list(set) or None}
        _check_against_call(spec_or_run_a, run_b, reference, reference_runs, given, overrides)
        return _compare_result(*_compare_against(Path(against), out, say, overwrite), say)
    if spec_or_run_a is None:
        raise UserError(
            "compare needs a spec, two finished runs, or against=SAVED. Received: nothing"
        )
    if run_b is not None:
        _check_runs_call(reference, reference_runs, world_size, precision, set, overrides)
        refs = reference_runs and (_dir_of(reference_runs[0]), _dir_of(reference_runs[1]))
        cmp, out_dir = _compare_dirs_report(_dir_of(spec_or_run_a), _dir_of(run_b), refs, out, say)
    else:
        if reference_runs is not None:
            raise UserError(
                "reference_runs is for comparing finished runs; with a spec compare "
                "runs its own reference pair. Received: reference_runs with a spec"
            )
        if isinstance(spec_or_run_a, RunResult) or (
            isinstance(spec_or_run_a, (str, os.PathLike)) and Path(spec_or_run_a).is_dir()
        ):
            raise UserError(
                f"a spec is a YAML file, a dict or an Experiment, not a run (to "
                f"compare finished runs, give two run directories). Received: the "
                f"folder {str(_dir_of(spec_or_run_a))!r}"
            )

        check_reference(reference or "fp64")
        resolved = experiment(
            spec_or_run_a, world_size=world_size, precision=precision, set=set, **overrides
        )
        cmp, out_dir = _compare_spec(resolved, reference or "fp64", out, say, overwrite)
    return _compare_result(cmp, out_dir, say)


def _check_against_call(
    spec: object,
    run_b: object,
    reference: str | None,
    reference_runs: object,
    options: Mapping[str, object],
    overrides: Mapping[str, object],
) -> None:
    """``compare(against=SAVED)``: the saved compare is the spec, its reference as it ran."""
    named = {
        "a spec or run": spec,
        "a second run": run_b,
        "reference": reference,
        "reference_runs": reference_runs,
        **options,
        **overrides,
    }
    given = [name for name, v in named.items() if v is not None]
    if given:
        raise UserError(
            f"against=SAVED replays the saved compare's own spec and reference; give nothing "
            f"else but out and overwrite. Received: {', '.join(given)}"
        )


def _check_runs_call(
    reference: str | None,
    reference_runs: tuple[PathLike | RunResult, PathLike | RunResult] | None,
    world_size: int | None,
    precision: str | Mapping[str, Any] | None,
    set: Sequence[str],
    overrides: Mapping[str, Any],
) -> None:
    """``compare(run_a, run_b, ...)``: the arguments that go with a spec only are refused."""
    given = sorted(
        [k for k, v in (("world_size", world_size), ("precision", precision)) if v is not None]
        + (["set"] if set else [])
        + list(overrides)
    )
    if given:
        raise UserError(
            f"spec overrides need a spec; finished runs keep theirs. Received: "
            f"{', '.join(given)} with two run directories"
        )
    if reference is not None:
        raise UserError(
            f"reference='fp64'|'none' goes with a spec; for finished runs name "
            f"their fp64 runs with reference_runs=(ref_a, ref_b). Received: "
            f"reference={reference!r}"
        )
    if reference_runs is not None and len(reference_runs) != 2:
        raise UserError(
            f"reference_runs is a pair: the fp64 runs of A's spec on A's and on "
            f"B's backend. Received: {len(reference_runs)} runs"
        )


def _dir_of(run: object) -> Path:
    if isinstance(run, RunResult):
        return run._dir()
    if not isinstance(run, (str, os.PathLike)):
        raise UserError(
            f"a finished run is a run directory or a RunResult. Received: {type(run).__name__}"
        )
    return Path(run)


def _compare_spec(
    spec: Experiment,
    reference: str,
    out: PathLike | None,
    say: Callable[[str], None] | None,
    overwrite: bool = False,
    against: Path | None = None,
) -> tuple[Comparison, Path]:
    """``dualtrain compare --config``: the four runs (two with reference "none") and the report
    (``against``: held to a saved compare's runs)."""
    out_dir = Path(out) if out is not None else default_out(spec.name, spec.output_dir)
    if against is not None and out_dir.resolve() == against.resolve():
        raise UserError(
            f"--out must be a new folder: --against reads the saved compare in it. Received: "
            f"--out {str(out_dir)!r}"
        )
    with silenced(say is None):
        return compare_backends(
            spec,
            out_dir,
            reference=reference,
            progress=say,
            overwrite=overwrite,
            against=against,
        ), out_dir


def _compare_against(
    saved: Path, out: PathLike | None, say: Callable[[str], None] | None, overwrite: bool
) -> tuple[Comparison, Path]:
    """``compare(against=SAVED)``: the saved compare's spec and reference, run today."""
    spec_file, reference = saved_compare(saved)
    return _compare_spec(experiment(str(spec_file)), reference, out, say, overwrite, saved)


def _compare_dirs_report(
    run_a: Path,
    run_b: Path,
    reference_runs: tuple[Path, Path] | None,
    out: PathLike | None,
    say: Callable[[str], None] | None = None,
) -> tuple[AnyComparison, Path]:
    """``dualtrain compare A B``: compare finished runs (two dualtrain runs, or two audit records
    of the user's own scripts) and write the report."""
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise UserError(f"--out exists and is not a folder. Received: {str(out)!r}")
    for run in (run_a, run_b):
        if not run.exists():
            raise UserError(f"run directory not found: {str(run)!r}")  # nor an audit record
    recorded = is_recorded(run_a), is_recorded(run_b)
    if any(recorded):
        if not all(recorded):
            kind = ["an audit record" if r else "not an audit record" for r in recorded]
            raise UserError(
                f"compare two audit records or two dualtrain runs, not one of each. Received: "
                f"{run_a} ({kind[0]}) and {run_b} ({kind[1]})"
            )
        if reference_runs is not None:
            raise UserError(
                "reference runs (--reference-runs) are for dualtrain runs; recorded runs have no "
                f"fp64 reference. Received: {reference_runs[0]} {reference_runs[1]}"
            )
        audit = compare_recorded(run_a, run_b)
        # beside the records (not the current folder): compare-A-B-TIME
        out_dir = (
            Path(out)
            if out is not None
            else new_folder(run_a.resolve().parent, f"compare-{run_a.name}-{run_b.name}")
        )
        write_report(audit, out_dir)
        return audit, out_dir
    cmp = compare_dirs(run_a, run_b, reference_runs)
    out_dir = (
        Path(out)
        if out is not None
        else default_out(str(cmp.a.spec.get("name", "runs")), cmp.a.spec.get("output_dir", "runs"))
    )
    with silenced(say is None):  # one run continued the other backend's: where they part
        replay_continuation(cmp, out_dir, say or (lambda line: None))
    write_report(cmp, out_dir)
    return cmp, out_dir


def _compare_result(
    cmp: AnyComparison, out_dir: Path, say: Callable[[str], None] | None
) -> CompareResult:
    """Print the table, the verdict and where the report is (unless ``say`` is None); the result."""
    reports = {
        "json": out_dir / VERDICT_FILE,
        "md": out_dir / REPORT_MD,
        "html": out_dir / REPORT_HTML,
    }
    if say is not None:
        say(terminal_text(cmp))
        say(f"dualtrain compare: report: {reports['html']} (verdict.json, report.md beside it)")
    if isinstance(cmp, AuditComparison):  # two recorded runs: their differences, no fp64 pair
        return CompareResult(
            passed=cmp.passed,
            verdict=cmp.verdict,
            category=CONVENTION_CATEGORY if cmp.convention else None,
            culprits=(),
            semantics_checked=False,
            checks=tuple(cmp.checks),
            findings=tuple(cmp.findings),
            diagnosis=None,
            notes=(),
            out=out_dir,
            reports=reports,
            run_a=cmp.a.path,
            run_b=cmp.b.path,
            reference_runs=None,
            comparison=cmp,
        )
    ref = cmp.reference
    d = cmp.diagnosis
    return CompareResult(
        passed=cmp.passed,
        verdict=verdict_line(cmp),
        category=d.category,
        culprits=tuple(d.culprits),
        semantics_checked=ref is not None,
        checks=tuple(cmp.checks),
        findings=tuple(d.causes),
        diagnosis=d,
        notes=tuple(cmp.notes),
        out=out_dir,
        reports=reports,
        run_a=cmp.a.path,
        run_b=cmp.b.path,
        reference_runs=None if ref is None else (ref.a.path, ref.b.path),
        comparison=cmp,
    )

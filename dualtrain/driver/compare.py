"""``compare_backends``: run one spec on both backends plus its fp64 reference pair, then compare.

Layout of OUT::

    OUT/fp64-torch/      the reference pair: the same spec in float64 on torch (it also records
                         the states the one-step probes start from: fp64-torch/probes/) ...
    OUT/fp64-tf/         ... and on tf (absent with --reference none, or when the spec is fp64
                         itself)
    OUT/torch/           the torch run (the requested precision; torch/probes/: its one-step probes)
    OUT/tf/              the tf run
    OUT/fp64-twin/       the rounding twin, where the reference pair parts beyond the fixed
                         bounds (dualtrain.driver.compare_twin)
    OUT/replay/          where the reference pair parts: both backends replayed up to the first
                         divergent step, op by op (dualtrain.driver.compare_replay)
    OUT/verdict.json, report.md, report.html

Each backend runs in its own worker processes (``dualtrain.driver.runs.start_run``); this process
never imports a framework. The reference pair answers "do the two backends compute the same training
run?" to rounding (the semantic check), and each run's distance to its own fp64 run is the noise
model of the numerics checks (dualtrain.parity.checks).
"""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dualtrain.backends import PACKAGES
from dualtrain.driver.compare_against import judge_against
from dualtrain.driver.compare_failed import judge_partial, write_failed_only
from dualtrain.driver.compare_out import LOCATOR_FILE, Existing, claim_out, set_aside
from dualtrain.driver.compare_plan import PlannedRun, plan_runs
from dualtrain.driver.compare_replay import located, run_replay
from dualtrain.driver.compare_twin import run_twin
from dualtrain.driver.launching import refuse_external_launch
from dualtrain.driver.locate import locate_pair, table
from dualtrain.driver.pair import pair_layout
from dualtrain.driver.runs import resume_run, start_run
from dualtrain.driver.validate import say_warnings, validate
from dualtrain.errors import RunFailed, UserError
from dualtrain.jsonio import new_folder
from dualtrain.parity.diagnose import SEMANTICS, limited
from dualtrain.parity.report import VERDICT_FILE, Comparison, compare_dirs, write_report
from dualtrain.spec import Backend, Experiment

REFERENCE_CHOICES = ("fp64", "none")


def check_reference(reference: str) -> None:
    if reference not in REFERENCE_CHOICES:
        raise UserError(
            f"--reference must be one of {', '.join(REFERENCE_CHOICES)}. Received: {reference!r}"
        )


def default_out(spec_name: str, output_dir: str | Path = "runs") -> Path:
    return new_folder(output_dir, f"compare-{spec_name}")


def _require_backends() -> None:
    for backend in (Backend.TORCH, Backend.TF):
        if (
            importlib.util.find_spec(PACKAGES[backend] + ".launch") is None
            or importlib.util.find_spec(PACKAGES[backend] + ".worker") is None
        ):
            raise UserError(
                f"compare needs both backends; the {backend.value} backend is not available "
                f"in this installation (no {PACKAGES[backend]}.worker). Received: "
                f"dualtrain {backend.value} backend missing"
            )


class Progress:
    """The lines that say which run is running: one as a run starts (``run 2/4: tf fp32 -> DIR``),
    one as it ends, with its time. With runs overlapping, each line also names the runs still
    going, so a log file read top to bottom says at every point what was running."""

    PREFIX = "dualtrain compare:"

    def __init__(self, runs: list[PlannedRun], say: Callable[[str], None] | None, overlap: bool):
        self.runs, self.say, self.overlap = runs, say or (lambda text: None), overlap
        self.started: dict[int, float] = {}
        self.lock = threading.Lock()

    def _tag(self, i: int) -> str:
        return f"run {i + 1}/{len(self.runs)}"

    def _others(self, lead: str) -> str:
        others = [f"{self._tag(j)} {self.runs[j].what}" for j in sorted(self.started)]
        return f"{lead}{', '.join(others)}" if self.overlap and others else ""

    def start(self, i: int) -> None:
        with self.lock:
            run = self.runs[i]
            self.say(
                f"{self.PREFIX} {self._tag(i)}: {run.what} -> {run.where}"
                f"{self._others('; also running: ')}"
            )
            self.started[i] = time.perf_counter()

    def end(self, i: int, ok: bool, interrupted: bool = False) -> float:
        with self.lock:
            took = time.perf_counter() - self.started.pop(i)
            state = "done" if ok else "stopped" if interrupted else "FAILED"
            self.say(
                f"{self.PREFIX} {self._tag(i)} {state}: "
                f"{self.runs[i].what} {'in' if ok else 'after'} {took:.1f}s"
                f"{self._others('; still running: ')}"
            )
            return took


def compare_backends(
    spec: Experiment,
    out: str | Path,
    *,
    reference: str = "fp64",
    overlap: bool = False,
    overwrite: bool = False,
    progress: Callable[[str], None] | None = None,
    against: Path | None = None,
) -> Comparison:
    """Run ``spec`` on torch (OUT/torch) and tf (OUT/tf), then, with ``reference="fp64"``, the fp64
    reference pair (OUT/fp64-torch, OUT/fp64-tf; a fp64 spec is its own reference), and compare.

    ``progress(line)`` gets the progress lines (the CLI prints them): what compare runs, then a line
    as each run starts and one as it ends (:class:`Progress`). ``overlap`` runs two runs at a time
    (faster on many cores; throughput numbers then share the machine; the runs' threads are not the
    main thread, so a SIGTERM waits for the runs in flight). Everything that can be a user mistake
    is checked before OUT is created.

    An OUT that holds an earlier compare of the same spec is taken up where it stopped: finished
    runs are reused (checked by their spec), interrupted ones continue from their latest checkpoint
    or, without one, run again (the stopped run is moved to OUT/partial/). ``overwrite`` replaces an
    earlier compare's runs and report instead. ``against``: a saved compare's folder each backend's
    runs are held to (driver/compare_against.py)."""
    check_reference(reference)
    _require_backends()
    refuse_external_launch()
    warned = validate(spec, Backend.TORCH).warnings + validate(spec, Backend.TF).warnings
    say_warnings(warned)  # once for the four runs
    out = Path(out)
    runs = plan_runs(spec, out, reference)
    existing = claim_out(out, runs, overwrite)
    with_ref = len(runs) == 4
    what = _what_runs(with_ref)
    say = progress or (lambda text: None)
    say(f"{Progress.PREFIX} {spec.name}: {len(runs)} runs, {what} -> {out}")
    tracker = Progress(runs, progress, overlap)
    took: dict[int, float] = {}
    failed: dict[str, str] = {}  # label -> why: the runs that could not finish
    t0 = time.perf_counter()

    def one(i: int) -> Path | None:
        run, have = runs[i], existing[runs[i].label]
        if run.probe is not None and run.probe.source is not None and "fp64-torch" in failed:
            failed[run.label] = "not run: the fp64 torch run that records its probe states failed"
            return None
        if have.state == "finished":
            say(
                f"{Progress.PREFIX} {tracker._tag(i)}: {run.what}: finished earlier, reused "
                f"({run.where})"
            )
            took[i] = 0.0
            return run.where
        if have.state == "partial":
            say(
                f"{Progress.PREFIX} {tracker._tag(i)}: {run.what} stopped before a checkpoint; "
                f"it runs again (the stopped run is kept in {set_aside(run)})"
            )
        tracker.start(i)
        try:
            run_dir = _launch(run, have, out, warned)
        except RunFailed as exc:  # judged with what finished (compare_failed)
            took[i] = tracker.end(i, ok=False)
            failed[run.label] = str(exc)
            return None
        except BaseException as exc:
            tracker.end(i, ok=False, interrupted=isinstance(exc, KeyboardInterrupt))
            raise
        took[i] = tracker.end(i, ok=True)
        return run_dir

    notes: list[str] = []
    dirs = _run_all(one, runs, overlap, notes)
    _add_run_notes(notes, reference, with_ref, runs, existing, took, t0)
    if failed:
        return _judge_failed(out, runs, dirs, failed, notes)
    finished = [d for d in dirs if d is not None]
    assert len(finished) == len(dirs)  # no run failed
    return _judge(spec, out, runs, finished, with_ref, notes, progress, against)


def _launch(run: PlannedRun, have: Existing, out: Path, warned: tuple[str, ...]) -> Path:
    """Start one planned run, or continue it from its latest checkpoint; its folder. ``warned``:
    what compare has said already."""
    again = f"the same dualtrain compare command with --out {out}"
    run_dir: Path | None  # start_run returns None for a worker of an external launcher
    if have.state == "resumable":
        run_dir, _ = resume_run(
            run.where, run.backend, probe=run.probe, resume_with=again, warned=warned
        )
    else:
        run_dir, _ = start_run(
            run.spec, run.backend, run.where, probe=run.probe, resume_with=again, warned=warned
        )
    assert run_dir is not None  # dualtrain launched the workers (refuse_external_launch)
    return run_dir


def _judge_failed(
    out: Path,
    runs: list[PlannedRun],
    dirs: list[Path | None],
    failed: dict[str, str],
    notes: list[str],
) -> Comparison:
    """Some runs could not finish: judge what the others allow (compare_failed); with no two runs
    left to compare, the verdict says which failed and the first failure is raised."""
    (out / LOCATOR_FILE).unlink(missing_ok=True)
    cmp = judge_partial(runs, dirs, failed, notes)
    if cmp is None:
        write_failed_only(out, runs, failed)
        first = next(iter(failed.values()))
        raise RunFailed(f"{first} ({out / VERDICT_FILE} names every run that did not finish)")
    write_report(cmp, out)
    return cmp


def _what_runs(with_ref: bool) -> str:
    """What the first progress line says compare runs."""
    what = (
        "both in fp64 (the reference pair, which records the probe states), then torch and tf"
        if with_ref
        else "torch and tf"
    )
    return what


def _run_all(
    one: Callable[[int], Path | None], runs: list[PlannedRun], overlap: bool, notes: list[str]
) -> list[Path | None]:
    """Every planned run by ``one``, in order (``overlap``: two at a time); their run folders."""
    if overlap:
        # Two at a time, pair by pair: the fp64 pair must have finished (its recorded probe states)
        # before the requested-precision runs replay them.
        pool = ThreadPoolExecutor(max_workers=2)
        dirs = []
        try:
            for first in range(0, len(runs), 2):
                futures = [pool.submit(one, i) for i in range(first, min(first + 2, len(runs)))]
                dirs += [f.result() for f in futures]
        finally:  # a failed run: the queued runs never start; the one in flight finishes
            pool.shutdown(wait=True, cancel_futures=True)
        notes.append("runs overlapped two at a time: throughput is not comparable")
    else:
        dirs = [one(i) for i in range(len(runs))]
    return dirs


def _add_run_notes(
    notes: list[str],
    reference: str,
    with_ref: bool,
    runs: list[PlannedRun],
    existing: dict[str, Existing],
    took: dict[int, float],
    t0: float,
) -> None:
    """The comparison's notes on how the runs ran: without a reference pair, and their times."""
    if reference == "none":
        notes.append(
            "no fp64 reference pair (--reference none): the semantic check did not run; "
            "trajectory and final weights use the fixed tolerances"
        )
    elif not with_ref:
        notes.append("the runs are fp64: they are the reference pair")
    timings = ", ".join(
        f"{run.label} "
        + (
            "reused"
            if existing[run.label].state == "finished"
            else f"{took[i]:.1f}s"
            if i in took
            else "not run"  # its probe states' run failed
        )
        for i, run in enumerate(runs)
    )
    notes.append(f"runs took {time.perf_counter() - t0:.1f}s ({timings})")


def _judge(
    spec: Experiment,
    out: Path,
    runs: list[PlannedRun],
    dirs: list[Path],
    with_ref: bool,
    notes: list[str],
    progress: Callable[[str], None] | None,
    against: Path | None = None,
) -> Comparison:
    """Compare the finished runs, locate a model pair's fp64 disagreement, hold them to a saved
    compare (``against``), write the report."""
    by = {run.label: d for run, d in zip(runs, dirs, strict=True)}
    pair = (by["fp64-torch"], by["fp64-tf"]) if with_ref else None
    cmp = compare_dirs(by["torch"], by["tf"], pair, notes)
    twin = run_twin(cmp, runs[0], _start_aside, _say(progress))
    if twin is not None:
        cmp = compare_dirs(by["torch"], by["tf"], pair, cmp.notes, twin)
    (out / LOCATOR_FILE).unlink(missing_ok=True)  # an earlier compare's finding
    if spec.model.is_pair and not cmp.passed and cmp.diagnosis.category == SEMANTICS:
        locate_into(spec, cmp, out, progress)
    if not cmp.diagnosis.finding:  # a pair's layer and mistake, where the locator named them
        run_replay(cmp, runs[0], _start_aside, _say(progress))
    if against is not None:
        judge_against(cmp, against, out, _say(progress))
    write_report(cmp, out)
    return cmp


def _start_aside(spec: Experiment, backend: Backend, where: Path) -> Path:
    """A run compare adds beside its four (the rounding twin, the replay)."""
    run_dir, _ = start_run(spec, backend, where, warned=tuple(validate(spec, backend).warnings))
    assert run_dir is not None  # dualtrain launched the workers (refuse_external_launch)
    return run_dir


def _say(progress: Callable[[str], None] | None) -> Callable[[str], None]:
    return lambda line: progress(f"{Progress.PREFIX} {line}") if progress else None


def locate_into(
    spec: Experiment, cmp: Comparison, out: Path, progress: Callable[[str], None] | None
) -> None:
    """A model pair whose fp64 pair disagrees: the locator (dualtrain diff-models) on the initial
    weights, its finding as a note of the comparison and OUT/locator.json."""
    if progress is not None:
        progress(f"{Progress.PREFIX} the fp64 pair disagrees: locating it layer by layer")
    try:
        layout, weights = pair_layout(spec)
        finding = locate_pair(spec, layout, weights)
    except UserError as exc:
        cmp.notes.append(f"locator: could not run ({exc})")
        return
    cmp.notes.append(finding.line())
    if not finding.agrees:  # the layer and the mistake lead the verdict and the Diagnosis
        cmp.diagnosis.finding = finding.lead()
        limited(cmp.diagnosis, finding.at_limit)
        cmp.replay = located(finding)  # the report's picture: each layer of the locator's batch
    doc = {**finding.to_json(), "table": table(finding)}
    (out / LOCATOR_FILE).write_text(json.dumps(doc, indent=1) + "\n")

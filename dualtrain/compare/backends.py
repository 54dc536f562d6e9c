"""``compare_backends``: run one spec on both backends plus its fp64 reference pair, then compare.

Layout of OUT::

    OUT/torch/           the torch run (the requested precision)
    OUT/tf/              the tf run
    OUT/fp64-torch/      the reference pair: the same spec in float64 on torch ...
    OUT/fp64-tf/         ... and on tf (absent with --reference none, or when the spec is fp64 itself)
    OUT/verdict.json, report.md, report.html

Each backend runs in its own worker processes (``dualtrain.runs.start_run``); this process never
imports a framework. The reference pair answers "do the two backends compute the same training run?"
to rounding (the semantic check), and each run's distance to its own fp64 run is the noise model of
the numerics checks (dualtrain.compare.checks).
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dualtrain.compare.report import Comparison, compare_dirs, write_report
from dualtrain.errors import UserError
from dualtrain.spec import Backend, Experiment, Precision

REFERENCE_CHOICES = ("fp64", "none")


def default_out(spec_name: str, output_dir: str | Path = "runs") -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(output_dir) / f"compare-{spec_name}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def _require_backends() -> None:
    import importlib.util

    from dualtrain.backends import PACKAGES

    for backend in (Backend.TORCH, Backend.TF):
        if importlib.util.find_spec(PACKAGES[backend] + ".launch") is None or \
                importlib.util.find_spec(PACKAGES[backend] + ".worker") is None:
            raise UserError(f"compare needs both backends; the {backend.value} backend is not available "
                            f"in this installation (no {PACKAGES[backend]}.worker). Received: "
                            f"dualtrain {backend.value} backend missing")


def _claim_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UserError(f"--out exists and is not a folder. Received: {str(out)!r}")
    if out.is_dir() and any(out.iterdir()):
        raise UserError(f"--out must be a new or empty folder (compare writes three runs into it). "
                        f"Received: {str(out)!r}")
    out.mkdir(parents=True, exist_ok=True)


def reference_spec(spec: Experiment) -> Experiment:
    """The spec's fp64 reference: the same experiment with float64 parameters, activations, loss and
    optimizer state (and no loss scaling, which fp64 never needs)."""
    return spec.replace(precision=dataclasses.replace(spec.precision, dtype=Precision.FP64))


def compare_backends(spec: Experiment, out: str | Path, *, reference: str = "fp64",
                     overlap: bool = False, progress=None) -> Comparison:
    """Run ``spec`` on torch (OUT/torch) and tf (OUT/tf), then, with ``reference="fp64"``, the fp64
    reference pair (OUT/fp64-torch, OUT/fp64-tf; a fp64 spec is its own reference), and compare.
    ``overlap`` runs two runs at a time (faster on many cores; throughput numbers then share the
    machine). ``progress(text)`` is told which run starts."""
    from dualtrain.runs import start_run, validate

    if reference not in REFERENCE_CHOICES:
        raise UserError(f"--reference must be one of {', '.join(REFERENCE_CHOICES)}. "
                        f"Received: {reference!r}")
    _require_backends()
    validate(spec, Backend.TORCH)
    validate(spec, Backend.TF)
    out = Path(out)
    _claim_out(out)
    notes: list[str] = []
    timings: list[str] = []
    t0 = time.perf_counter()
    say = progress or (lambda text: None)

    def timed(label: str, run_spec: Experiment, backend: Backend, where: Path) -> Path:
        say(f"{label}: {backend.value} {run_spec.precision.dtype.value} -> {where}")
        t = time.perf_counter()
        run_dir, _ = start_run(run_spec, backend, where)
        timings.append(f"{label} {time.perf_counter() - t:.1f}s")
        return run_dir

    jobs = [("torch", spec, Backend.TORCH, out / "torch"), ("tf", spec, Backend.TF, out / "tf")]
    with_ref = reference == "fp64" and spec.precision.dtype is not Precision.FP64
    if with_ref:
        ref = reference_spec(spec)
        jobs += [("fp64-torch", ref, Backend.TORCH, out / "fp64-torch"),
                 ("fp64-tf", ref, Backend.TF, out / "fp64-tf")]
    if overlap:
        with ThreadPoolExecutor(max_workers=2) as pool:
            dirs = list(pool.map(lambda job: timed(*job), jobs))
        notes.append("runs overlapped two at a time: throughput is not comparable")
    else:
        dirs = [timed(*job) for job in jobs]
    if reference == "none":
        notes.append("no fp64 reference pair (--reference none): the semantic check did not run; "
                     "trajectory and final weights use the fixed tolerances")
    elif not with_ref:
        notes.append("the runs are fp64: they are the reference pair")
    notes.append(f"runs took {time.perf_counter() - t0:.1f}s ({', '.join(timings)})")
    cmp = compare_dirs(dirs[0], dirs[1], (dirs[2], dirs[3]) if with_ref else None, notes)
    write_report(cmp, out)
    return cmp

"""What the Python API returns: :class:`RunResult` and :class:`CompareResult`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dualtrain.core.weights import load_weights
from dualtrain.errors import UserError
from dualtrain.records.record import SPEC_FILE, WEIGHTS_FINAL, RunRecord, read_run
from dualtrain.spec import Backend, Experiment, load_spec

if TYPE_CHECKING:  # annotations only
    import numpy as np

    from dualtrain.parity.diagnose import Diagnosis
    from dualtrain.parity.report import AnyComparison
    from dualtrain.records.verdict import Check, Finding


@dataclass(frozen=True)
class RunResult:
    """What :func:`run` and :func:`resume` return.

    ``is_chief`` is False only in a process that is one non-chief rank of an externally launched run
    (torchrun, a TF_CONFIG cluster, a multi-task srun step): the chief (rank 0) writes the run
    directory, so there ``run_dir`` is None and ``summary`` is this rank's own view of the run
    (possibly empty).
    """

    run_dir: Path | None
    """The run directory (None on a non-chief rank of an external launch)."""
    backend: str
    """``torch`` or ``tf``."""
    is_chief: bool
    test_accuracy: float | None
    """Accuracy of the final evaluation, 0..1 (classification; None for mse and huber)."""
    test_loss: float | None
    """Mean per-sample loss of the final evaluation (the MSE for model.loss mse)."""
    samples_per_s: float | None
    """Training throughput over the whole run, all replicas together."""
    steps: int | None
    """Optimizer steps run (skipped fp16 steps included)."""
    wall_s: float | None
    """The workers' wall time (summary.json ``wall_s``; process start-up excluded)."""
    test_mae: float | None
    """Mean absolute error of the final evaluation (model.loss mse or huber; None otherwise)."""
    summary: dict[str, Any] = field(repr=False)
    """RUN_DIR/summary.json as written (docs/run-directory.md)."""
    spec: Experiment = field(repr=False)
    """The spec that ran (RUN_DIR/spec.yaml; an external launcher's world size included)."""

    def metrics(self) -> RunRecord:
        """Load the run's records: ``.train`` and ``.eval`` (the rows of metrics.jsonl),
        ``.shards``, ``.spec`` and ``.summary`` (:class:`dualtrain.records.record.RunRecord`)."""
        return read_run(self._dir())

    def final_weights(self) -> dict[str, np.ndarray]:
        """The trained weights (weights_final.npz): canonical names (torch ``state_dict`` keys) to
        NumPy arrays in torch's layout, whichever backend trained them."""
        return load_weights(self._dir() / WEIGHTS_FINAL)

    def _dir(self) -> Path:
        if self.run_dir is None:
            raise UserError(
                "this process is a non-chief rank of an externally launched run; "
                "rank 0 wrote the run directory. Received: RunResult(is_chief=False)"
            )
        return self.run_dir


@dataclass(frozen=True)
class CompareResult:
    """What :func:`compare` returns; the same content as OUT/verdict.json. Two dualtrain runs and
    two audit records give the same fields: the checks, the findings, the verdict."""

    passed: bool
    """Every scored check passed (the CLI's exit code 0)."""
    verdict: str
    """The verdict line, e.g. ``verdict: PASS (16/16 checks; semantics checked against ...)``."""
    category: str | None
    """``semantics differ`` or ``numerics`` when a check failed; None when all passed. Two audit
    records: ``convention`` where a convention of the frameworks, which no line changes, explains
    the only failure (the verdict's word CONVENTION, the CLI's exit code 3), else None (their
    findings name each difference). A model pair: ``limit`` where the fp64 pair's checks alone
    failed and the locator found its two sides apart only by a library's float32 arithmetic inside
    a layer (the verdict's word LIMIT, the CLI's exit code 3)."""
    culprits: tuple[str, ...]
    """The precision paths found off (``("tf fp16 path",)``) when the category is numerics and the
    one-step probes or the convergence check name one; empty otherwise."""
    semantics_checked: bool
    """An fp64 reference pair was compared (False with ``reference="none"``)."""
    checks: tuple[Check, ...] = field(repr=False)
    """Every check (name, group, value, tolerance, passed, detail, ...) in report order."""
    findings: tuple[Finding, ...] = field(repr=False)
    """What differs, each with its evidence, the step it shows at and (audit records) the line to
    change: the likely causes of two dualtrain runs, the differences of two audit records."""
    diagnosis: Diagnosis | None = field(repr=False)
    """Two dualtrain runs: first divergent step, likely cause, evidence (``diagnosis.summary()``
    is one line). None for two audit records."""
    notes: tuple[str, ...] = field(repr=False)
    out: Path
    """The folder holding the report (and, for a spec, the runs)."""
    reports: dict[str, Path] = field(repr=False)
    """``{"json": OUT/verdict.json, "md": OUT/report.md, "html": OUT/report.html}``."""
    run_a: Path
    """Run A (for a spec: OUT/torch)."""
    run_b: Path
    """Run B (for a spec: OUT/tf)."""
    reference_runs: tuple[Path, Path] | None
    """The fp64 reference pair (for a spec: OUT/fp64-torch, OUT/fp64-tf; an fp64 spec's own runs);
    None when semantics were not checked."""
    comparison: AnyComparison = field(repr=False, compare=False)
    """The full comparison (records of every run included), for custom analysis."""

    def check(self, name: str) -> Check:
        """The check called ``name`` (``"trajectory"``, ``"reference_loss"``, ...)."""
        for c in self.checks:
            if c.name == name:
                return c
        names = ", ".join(c.name for c in self.checks)
        raise UserError(f"no check named {name!r} (checks: {names}). Received: {name!r}")


def finished_line(result: RunResult) -> str:
    acc, mae = result.test_accuracy, result.test_mae
    if mae is not None and acc is None:
        score = f"test {result.spec.model.loss.value} {result.test_loss:.4g}, mae {mae:.4g}"
    else:
        score = f"test accuracy {'n/a' if acc is None else f'{100 * acc:.2f}%'}"
    return (
        f"dualtrain: {result.backend} run finished: {score}, "
        f"{result.samples_per_s or 0:,.0f} samples/s -> {result.run_dir}"
    )


def _num(value: Any) -> float | None:
    return None if value is None else float(value)  # float() reads the "nan"/"inf" JSON strings


def build_run_result(
    backend: Backend, run_dir: Path | None, summary: dict[str, Any] | None, spec: Experiment | None
) -> RunResult:
    if run_dir is not None:  # what ran: spec.yaml (an external launcher's world size included)
        spec = load_spec(Path(run_dir) / SPEC_FILE)
    assert spec is not None
    summary = dict(summary or {})
    steps = summary.get("steps")
    return RunResult(
        run_dir=None if run_dir is None else Path(run_dir),
        backend=backend.value,
        is_chief=run_dir is not None,
        test_accuracy=_num(summary.get("test_accuracy")),
        test_loss=_num(summary.get("test_loss")),
        test_mae=_num(summary.get("test_mae")),
        samples_per_s=_num(summary.get("train_samples_per_s")),
        steps=None if steps is None else int(steps),
        wall_s=_num(summary.get("wall_s")),
        summary=summary,
        spec=spec,
    )

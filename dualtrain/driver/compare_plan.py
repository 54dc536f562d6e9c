"""The runs ``dualtrain compare --config`` makes: the fp64 reference pair (the spec in float64, on
each backend) and the spec on torch and on tf, each with its folder under OUT and its part in the
one-step probes (dualtrain.runtime.probes)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dualtrain.runtime import probes
from dualtrain.spec import Backend, Experiment, Precision


def reference_spec(spec: Experiment) -> Experiment:
    """The spec's fp64 reference: the same experiment with float64 parameters, activations, loss and
    optimizer state (and no loss scaling, which fp64 never needs)."""
    return spec.replace(precision=dataclasses.replace(spec.precision, dtype=Precision.FP64))


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    label: str
    """The run's folder under OUT: torch, tf, fp64-torch, fp64-tf."""
    spec: Experiment
    backend: Backend
    where: Path
    probe: probes.Role | None = None
    """The run's part in the one-step probes: record (the fp64 torch run), replay, or none."""

    @property
    def what(self) -> str:
        return f"{self.backend.value} {self.spec.precision.dtype.value}"


def plan_runs(spec: Experiment, out: Path, reference: str) -> list[PlannedRun]:
    """The runs compare makes, in order: (reference fp64, spec not fp64) the fp64 pair first, then
    torch and tf. The fp64 torch run records the states the one-step probes start from
    (dualtrain.runtime.probes); the requested-precision runs replay them after their training."""
    runs = []
    probe = None
    if reference == "fp64" and spec.precision.dtype is not Precision.FP64:
        ref = reference_spec(spec)
        runs += [
            PlannedRun("fp64-torch", ref, Backend.TORCH, out / "fp64-torch", probes.RECORD),
            PlannedRun("fp64-tf", ref, Backend.TF, out / "fp64-tf"),
        ]
        probe = probes.replay(out / "fp64-torch")
    runs += [
        PlannedRun("torch", spec, Backend.TORCH, out / "torch", probe),
        PlannedRun("tf", spec, Backend.TF, out / "tf", probe),
    ]
    return runs

"""The first divergent operation as a record (dualtrain.parity.replay finds it): the stage, the
tensor or layer, the words and the mechanism, and the per-layer (or per-parameter) picture the
report draws (dualtrain.parity.report.where); verdict.json's ``first_divergent_operation``."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dualtrain.parity.taps import LayerRow

LAYER, LOSS, GRADIENT, SLOT, UPDATE, RUNNING, EVALUATION = (
    "layer",
    "loss",
    "gradient",
    "optimizer slot",
    "update",
    "running statistic",
    "evaluation",
)


@dataclass(frozen=True)
class OpFinding:
    """The first operation at which the replayed pair parts."""

    step: int
    stage: str
    """loss, gradient, optimizer slot, update or running statistic."""
    tensor: str | None
    rel: float
    what: str
    """The finding in the user's words."""
    mechanism: str = ""
    """The known mechanism that reproduces it, where one does."""
    layers: tuple[LayerRow, ...] = ()
    """Where the replay tapped the step's layers (debug.dump_layers): each layer's relative
    difference in training and in inference, in forward order (the report's picture)."""
    layer: str | None = None
    """The layer the finding names (its canonical prefix), where it names one."""
    params: tuple[ParamRow, ...] = ()
    """Each parameter's relative difference at the finding's step: its gradient and its value
    after the update (the per-operation picture of an optimizer's or a backward's finding)."""

    def lead(self) -> str:
        return f"{self.what} ({self.mechanism})" if self.mechanism else self.what

    def to_json(self) -> dict[str, object]:
        out = {k: getattr(self, k) for k in ("step", "stage", "tensor", "what", "mechanism")}
        return {
            **out,
            "rel": self.rel if math.isfinite(self.rel) else "inf",
            "layer": self.layer,
            "layers": [r.to_json() for r in self.layers],
            "params": [r.to_json() for r in self.params],
            "lead": self.lead(),
        }


@dataclass(frozen=True)
class ParamRow:
    """One parameter at the finding's step: its gradient's and its updated value's relative
    difference (nan: not recorded)."""

    name: str
    gradient: float
    update: float

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "gradient": None if math.isnan(self.gradient) else self.gradient,
            "update": None if math.isnan(self.update) else self.update,
        }

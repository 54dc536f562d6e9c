"""Early stopping (train.early_stopping) and the best evaluation (train.keep_best), decided once
for both backends (framework-free): the training loop feeds every evaluation's value of the
watched metric, on the chief, and shares the decision with every process.

The rule is Keras's EarlyStopping and Lightning's: a value improves on the best so far when it is
better by more than ``min_delta`` (lower for ``min``, higher for ``max``; NaN never improves);
``wait`` counts evaluations in a row without an improvement, and the run stops after the
evaluation that makes it reach ``patience``. Its state is a checkpoint's, so a resumed run decides
as the uninterrupted one.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from dualtrain.spec import EarlyStoppingSpec, StopMode


def maximize(spec: EarlyStoppingSpec) -> bool:
    """``mode: auto`` watches accuracy upwards and losses and mae downwards."""
    if spec.mode is StopMode.AUTO:
        return spec.metric.endswith("accuracy")
    return spec.mode is StopMode.MAX


@dataclass
class Stopper:
    metric: str
    maximize: bool
    patience: int | None
    min_delta: float
    best: float | None = None
    best_step: int | None = None
    wait: int = 0
    stopped_at: int | None = None

    @classmethod
    def from_spec(cls, spec: EarlyStoppingSpec) -> Stopper:
        return cls(spec.metric, maximize(spec), spec.patience, spec.min_delta)

    def update(self, value: float, step: int) -> tuple[bool, bool]:
        """(this evaluation is the best so far, the run stops after it)."""
        improved = math.isfinite(value) and (
            self.best is None
            or (value - self.best if self.maximize else self.best - value) > self.min_delta
        )
        if improved:
            self.best, self.best_step, self.wait = float(value), step, 0
        else:
            self.wait += 1
        stop = self.patience is not None and self.wait >= self.patience
        if stop:
            self.stopped_at = step
        return improved, stop

    def state(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k in ("best", "best_step", "wait")}

    def load(self, state: dict[str, Any]) -> None:
        self.best = None if state.get("best") is None else float(state["best"])
        self.best_step = None if state.get("best_step") is None else int(state["best_step"])
        self.wait = int(state.get("wait", 0))

    def summary(self) -> dict[str, Any]:
        """What the run's summary.json records (and compare checks)."""
        return {
            "metric": self.metric,
            "mode": "max" if self.maximize else "min",
            "patience": self.patience,
            "min_delta": self.min_delta,
            "best": self.best,
            "best_step": self.best_step,
            "stopped_at": self.stopped_at,
        }

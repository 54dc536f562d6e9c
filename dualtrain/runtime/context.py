"""What every part of the training loop works with, built once by TrainLoop
(:class:`RunContext`), and the run's totals a checkpoint carries (:class:`Counters`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dualtrain.core.data import Data
from dualtrain.records.record import RunWriter
from dualtrain.runtime.engine import Engine
from dualtrain.runtime.feed import Feed
from dualtrain.runtime.progress import Reporter
from dualtrain.spec import Experiment


@dataclass
class Counters:
    """The run's totals so far; a checkpoint's ``loop`` section (a resumed run continues them)."""

    samples: int = 0
    skipped: int = 0
    train_time: float = 0.0
    """Seconds spent training (evaluation and checkpoints excluded)."""
    eval_time: float = 0.0
    last_eval: dict[str, Any] = field(default_factory=dict)
    """The last eval record (dualtrain.runtime.evaluation)."""

    @classmethod
    def from_checkpoint(cls, loop: dict[str, Any]) -> Counters:
        return cls(
            samples=int(loop["samples"]),
            skipped=int(loop["skipped"]),
            train_time=float(loop["train_time"]),
            last_eval=dict(loop["last_eval"]),
        )

    def checkpoint_state(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "skipped": self.skipped,
            "train_time": self.train_time,
            "last_eval": self.last_eval,
        }


@dataclass(frozen=True)
class RunContext:
    """The run as the loop's parts see it: the spec, this process's engine and data, what every
    step is fed, the records' writer and the run directory (the chief's; None elsewhere), the
    progress output and the run's counters."""

    spec: Experiment
    engine: Engine
    data: Data
    feed: Feed
    writer: RunWriter | None
    run_dir: Path | None
    out: Reporter
    counters: Counters

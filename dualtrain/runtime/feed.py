"""What every step is fed, from the core's one plan and one schedule: the ids of each replica, their
global count (the loss normaliser) and the lr. The loop and the probe replays ask the same object,
so a replayed step is fed exactly as the step it replays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dualtrain.core.plan import ShardPlan
from dualtrain.core.schedule import lr_at
from dualtrain.spec import OptimizerSpec


@dataclass(frozen=True)
class StepFeed:
    ids: list[np.ndarray]
    """Sample ids per global replica."""
    count: int
    """The global sample count of the step."""
    lr: float


@dataclass(frozen=True)
class Feed:
    plan: ShardPlan
    optimizer: OptimizerSpec
    total_steps: int

    def at(self, step: int) -> StepFeed:
        """The feed of (1-based) ``step``."""
        spe = self.plan.steps_per_epoch
        ids = self.plan.step_ids((step - 1) // spe, (step - 1) % spe)
        lr = lr_at(self.optimizer, step - 1, self.total_steps, spe)
        return StepFeed(ids, int(sum(len(i) for i in ids)), lr)

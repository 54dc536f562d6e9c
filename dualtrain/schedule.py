"""Learning-rate schedules, defined once (plain Python floats) and fed to both backends every step.

``step`` is the 0-based index of the training step (iteration), counted whether or not loss scaling
skipped the update, so the lr sequence depends only on the spec and never on a framework's optimizer
counter (Keras counts only applied updates; see docs/parity.md).
"""

from __future__ import annotations

import math

from dualtrain.spec import OptimizerSpec, ScheduleName


def lr_at(opt: OptimizerSpec, step: int, total_steps: int) -> float:
    s = opt.schedule
    if s.name is ScheduleName.CONSTANT:
        lr = opt.lr
    elif s.name is ScheduleName.STEP:
        lr = opt.lr * s.gamma ** (step // s.step_size)
    else:  # cosine from lr to min_lr over the run, after warmup
        span = max(total_steps - s.warmup_steps, 1)
        t = min(max(step - s.warmup_steps, 0), span) / span
        lr = s.min_lr + (opt.lr - s.min_lr) * 0.5 * (1.0 + math.cos(math.pi * t))
    if s.warmup_steps and step < s.warmup_steps:
        lr = lr * (step + 1) / s.warmup_steps
    return lr

"""Learning-rate schedules, defined once (plain Python floats) and fed to both backends every step.

``step`` is the 0-based index of the training step (iteration), counted whether or not loss scaling
skipped the update, so the lr sequence depends only on the spec and never on a framework's optimizer
counter (Keras counts only applied updates; see docs/parity.md). With ``schedule.interval: epoch``
the same formulas run on the epoch index (``step // steps_per_epoch``) and the number of epochs: the
lr is constant within an epoch, as with a torch scheduler stepped after each epoch
(pytorch/examples mnist: ``StepLR(step_size=1, gamma=0.7)``).
"""

from __future__ import annotations

import math

from dualtrain.spec import OptimizerSpec, ScheduleInterval, ScheduleName


def lr_at(opt: OptimizerSpec, step: int, total_steps: int, steps_per_epoch: int = 1) -> float:
    s = opt.schedule
    if s.interval is ScheduleInterval.EPOCH:
        step, total_steps = step // steps_per_epoch, -(-total_steps // steps_per_epoch)
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

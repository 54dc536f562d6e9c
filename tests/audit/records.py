"""Audit records written in a test (what a recorder would leave), and the changes tests make to
them: the rows each replica fed, the lr of each step."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from dualtrain.audit.config import RunConfig
from dualtrain.audit.read import Recorded, Script
from dualtrain.audit.rows import ReplicaRow, StepRow


def record(
    framework: str,
    *,
    config: dict | None = None,
    losses: list[float] | None = None,
    first_epoch: int = 1,
    world: int = 1,
    grad_norm: float = 1.0,
    batches: int = 1,
    script: str = "",
) -> Recorded:
    """A record of ``len(losses)`` steps, two an epoch from ``first_epoch``, the same rows as
    every other record made here."""
    losses = losses if losses is not None else [1.0] * 4
    steps = [
        {
            "step": i + 1,
            "epoch": first_epoch + i // 2,
            "lr": 0.1,
            "loss": loss,
            "samples": 8,
            "grad_norm": grad_norm,
            "loss_scale": None,
            "skipped": False,
        }
        for i, loss in enumerate(losses)
    ]
    rows = {
        (s["step"], r): {
            "step": s["step"],
            "epoch": s["epoch"],
            "replica": r,
            "count": 8 // world,
            "batches": batches,
            "exact": [f"{s['step']:08x}{r:08x}"],
            "pattern": [f"{s['step']:08x}{r:08x}"],
        }
        for s in steps
        for r in range(world)
    }
    w = {"w": np.zeros(2, np.float32)}
    cfg = {"optimizer": {"type": "SGD", "lr": 0.1}} if framework == "torch" else {}
    cfg |= config or {}
    text = Script(f"{framework}.py", (), script)
    return Recorded(
        Path(framework),
        framework,
        world,
        RunConfig.from_json(cfg),
        text,
        [StepRow.of(s) for s in steps],
        {k: ReplicaRow.of(v) for k, v in rows.items()},
        w,
        w,
    )


def with_rows(run: Recorded, rows_of) -> Recorded:
    """``run`` with replica r's digests at step s made by ``rows_of(s, r)``."""
    return edit_rows(run, lambda s, r, row: {"exact": rows_of(s, r), "pattern": rows_of(s, r)})


def with_lrs(run, lrs):
    run.steps = run.steps[: len(lrs)]
    return edit_steps(run, lambda k, s: {"lr": float(lrs[k])})


def edit_steps(run: Recorded, change, steps: slice = slice(None)) -> Recorded:
    """``run`` with each of ``steps`` (all by default) given the fields ``change(k, row)`` returns
    (k: the step's index in run.steps)."""
    picked = range(len(run.steps))[steps]
    run.steps = [
        replace(s, **_typed(change(k, s))) if k in picked else s for k, s in enumerate(run.steps)
    ]
    return run


def edit_rows(run: Recorded, change) -> Recorded:
    """``run`` with each replica row given the fields ``change(step, replica, row)`` returns."""
    run.replicas = {
        (s, r): replace(row, **_typed(change(s, r, row))) for (s, r), row in run.replicas.items()
    }
    return run


def _typed(fields: dict) -> dict:
    """Lists as the rows' tuples."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}

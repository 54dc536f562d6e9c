"""Audit records written in a test (what a recorder would leave), and the changes tests make to
them: the rows each replica fed, the lr of each step."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dualtrain.audit.read import Recorded, Script


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
    return Recorded(Path(framework), framework, world, cfg, text, steps, rows, w, w)


def with_rows(run: Recorded, rows_of) -> Recorded:
    """``run`` with replica r's digests at step s made by ``rows_of(s, r)``."""
    for (s, r), row in run.replicas.items():
        row["exact"] = row["pattern"] = rows_of(s, r)
    return run


def with_lrs(run, lrs):
    run.steps = run.steps[: len(lrs)]
    for s, lr in zip(run.steps, lrs, strict=True):
        s["lr"] = float(lr)
    return run

"""Where a worker's start-up goes: marks from the launcher's spawn to the first step, reported in
summary.json ``startup`` (bench/bench_startup.py reads them). Standard library only: a worker's
entry imports it before anything else."""

from __future__ import annotations

import os
import time

#: The wall-clock time (time.time()) at which dualtrain's launcher started this process.
SPAWNED_ENV = "DUALTRAIN_SPAWNED_AT"

_MARKS: dict[str, float] = {}

#: The marks in the order a worker reaches them, and the phase each one ends (summary.json
#: ``startup``: seconds per phase; a mark a backend does not take folds its phase into the next).
PHASES = (
    ("spawned", None),  # dualtrain's launcher started the process
    ("entry", "process_s"),  # the interpreter's start and the package's own imports
    ("framework", "imports_s"),  # torch or TensorFlow with Keras imported
    ("settings", "settings_s"),  # determinism and threads (torch: torch._dynamo, via DDP's needs)
    ("rendezvous", "rendezvous_s"),  # the process group, or the tf.distribute strategy
    ("ready", "engine_s"),  # data, weights, the model, DDP or the traced step
)


def mark(name: str) -> None:
    """The first time ``name`` was reached in this process."""
    _MARKS.setdefault(name, time.time())


def startup() -> dict[str, float | None]:
    """Seconds per start-up phase (None where its end was not marked, or no mark precedes it: a
    run launched by another launcher has no spawn time), and ``spawned_at`` (time.time() at the
    launch; with summary.json's ``ended_at`` a benchmark tells the worker's part of a command from
    the launcher's)."""
    marks = dict(_MARKS)
    spawned = os.environ.get(SPAWNED_ENV)
    if spawned:
        try:
            marks["spawned"] = float(spawned)
        except ValueError:
            pass
    out: dict[str, float | None] = {"spawned_at": marks.get("spawned")}
    last = None
    for name, phase in PHASES:
        if phase is not None:
            out[phase] = (
                round(marks[name] - marks[last], 3) if name in marks and last is not None else None
            )
        if name in marks:
            last = name
    return out

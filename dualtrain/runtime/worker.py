"""The worker skeleton both backends share: what one worker process does around its framework.

A backend's ``worker.py`` reads its launcher's conventions (torchrun's variables, TF_CONFIG),
configures its framework and builds its engine; everything else happens here, once, in the same
order on both: the data and where training starts (:func:`worker_inputs`: the run's data, the
checkpoint to continue from, the initial weights, the worker hooks), then the loop
(:func:`train_loop`: the optimizer state restored, the chief's records, the summary's facts).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dualtrain.core import pair
from dualtrain.core.data import Data, open_data
from dualtrain.core.weights import Weights, worker_initial_weights
from dualtrain.records.envinfo import core_facts
from dualtrain.runtime import clock
from dualtrain.runtime.checkpoint import EMA_SLOT, Checkpoint
from dualtrain.runtime.engine import Engine
from dualtrain.runtime.entry import run_worker_hooks
from dualtrain.runtime.loop import TrainLoop
from dualtrain.runtime.start import Start, resume_checkpoint, settle_gc
from dualtrain.spec import Experiment


@dataclass(frozen=True)
class Begun:
    """Taken first in a worker, before the framework sets anything (docs/env.md)."""

    started: float = field(default_factory=time.perf_counter)
    core: dict[str, Any] = field(default_factory=core_facts)


@dataclass(frozen=True)
class Inputs:
    """What a worker trains from: the data, the checkpoint it continues (None: a fresh run), the
    weights it starts with (the checkpoint's, or the canonical initial weights) and what the
    worker hooks changed (empty: none did; dualtrain.runtime.entry.WORKER_HOOKS)."""

    data: Data
    resume: Checkpoint | None
    weights: Weights
    hook: dict[str, str]
    layout: pair.Layout | None = None
    """A model pair's weight map (model_pair.json, dualtrain.core.pair); None: dualtrain's own
    layers."""


def worker_inputs(spec: Experiment, run_dir: Path | None, start: Start, backend: str) -> Inputs:
    """The data, the starting point and the initial weights; then the worker hooks (tests only), so
    a hook that stops a worker stops every rank before any collective, as a failed check does."""
    data = open_data(spec, run_dir)
    resume = resume_checkpoint(spec, start)  # a checkpoint to continue from (--resume ...)
    weights = resume.weights if resume else worker_initial_weights(spec.model, spec.seed, run_dir)
    layout = pair.read(run_dir) if spec.model.is_pair and run_dir is not None else None
    return Inputs(
        data=data, resume=resume, weights=weights, hook=run_worker_hooks(backend), layout=layout
    )


def train_loop(
    spec: Experiment,
    engine: Engine,
    inputs: Inputs,
    run_dir: Path | None,
    start: Start,
    begun: Begun,
    *,
    chief: bool,
    facts: Mapping[str, Any],
    env: Mapping[str, Any],
) -> TrainLoop:
    """The loop for ``engine``: the checkpoint's optimizer state restored, the run directory
    written by the chief only; ``facts`` (the backend's own: threads, devices, strategy) and
    ``env`` (the backend's environment facts) go into summary.json beside the core facts."""
    settle_gc()  # start-up is over: the collector on again
    clock.mark("ready")
    if inputs.resume is not None:
        state = inputs.resume.optimizer
        # train.ema's average travels in the checkpoint as the slot "ema" (loaded by the loop)
        slots = {k: v for k, v in state.slots.items() if not k.startswith(EMA_SLOT)}
        engine.load_optimizer_state(dataclasses.replace(state, slots=slots))
    extra = {**facts, **inputs.hook, "env": {"core": begun.core, **env}}
    return TrainLoop(
        spec,
        engine,
        inputs.data,
        run_dir if chief else None,
        extra_summary=extra,
        started=begun.started,
        resume=inputs.resume,
        probe=start.probe,
        attempt=start.attempt,
        model_sha256=inputs.layout.digest() if inputs.layout is not None else "",
    )

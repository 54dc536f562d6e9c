"""The loop's checkpoints (dualtrain.runtime.checkpoint, docs/checkpoints.md): the chief writes one
when the cadence says so, with what a resumed run needs to go on as if never stopped (the weights,
the optimizer state with train.ema's average as the slot "ema", the records' offsets, the loop's
counters and early stopping's state); and the planted worker exit of ``debug.exit_rank``."""

from __future__ import annotations

import dataclasses
import os
import platform
import signal
import sys
import time
from typing import Any

import numpy as np

from dualtrain.core.stopping import Stopper
from dualtrain.errors import UserError
from dualtrain.runtime import checkpoint
from dualtrain.runtime.context import Counters, RunContext
from dualtrain.runtime.engine import Engine
from dualtrain.spec import Experiment


class Checkpointer:
    def __init__(self, ctx: RunContext, *, attempt: int, model_sha256: str):
        self.spec = ctx.spec
        self.engine = ctx.engine
        self.writer = ctx.writer
        self.run_dir = ctx.run_dir
        self.out = ctx.out
        self.attempt = attempt
        self.data_sha256 = ctx.data.sha256
        self.model_sha256 = model_sha256
        self.written = 0
        self.seconds = 0.0

    def write(
        self,
        step: int,
        epoch: int,
        counters: Counters,
        stopper: Stopper | None,
        history: list[dict[str, Any]],
    ) -> None:
        """The chief writes the checkpoint of ``step``; the others go on (their next collective
        waits for it)."""
        if self.writer is None:
            return
        assert self.run_dir is not None  # a writer implies a run directory
        t0 = time.perf_counter()
        self.writer.flush()
        spec = self.spec
        state = {
            "epoch": epoch,
            "backend": self.engine.backend,
            "world_size": spec.distribution.world_size,
            "precision": spec.precision.dtype.value,
            "spec": spec.to_dict(),
            "data_sha256": self.data_sha256,
            "model_sha256": self.model_sha256,
            "versions": {
                "python": platform.python_version(),
                "numpy": np.__version__,
                **self.engine.versions(),
            },
            "records": self.writer.offsets(),
            "loop": {
                **counters.checkpoint_state(),
                **({"stopping": stopper.state()} if stopper is not None else {}),
            },
            "history": history,
        }
        crash = spec.debug.crash_in_checkpoint == step and self.attempt == 0
        try:
            with self.out.busy(f"writing the checkpoint of step {step}"):
                path = checkpoint.save(
                    self.run_dir,
                    step,
                    self.engine.weights(),
                    self._optimizer_with_ema(),
                    state,
                    keep=spec.train.keep_checkpoints,
                    crash_after=checkpoint.WEIGHTS if crash else None,
                )
        except checkpoint.CheckpointWriteError as exc:
            raise UserError(str(exc)) from None
        self.seconds += time.perf_counter() - t0
        self.written += 1
        self.out.line(f"checkpoint after step {step} -> {path} ({time.perf_counter() - t0:.2f}s)")

    def _optimizer_with_ema(self) -> checkpoint.OptimizerState:
        """The engine's optimizer state, and train.ema's averaged weights as the slot "ema"
        (every canonical array: the averaged parameters and the running statistics they go
        with)."""
        state = self.engine.optimizer_state()
        if self.spec.train.ema is None:
            return state
        averaged = {f"{checkpoint.EMA_SLOT}{k}": v for k, v in self.engine.ema_weights().items()}
        return dataclasses.replace(state, slots={**state.slots, **averaged})


def planted_exit(spec: Experiment, engine: Engine, step: int, *, first_attempt: bool) -> None:
    """debug.exit_rank: the planted worker exits (SIGKILL) at its step, in the first attempt only
    unless debug.exit_every_attempt (tests of the launcher's restarts)."""
    target = spec.debug.exit_rank
    if target is None or (not first_attempt and not spec.debug.exit_every_attempt):
        return
    if tuple(target) == (step, engine.rank):
        print(
            f"[{engine.backend}] fault injection: rank {engine.rank} exits at step {step}",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGKILL)

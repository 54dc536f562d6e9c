"""What the training loop does besides training, in its own file: the one-step probes it records
(the fp64 run) or replays (a requested-precision run; dualtrain.runtime.probes), the checkpoints
it writes (dualtrain.runtime.checkpoint) and the fault it injects (tests). Mixins of
:class:`~dualtrain.runtime.loop.TrainLoop`, whose state they read (declared below)."""

from __future__ import annotations

import dataclasses
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.core.weights import Weights
from dualtrain.errors import UserError
from dualtrain.records.record import RunWriter
from dualtrain.runtime import checkpoint, probes
from dualtrain.runtime.checkpoint import Checkpoint
from dualtrain.runtime.engine import Engine, StepOut
from dualtrain.runtime.progress import Reporter
from dualtrain.spec import Experiment


class _LoopState:
    """The TrainLoop state the mixins read and write."""

    spec: Experiment
    engine: Engine
    writer: RunWriter | None
    run_dir: Path | None
    world: int
    attempt: int
    resume: Checkpoint | None
    out: Reporter

    def say(self, text: str) -> None:
        raise NotImplementedError  # TrainLoop's

    def _step_inputs(self, step: int) -> tuple[list[np.ndarray], int, float]:
        raise NotImplementedError  # TrainLoop's


class ProbeSteps(_LoopState):
    """Recording (fp64 run) and replaying (requested precision) the one-step probes."""

    probe_role: probes.Role | None
    _probe_index: list[dict[str, Any]]
    _scales: dict[int, float]
    _last_scale: float

    def _record_probe(self, step: int, local: list[np.ndarray], count: int, lr: float) -> None:
        """The fp64 run's probe of ``step``, before the step itself: save the state, then take the
        step exactly (this engine is float64) from that state rounded to float32, the input every
        requested-precision path gets, and save its gradient and loss; then restore the state, so
        the run itself goes on bit for bit as without probes. Against this reference a probe sees
        only what the precision's arithmetic does, not what rounding the state does (a ReLU or a
        max-pool that rounding the weights flips would otherwise show in every backend's error)."""
        weights, state = self.engine.weights(), self.engine.optimizer_state()
        self.engine.load_weights(probes.rounded(weights))
        self.engine.load_optimizer_state(probes.rounded_state(state))
        out = self.engine.train_step(
            local,
            lr=lr,
            global_count=count,
            poison=[False] * len(local),
            capture_grads=True,
            step=step,
            measure_scale=True,
        )
        self.engine.load_weights(weights)
        self.engine.load_optimizer_state(state)
        recorded = {"pre": weights, "slot": state.slots}
        if out.abs_grads:
            recorded["absgrad"] = out.abs_grads
            recorded["absterms"] = out.abs_terms or {}
        self._save_probe(step, out, count, lr, recorded, applied=state.applied)

    def _save_probe(
        self,
        step: int,
        out: StepOut,
        count: int,
        lr: float,
        arrays: dict[str, Weights] | None = None,
        applied: int | None = None,
    ) -> None:
        """The probe of ``step`` (all processes: the loss gather is a collective; the chief writes)
        with its gradient; a replay also saves the weights after the step, a record the state."""
        loss = float(self.engine.gather(np.array([out.loss_sum], np.float64)).sum()) / count
        loss_abs = (
            float(self.engine.gather(np.array([out.abs_loss], np.float64)).sum()) / count
            if out.abs_loss is not None
            else None
        )
        own = (
            float(self.engine.gather(np.array([out.own_loss], np.float64)).sum()) / count
            if out.own_loss is not None
            else None
        )
        if self.writer is None:
            return
        assert self.run_dir is not None  # a writer implies a run directory
        arrays = {"grad": out.grads or {}, **(arrays or {"post": self.engine.weights()})}
        row: dict[str, Any] = {
            "step": step,
            "loss": loss,
            "lr": lr,
            "grad_norm": out.grad_norm,
            "loss_scale": out.loss_scale,
            "skipped": bool(out.skipped),
            "count": count,
        }
        if applied is not None:
            row["applied"] = applied
        if loss_abs is not None:
            row["loss_abs"] = loss_abs
        if own is not None:  # a replay: the exact loss of its own outputs
            row["own_loss"] = own
        if out.sensitivity is not None:  # already summed over the replicas
            row["sensitivity"] = out.sensitivity
        probes.save(self.run_dir, step, arrays)
        self._probe_index.append(row)
        probes.write_index(self.run_dir, self._probe_index)

    def _replay_probes(self) -> int:
        """After training: one step of this run's precision from each state the fp64 run recorded
        (its weights and optimizer state; this run's own loss scale at that step)."""
        rows, self._probe_index = self._probe_index, []
        final_scale = self._last_scale
        for row in rows:
            step = int(row["step"])
            assert self.probe_role is not None and self.probe_role.source is not None  # replay
            arrays = probes.load(self.probe_role.source, step)
            weights, state = probes.state_of(arrays, row, self._scales.get(step, final_scale))
            self.engine.load_weights(weights)
            self.engine.load_optimizer_state(state)
            ids, count, lr = self._step_inputs(step)
            out = self.engine.train_step(
                [ids[r] for r in self.engine.local_replicas],
                lr=lr,
                global_count=count,
                poison=[False] * len(self.engine.local_replicas),
                capture_grads=True,
                step=step,
            )
            self._save_probe(step, out, count, lr)
        return len(rows)


class CheckpointSteps(_LoopState):
    """The chief's checkpoints, and the planted worker exit of ``debug.exit_rank``."""

    samples: int
    skipped: int
    train_time: float
    last_eval: dict[str, Any]
    data: Any
    history: list[dict[str, Any]]
    checkpoints: int
    checkpoint_s: float
    model_sha256: str
    stopper: Any

    def _checkpoint(self, step: int, epoch: int) -> None:
        """The chief writes the checkpoint of ``step`` (docs/checkpoints.md); the others go on
        (their next collective waits for it)."""
        if self.writer is None:
            return
        assert self.run_dir is not None  # a writer implies a run directory
        t0 = time.perf_counter()
        self.writer.flush()
        spec = self.spec
        state = {
            "epoch": epoch,
            "backend": self.engine.backend,
            "world_size": self.world,
            "precision": spec.precision.dtype.value,
            "spec": spec.to_dict(),
            "data_sha256": self.data.sha256,
            "model_sha256": self.model_sha256,
            "versions": {
                "python": platform.python_version(),
                "numpy": np.__version__,
                **self.engine.versions(),
            },
            "records": self.writer.offsets(),
            "loop": {
                "samples": self.samples,
                "skipped": self.skipped,
                "train_time": self.train_time,
                "last_eval": self.last_eval,
                **({"stopping": self.stopper.state()} if self.stopper is not None else {}),
            },
            "history": self.history,
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
        self.checkpoint_s += time.perf_counter() - t0
        self.checkpoints += 1
        self.say(f"checkpoint after step {step} -> {path} ({time.perf_counter() - t0:.2f}s)")

    def _optimizer_with_ema(self) -> checkpoint.OptimizerState:
        """The engine's optimizer state, and train.ema's averaged weights as the slot "ema"
        (every canonical array: the averaged parameters and the running statistics they go
        with)."""
        state = self.engine.optimizer_state()
        if self.spec.train.ema is None:
            return state
        averaged = {f"{checkpoint.EMA_SLOT}{k}": v for k, v in self.engine.ema_weights().items()}
        return dataclasses.replace(state, slots={**state.slots, **averaged})

    def _maybe_exit(self, step: int) -> None:
        target = self.spec.debug.exit_rank
        if (self.attempt or self.resume is not None) and not self.spec.debug.exit_every_attempt:
            return  # the fault fires in the first attempt only
        if target is not None and tuple(target) == (step, self.engine.rank):
            print(
                f"[{self.engine.backend}] fault injection: rank {self.engine.rank} exits at step "
                f"{step}",
                file=sys.stderr,
                flush=True,
            )
            os.kill(os.getpid(), signal.SIGKILL)

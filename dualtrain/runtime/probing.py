"""The loop's one-step probes (dualtrain.runtime.probes): the fp64 reference run records them as it
trains; a requested-precision run notes its loss scale at each probe step and replays them after
training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.core.weights import Weights
from dualtrain.records.record import RunWriter
from dualtrain.runtime import probes
from dualtrain.runtime.engine import Engine, StepOut
from dualtrain.runtime.feed import Feed


class Prober:
    def __init__(
        self,
        engine: Engine,
        writer: RunWriter | None,
        run_dir: Path | None,
        role: probes.Role | None,
        feed: Feed,
    ):
        self.engine = engine
        self.writer = writer
        self.run_dir = run_dir
        self.role = role
        self.feed = feed
        self.index: list[dict[str, Any]] = []
        self.record_at: frozenset[int] = frozenset()
        """The steps whose probe this run records (the fp64 reference run)."""
        if role is not None and role.mode == "record":
            self.record_at = frozenset(probes.probe_steps(feed.total_steps))
        elif role is not None:
            assert role.source is not None  # a replay role names its source run
            self.index = probes.read_index(role.source) or []
        # replay: the loss scale this run used at each probe step (and its last one, for steps a
        # resumed run did not take itself)
        self._scale_at = {int(r["step"]) for r in self.index}
        self._scales: dict[int, float] = {}
        self._last_scale = 1.0

    def saw(self, step: int, out: StepOut) -> None:
        """A training step taken: its loss scale, which a replay of that step uses."""
        self._last_scale = out.loss_scale
        if step in self._scale_at:
            self._scales[step] = out.loss_scale

    def record(self, step: int, local: list[np.ndarray], count: int, lr: float) -> None:
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
        self._save(step, out, count, lr, recorded, applied=state.applied)

    @property
    def replays(self) -> bool:
        """A requested-precision run with probes to replay after training."""
        return self.role is not None and self.role.mode == "replay" and bool(self.index)

    def replay(self) -> int:
        """After training: one step of this run's precision from each state the fp64 run recorded
        (its weights and optimizer state; this run's own loss scale at that step)."""
        rows, self.index = self.index, []
        role = self.role
        assert role is not None and role.source is not None  # a replay
        local_replicas = self.engine.local_replicas
        for row in rows:
            step = int(row["step"])
            arrays = probes.load(role.source, step)
            weights, state = probes.state_of(arrays, row, self._scales.get(step, self._last_scale))
            self.engine.load_weights(weights)
            self.engine.load_optimizer_state(state)
            feed = self.feed.at(step)
            out = self.engine.train_step(
                [feed.ids[r] for r in local_replicas],
                lr=feed.lr,
                global_count=feed.count,
                poison=[False] * len(local_replicas),
                capture_grads=True,
                step=step,
            )
            self._save(step, out, feed.count, feed.lr)
        return len(rows)

    def summary(self, steps: int) -> dict[str, Any] | None:
        """summary.json's ``probes`` (``steps``: how many this run recorded or replays)."""
        if self.role is None:
            return None
        return {"mode": self.role.mode, "steps": steps, "source": str(self.role.source or "")}

    def _save(
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
        loss = self._summed(out.loss_sum, count)
        loss_abs = self._summed(out.abs_loss, count)
        own = self._summed(out.own_loss, count)
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
        self.index.append(row)
        probes.write_index(self.run_dir, self.index)

    def _summed(self, local: float | None, count: int) -> float | None:
        """A per-process sum summed over the processes, per sample (None where the step has none:
        every process has the same fields, so every process joins the same gathers)."""
        if local is None:
            return None
        return float(self.engine.gather(np.array([local], np.float64)).sum()) / count

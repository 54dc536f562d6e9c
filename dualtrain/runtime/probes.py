"""Teacher-forced one-step probes: the local error of the requested precision (framework-free).

The numerics question "does this backend's fp32/fp16/bf16 path compute the meaning the fp64 run
computes?" cannot be answered from whole runs: a defect in one backend's reduced-precision path
moves that run away from its own fp64 run as much as from the other backend, so any noise model
measured on the run itself grows with the defect. A one-step probe cannot be widened that way:

1. The fp64 reference run (``record``) saves, at a few steps spread over the run (the first and a
   late one included), its complete state *before* the step (weights, batchnorm statistics,
   optimizer slots, applied-update count), and, as the reference, the exact (float64) step from that
   state rounded to float32 (the input every requested-precision path gets): its all-reduced
   gradient and loss. Then it restores its state and takes the step itself, bit for bit as without
   probes.
2. After its own training, each requested-precision run (``replay``) loads every such state (rounded
   to its own parameter dtype), runs that one step (the same ids, lr, dropout masks; the loss scale
   its own run used at that step) through its normal train step, and saves its gradient, its weights
   after the step and its loss.
3. compare (dualtrain.parity.local) measures each backend's one-step error against the exact step.
   Both backends start from the same state, so their errors are comparable; one-step errors are not
   amplified by chaotic training, so the bounds can be tight and hold on any CPU.

Files: ``RUN_DIR/probes/step_<k>.npz`` (arrays) and ``RUN_DIR/probes/probes.json`` (per step: loss,
gradient norm, loss scale, skipped). A worker's role is part of where it starts
(dualtrain.runtime.start.Start, passed to the loop as an argument); from dualtrain's launcher to a
worker process it travels in :data:`PROBE_ENV` (``record`` or ``replay=<fp64 run dir>``). compare
sets it, ``dualtrain run`` never.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.core.weights import Weights
from dualtrain.jsonio import write_atomic
from dualtrain.runtime.checkpoint import OptimizerState
from dualtrain.runtime.context import RunContext
from dualtrain.runtime.engine import StepOut

PROBE_ENV = "DUALTRAIN_PROBES"
DIR = "probes"
INDEX = "probes.json"
#: Fractions of the run at which probes sit (the first step is always one; see :func:`probe_steps`).
FRACTIONS = (0.0, 0.2, 0.4, 0.6, 0.8, 0.95)


def probe_steps(total_steps: int, fractions: tuple[float, ...] = FRACTIONS) -> list[int]:
    """1-based steps to probe: step 1 (from the initial weights, no optimizer state yet) and steps
    spread over the run up to a late one (95%: late, but not the cosine schedule's last steps, where
    the lr and so the update are near zero and the step's weights rounding is all there is to
    see)."""
    if total_steps < 1:
        return []
    return sorted({1 + int(round(f * (total_steps - 1))) for f in fractions})


@dataclass(frozen=True)
class Role:
    mode: str
    """``record`` (the fp64 reference run) or ``replay`` (a requested-precision run)."""
    source: Path | None = None
    """replay: the fp64 run whose recorded states are replayed."""

    def env(self) -> dict[str, str]:
        return {PROBE_ENV: self.mode if self.source is None else f"{self.mode}={self.source}"}


RECORD = Role("record")


def replay(source: str | Path) -> Role:
    return Role("replay", Path(source))


def parse_role(text: str) -> Role | None:
    """The role :meth:`Role.env` wrote (None: the run takes no part in the probes)."""
    text = text.strip()
    if not text:
        return None
    mode, _, source = text.partition("=")
    if mode == "record" and not source:
        return RECORD
    if mode == "replay" and source:
        return replay(source)
    raise ValueError(f"{PROBE_ENV} must be 'record' or 'replay=DIR'. Received: {text!r}")


# ---- files ---------------------------------------------------------------------------------------


def _npz(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / DIR / f"step_{step:07d}.npz"


def save(run_dir: str | Path, step: int, arrays: dict[str, Weights]) -> None:
    """One probe's arrays, by group (``pre``, ``slot``, ``grad``, ``absgrad``, ``post``), float64 or
    float32 as given (canonical names and layouts)."""
    path = _npz(Path(run_dir), step)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Any: mypy also matches **flat against savez's allow_pickle: bool parameter
    flat: dict[str, Any] = {
        f"{group}/{name}": np.ascontiguousarray(v)
        for group, weights in arrays.items()
        for name, v in weights.items()
    }
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **flat)
    tmp.replace(path)


def load(run_dir: str | Path, step: int) -> dict[str, Weights]:
    out: dict[str, Weights] = {}
    with np.load(_npz(Path(run_dir), step), allow_pickle=False) as data:
        for key in data.files:
            group, _, name = key.partition("/")
            out.setdefault(group, {})[name] = data[key]
    return out


def write_index(run_dir: str | Path, rows: list[dict[str, Any]]) -> None:
    path = Path(run_dir) / DIR / INDEX
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"probes": rows}, indent=1))


def read_index(run_dir: str | Path) -> list[dict[str, Any]] | None:
    path = Path(run_dir) / DIR / INDEX
    if not path.is_file():
        return None
    return list(json.loads(path.read_text())["probes"])


#: The parameter dtype of every requested-precision path (fp32; fp16/bf16 keep float32 parameters
#: and optimizer state): the recorded state is rounded to it, for the reference step and the
#: replays.
PARAM_DTYPE = np.float32


def rounded(weights: Weights) -> Weights:
    """``weights`` rounded to :data:`PARAM_DTYPE`, kept in their own dtype (exact in float64)."""
    return {
        k: np.asarray(v).astype(PARAM_DTYPE).astype(np.asarray(v).dtype) for k, v in weights.items()
    }


def rounded_state(state: OptimizerState) -> OptimizerState:
    return OptimizerState(
        slots=rounded(state.slots),
        applied=state.applied,
        loss_scale=state.loss_scale,
        good_steps=state.good_steps,
    )


def state_of(
    arrays: dict[str, Weights], row: dict[str, Any], loss_scale: float
) -> tuple[Weights, OptimizerState]:
    """The recorded pre-step state as (weights, optimizer state) for an engine to load, with the
    replaying run's own loss scale (the fp64 run has none)."""
    return arrays.get("pre", {}), OptimizerState(
        slots=dict(arrays.get("slot", {})),
        applied=int(row["applied"]),
        loss_scale=float(loss_scale),
        good_steps=0,
    )


# ---- the loop's part: the fp64 reference run records the probes as it trains; a requested-
# precision run notes its loss scale at each probe step and replays them after training ----------


class Prober:
    def __init__(self, ctx: RunContext, role: Role | None):
        self.engine = ctx.engine
        self.writer = ctx.writer
        self.run_dir = ctx.run_dir
        self.role = role
        self.feed = feed = ctx.feed
        self.index: list[dict[str, Any]] = []
        self.record_at: frozenset[int] = frozenset()
        """The steps whose probe this run records (the fp64 reference run)."""
        if role is not None and role.mode == "record":
            self.record_at = frozenset(probe_steps(feed.total_steps))
        elif role is not None:
            assert role.source is not None  # a replay role names its source run
            self.index = read_index(role.source) or []
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
        the run itself goes on bit for bit as without  Against this reference a probe sees
        only what the precision's arithmetic does, not what rounding the state does (a ReLU or a
        max-pool that rounding the weights flips would otherwise show in every backend's error)."""
        weights, state = self.engine.weights(), self.engine.optimizer_state()
        self.engine.load_weights(rounded(weights))
        self.engine.load_optimizer_state(rounded_state(state))
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
            arrays = load(role.source, step)
            weights, state = state_of(arrays, row, self._scales.get(step, self._last_scale))
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
        save(self.run_dir, step, arrays)
        self.index.append(row)
        write_index(self.run_dir, self.index)

    def _summed(self, local: float | None, count: int) -> float | None:
        """A per-process sum summed over the processes, per sample (None where the step has none:
        every process has the same fields, so every process joins the same gathers)."""
        if local is None:
            return None
        return float(self.engine.gather(np.array([local], np.float64)).sum()) / count

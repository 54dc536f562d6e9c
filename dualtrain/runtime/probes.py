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
gradient norm, loss scale, skipped). The launcher passes the role to the workers in
:data:`PROBE_ENV` (``record`` or ``replay=<fp64 run dir>``); compare sets it, ``dualtrain run``
never.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.core.weights import Weights
from dualtrain.jsonio import write_atomic
from dualtrain.runtime.checkpoint import OptimizerState

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


def role_from_env() -> Role | None:
    text = os.environ.get(PROBE_ENV, "").strip()
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

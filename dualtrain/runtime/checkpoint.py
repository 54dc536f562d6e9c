"""Checkpoints: one layout for both backends, in canonical names (framework-free).

A checkpoint is a folder ``RUN_DIR/checkpoints/step-00000123/`` holding

- ``weights.npz``: the canonical weights (parameters and batchnorm running statistics), in the run's
  parameter dtype; usable as ``model.init_from``;
- ``optimizer.npz``: optimizer state per parameter, named ``"{slot}/{parameter}"`` with
  torch.optim's slot names (``momentum_buffer``, ``exp_avg``, ``exp_avg_sq``, ``square_avg``,
  ``acc_delta``, ``grad_avg``), each in the canonical layout of its parameter;
- ``state.json``: the global step, the epoch, the applied-update count (torch.optim's ``step``), the
  loss-scale state (scale, good-step counter), the loop's counters, where metrics.jsonl and
  shards.jsonl stood, the spec, the backend, versions, and the resume history;
- ``MANIFEST.json``, written last: sha256 and size of every other file.

Data position needs no state: the plan is a pure function of (seed, epoch), dropout masks of
(seed, step, sample id), so the step is the position. Tensors are .npz read with
``allow_pickle=False`` (nothing executes on load), metadata JSON.

Writing is atomic: everything goes into a temporary folder, each file is fsynced, the manifest comes
last, and one ``rename`` makes the checkpoint visible; a crash at any point leaves the previous
checkpoints as they were. Only the chief writes. A checkpoint is *complete* when its manifest exists
and every checksum matches; only complete checkpoints are ever loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.core.weights import Weights, load_weights
from dualtrain.errors import UserError
from dualtrain.jsonio import flatten
from dualtrain.spec import FREE, paths_with

DIR = "checkpoints"
WEIGHTS = "weights.npz"
#: train.ema's average in optimizer.npz: "ema/{parameter}" (canonical), a slot as Keras's
#: optimizer keeps it
EMA_SLOT = "ema/"
OPTIMIZER = "optimizer.npz"
STATE = "state.json"
MANIFEST = "MANIFEST.json"
FORMAT = 1
_NAME = re.compile(r"^step-(\d{8})$")

#: Spec fields that may differ between a checkpoint and the run that continues it, as the schema
#: declares them (dualtrain.spec.FREE): how the run is distributed and logged, where the data lies,
#: and how often it checkpoints. Everything else (seed, data, model, optimizer, precision, train
#: length, determinism) must match.
_FREE = paths_with(FREE)


@dataclass
class OptimizerState:
    """What an engine exports and loads besides the weights."""

    slots: Weights = field(default_factory=dict)
    """``"{slot}/{parameter}"`` -> array in the parameter's canonical layout and dtype."""
    applied: int = 0
    """Updates applied so far (skipped fp16 steps excluded): torch.optim's ``step``."""
    loss_scale: float = 1.0
    good_steps: int = 0
    """GradScaler's growth tracker: applied steps since the scale last changed."""


@dataclass
class Checkpoint:
    path: Path
    weights: Weights
    optimizer: OptimizerState
    state: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.state["step"])


def step_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / DIR / f"step-{step:08d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_npz(path: Path, arrays: Weights) -> None:
    with open(path, "wb") as f:
        # Any: mypy also matches **contiguous against savez's allow_pickle: bool parameter
        contiguous: dict[str, Any] = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
        np.savez(f, **contiguous)
        f.flush()
        os.fsync(f.fileno())


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w") as f:
        f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


class CheckpointWriteError(Exception):
    """A checkpoint could not be written (disk full, unwritable folder); the previous ones stand."""


def save(
    run_dir: str | Path,
    step: int,
    weights: Weights,
    optimizer: OptimizerState,
    state: dict[str, Any],
    keep: int,
    crash_after: str | None = None,
) -> Path:
    """Write the checkpoint of ``step`` atomically and keep the newest ``keep`` complete ones.

    ``crash_after`` (fault injection, debug.crash_in_checkpoint): SIGKILL this process right after
    writing that file, before the manifest and the rename."""
    root = Path(run_dir) / DIR
    final = step_dir(run_dir, step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        arrays = {k: v for k, v in optimizer.slots.items()}
        files = (
            (WEIGHTS, lambda p: _write_npz(p, weights)),
            (OPTIMIZER, lambda p: _write_npz(p, arrays)),
            (
                STATE,
                lambda p: _write_json(
                    p,
                    {
                        **state,
                        "step": step,
                        "format": FORMAT,
                        "applied": optimizer.applied,
                        "loss_scale": optimizer.loss_scale,
                        "good_steps": optimizer.good_steps,
                    },
                ),
            ),
        )
        for name, write in files:
            write(tmp / name)
            if crash_after == name:
                print(
                    f"fault injection: killed while writing the checkpoint of step {step}",
                    flush=True,
                )
                os.kill(os.getpid(), signal.SIGKILL)
        manifest = {
            "format": FORMAT,
            "step": step,
            "files": {
                name: {"sha256": _sha256(tmp / name), "bytes": (tmp / name).stat().st_size}
                for name, _ in files
            },
        }
        _write_json(tmp / MANIFEST, manifest)
        _fsync_dir(tmp)
        if final.exists():  # a checkpoint of this step from an earlier attempt: replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(root)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointWriteError(
            f"the checkpoint of step {step} could not be written to {root}: "
            f"{exc.strerror or exc}; the previous checkpoints are intact"
        ) from None
    for old in complete_steps(run_dir)[:-keep]:
        shutil.rmtree(step_dir(run_dir, old), ignore_errors=True)
    return final


def complete_steps(run_dir: str | Path) -> list[int]:
    """Steps of the checkpoints that have a manifest (ascending); checksums are checked on load."""
    root = Path(run_dir) / DIR
    if not root.is_dir():
        return []
    out = []
    for d in root.iterdir():
        m = _NAME.match(d.name)
        if m and (d / MANIFEST).is_file():
            out.append(int(m.group(1)))
    return sorted(out)


def latest(run_dir: str | Path) -> Path | None:
    steps = complete_steps(run_dir)
    return step_dir(run_dir, steps[-1]) if steps else None


def verify(path: str | Path) -> dict[str, Any]:
    """The manifest of a complete, untampered checkpoint; UserError naming what is wrong
    otherwise."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"checkpoint not found. Received: {str(path)!r}")
    if not (path / MANIFEST).is_file():
        if not any((path / name).exists() for name in (WEIGHTS, OPTIMIZER, STATE)):
            raise UserError(
                f"not a checkpoint: a checkpoint is a folder RUN_DIR/{DIR}/step-NNNNNNNN "
                f"that a run with train.checkpoint_every writes. Received: {str(path)!r}"
            )
        raise UserError(
            f"not a complete checkpoint (no {MANIFEST}: its write did not finish). "
            f"Received: {str(path)!r}"
        )
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = manifest["files"]
    except (ValueError, KeyError, TypeError):
        raise UserError(f"{path / MANIFEST} is not a valid checkpoint manifest") from None
    for name in (WEIGHTS, OPTIMIZER, STATE):
        if name not in files:
            raise UserError(f"{path / MANIFEST} does not list {name}")
        f = path / name
        if not f.is_file():
            raise UserError(f"checkpoint {path} is missing {name}")
        if f.stat().st_size != files[name]["bytes"]:
            raise UserError(
                f"checkpoint {path}: {name} is truncated or changed ({f.stat().st_size} "
                f"bytes, the manifest says {files[name]['bytes']})"
            )
        if _sha256(f) != files[name]["sha256"]:
            raise UserError(
                f"checkpoint {path}: {name} does not match its checksum (changed after "
                f"it was written)"
            )
    return manifest


def load(path: str | Path) -> Checkpoint:
    path = Path(path)
    verify(path)
    state = json.loads((path / STATE).read_text())
    if state.get("format") != FORMAT:
        raise UserError(
            f"checkpoint {path} has format {state.get('format')!r}; this dualtrain reads "
            f"format {FORMAT}"
        )
    weights = load_weights(path / WEIGHTS)
    slots = load_weights(path / OPTIMIZER)
    opt = OptimizerState(
        slots=slots,
        applied=int(state["applied"]),
        loss_scale=float(state["loss_scale"]),
        good_steps=int(state["good_steps"]),
    )
    return Checkpoint(path=path, weights=weights, optimizer=opt, state=state)


def spec_difference(checkpoint_spec: dict[str, Any], spec: dict[str, Any]) -> str | None:
    """The first field that makes ``spec`` a different training run from the checkpoint's, as
    ``"optimizer.lr: 0.1 in the checkpoint, 0.05 here"``; None when they match."""
    a, b = flatten(checkpoint_spec), flatten(spec)
    for key in sorted(set(a) | set(b)):
        if any(key == f or key.startswith(f + ".") for f in _FREE):
            continue
        if a.get(key) != b.get(key):
            return f"{key}: {a.get(key)!r} in the checkpoint, {b.get(key)!r} here"
    return None

"""summary.json: what a finished run reports (docs/run-directory.md), from the loop's parts."""

from __future__ import annotations

import platform
import time
from typing import Any

import numpy as np

from dualtrain.core.data import Data
from dualtrain.core.stopping import Stopper
from dualtrain.core.weights import Weights, weights_digest
from dualtrain.runtime import clock
from dualtrain.runtime.context import Counters
from dualtrain.spec import Experiment


def summary(
    spec: Experiment,
    *,
    backend: str,
    versions: dict[str, str],
    steps: int,
    steps_per_epoch: int,
    counters: Counters,
    wall_s: float,
    data: Data,
    model_sha256: str,
    weights: Weights,
    checkpoints: tuple[int, float],
    history: list[dict[str, Any]],
    stopper: Stopper | None,
    attempt: int,
    probes: dict[str, Any] | None,
    metric: str,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """``checkpoints``: how many were written and the seconds they took; ``extra``: the backend's
    own facts (threads, devices, strategy, environment)."""
    c, last = counters, counters.last_eval
    return {
        "backend": backend,
        "name": spec.name,
        "world_size": spec.distribution.world_size,
        "precision": spec.precision.dtype.value,
        "device": spec.distribution.device.value,
        "steps": steps,
        "epochs_run": round(steps / steps_per_epoch, 4),
        "samples": c.samples,
        "skipped_steps": c.skipped,
        "wall_s": round(wall_s, 3),
        "train_wall_s": round(c.train_time, 3),
        "train_samples_per_s": c.samples / c.train_time if c.train_time else 0.0,
        "eval_wall_s": round(c.eval_time, 3),
        # where the process's time went before training (dualtrain.runtime.clock)
        "startup": clock.startup(),
        "ended_at": time.time(),
        "test_loss": last.get("loss"),
        "test_accuracy": last.get("accuracy"),
        "test_mae": last.get("mae"),
        "test_count": last.get("count"),
        "validation_loss": last.get("val_loss"),
        "validation_accuracy": last.get("val_accuracy"),
        "validation_mae": last.get("val_mae"),
        "validation_count": last.get("val_count"),
        "loss": spec.model.loss.value,
        "metric": metric,
        "dataset": spec.data.dataset.value,
        "data_sha256": data.sha256,
        "model_sha256": model_sha256 or None,
        "weights_final_digest": weights_digest(weights),
        "data_source": data.source,
        # a table's: its file's sha256 and the class names its text target was encoded to
        "table_sha256": (data.facts.get("table") or {}).get("sha256"),
        "class_names": data.class_names,
        "sharding": spec.data.sharding.value,
        "steps_per_epoch": steps_per_epoch,
        "determinism": spec.determinism,
        "checkpoints_written": checkpoints[0],
        "checkpoint_wall_s": round(checkpoints[1], 3),
        "resumed": history,
        "early_stopping": stopper.summary() if stopper is not None else None,
        "attempt": attempt,
        "probes": probes,
        "versions": {"python": platform.python_version(), "numpy": np.__version__, **versions},
        **extra,
    }

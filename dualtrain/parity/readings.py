"""Reading what the checks need from run directories: per-step series, weights, spec differences.

Everything here is plain NumPy over :class:`dualtrain.records.record.RunRecord`; no framework is
imported.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.core.weights import Weights, load_weights
from dualtrain.jsonio import flatten
from dualtrain.records.record import (
    WEIGHTS_EMA,
    WEIGHTS_FINAL,
    WEIGHTS_INIT,
    RunRecord,
    step_map,
)
from dualtrain.spec import COSMETIC, paths_with

#: Spec fields that cannot change the numbers of a run (names, paths, rendezvous, logging), as the
#: schema declares them (dualtrain.spec.COSMETIC). They are still listed in the report, but never
#: make the ``spec`` check fail or name a cause. ``model.init_from`` is judged by its effect
#: instead: the ``init_weights`` check compares the arrays.
COSMETIC_FIELDS = paths_with(COSMETIC)


def label(rec: RunRecord, fallback: str) -> str:
    backend = rec.summary.get("backend")
    return str(backend) if backend else fallback


def labels(a: RunRecord, b: RunRecord) -> tuple[str, str]:
    la, lb = label(a, "A"), label(b, "B")
    if la == lb:
        return f"A ({la})", f"B ({lb})"
    return la, lb


def common_steps(*maps: dict[int, Any]) -> list[int]:
    keys = set(maps[0])
    for m in maps[1:]:
        keys &= set(m)
    return sorted(keys)


def shard_map(rec: RunRecord) -> dict[tuple[int, int], tuple[str, int]]:
    return {
        (int(s["step"]), int(s["replica"])): (str(s["digest"]), int(s["count"])) for s in rec.shards
    }


def loss_diff(a: RunRecord, b: RunRecord) -> tuple[np.ndarray, np.ndarray]:
    """(steps, |loss_a - loss_b|) over the steps both runs recorded, in step order."""
    la, lb = step_map(a, "loss"), step_map(b, "loss")
    steps = common_steps(la, lb)
    diff = np.array([abs(la[s] - lb[s]) for s in steps], dtype=np.float64)
    return np.array(steps, dtype=np.int64), diff


def running_max(values: np.ndarray, lag: int = 0) -> np.ndarray:
    """``out[k] = max(values[: k + 1 + lag])``; NaN counts as +inf (a non-finite noise floor bounds
    nothing)."""
    if values.size == 0:
        return values
    acc = np.maximum.accumulate(np.where(np.isnan(values), np.inf, values))
    if lag <= 0:
        return acc
    idx = np.minimum(np.arange(values.size) + lag, values.size - 1)
    return acc[idx]


# ---- weights -------------------------------------------------------------------------------------


def weights_file(rec: RunRecord, name: str) -> Path:
    return Path(rec.path) / name


def load(rec: RunRecord, name: str) -> Weights | None:
    p = weights_file(rec, name)
    return load_weights(p) if p.is_file() else None


def load_init(rec: RunRecord) -> Weights | None:
    return load(rec, WEIGHTS_INIT)


def load_final(rec: RunRecord) -> Weights | None:
    """The final weights, and with train.ema the averaged ones beside them as ``ema/NAME`` (so the
    weight checks judge both)."""
    final = load(rec, WEIGHTS_FINAL)
    averaged = load(rec, WEIGHTS_EMA)
    if final is None or averaged is None:
        return final
    return {**final, **{f"ema/{k}": v for k, v in averaged.items()}}


def grad_steps(rec: RunRecord) -> list[int]:
    steps = []
    for p in Path(rec.path).glob("grads_step*.npz"):
        m = re.fullmatch(r"grads_step(\d+)\.npz", p.name)
        if m:
            steps.append(int(m.group(1)))
    return sorted(steps)


def layout_problem(wa: Weights, wb: Weights) -> str | None:
    if set(wa) != set(wb):
        return (
            f"different tensors: only in A {sorted(set(wa) - set(wb))}, "
            f"only in B {sorted(set(wb) - set(wa))}"
        )
    for k in sorted(wa):
        if wa[k].shape != wb[k].shape:
            return f"{k}: shape {tuple(wa[k].shape)} vs {tuple(wb[k].shape)}"
    return None


def max_abs_diff(wa: Weights, wb: Weights) -> dict[str, float]:
    return {
        k: float(np.max(np.abs(wa[k].astype(np.float64) - wb[k].astype(np.float64)), initial=0.0))
        for k in sorted(wa)
    }


def rel_diff(wa: Weights, wb: Weights) -> dict[str, float]:
    """Per tensor ||a - b||_2 / ||a||_2 in float64 (an all-zero ``a`` gives the absolute norm)."""
    out = {}
    for k in sorted(wa):
        a = wa[k].astype(np.float64)
        b = wb[k].astype(np.float64)
        ref = float(np.linalg.norm(a))
        d = float(np.linalg.norm(a - b))
        out[k] = d / ref if ref > 0 else d
    return out


# ---- spec ----------------------------------------------------------------------------------------


def spec_differences(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(dotted field, value in A, value in B) for every field that differs, in a stable order."""
    fa, fb = flatten(_normalise(a)), flatten(_normalise(b))
    out = []
    for key in sorted(set(fa) | set(fb)):
        va, vb = fa.get(key, "<absent>"), fb.get(key, "<absent>")
        if va != vb:
            out.append((key, va, vb))
    return out


def is_cosmetic(field: str) -> bool:
    return any(field == c or field.startswith(c + ".") for c in COSMETIC_FIELDS)


def _normalise(spec: dict[str, Any]) -> dict[str, Any]:
    spec = dict(spec or {})
    if isinstance(spec.get("precision"), str):  # the short form "precision: fp16"
        spec["precision"] = {"dtype": spec["precision"]}
    return spec


def metric_name(rec: RunRecord) -> str:
    """The run's evaluation metric (dualtrain.core.losses): accuracy (classification) or mae."""
    return str(rec.summary.get("metric") or "accuracy")


def metric_scale(rec: RunRecord) -> float:
    """What one percent point of the metric means: accuracy is already a fraction (1.0); an error
    metric (mae) is measured in percent of this run's final value (the fp64 reference's, where the
    checks have one)."""
    if metric_name(rec) == "accuracy":
        return 1.0
    final = rec.summary.get(f"test_{metric_name(rec)}")
    return abs(float(final)) if final else 1.0


def metric_points(rec: RunRecord, scale: float) -> dict[int | str, float]:
    """The metric per eval step, and the final one under "final", in percent points of ``scale``,
    signed so that higher is better (an error metric counts negative)."""
    name = metric_name(rec)
    sign = 1.0 if name == "accuracy" else -1.0
    out: dict[int | str, float] = {
        k: sign * 100.0 * v / scale for k, v in step_map(rec, name, "eval").items()
    }
    final = rec.summary.get(f"test_{name}")
    if final is not None:
        out["final"] = sign * 100.0 * float(final) / scale
    return out


def scaled_diff(a: float, b: float) -> float:
    """|a - b|, relative where the values are above 1 (float64 rounding is relative: a regression
    loss of 20,000 carries ~4e-12 of it)."""
    return abs(a - b) / max(1.0, abs(a), abs(b))

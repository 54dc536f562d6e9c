"""The driver's one check of the data against the model, before any worker starts: shapes, row
counts, finite values, target types and ranges against the model's output width (:func:`check`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from dualtrain.core.data import arrays as arrays_mod
from dualtrain.core.data import mnist
from dualtrain.core.data.dataset import Data, open_data, where_of
from dualtrain.core.losses import LOSSES
from dualtrain.core.model import output_width
from dualtrain.errors import UserError
from dualtrain.spec import Dataset, Experiment


def _check_targets(data: Data, width: int, where: str) -> dict[str, Any]:
    target = data.target_name
    table = data.facts.get("table")
    loss = LOSSES[data.loss]
    facts: dict[str, Any] = {}
    lo, hi = np.inf, -np.inf
    for split in ("train", "test"):
        a = data.stored[f"{target}_{split}"]
        # a table's target is its column (the stored key is dualtrain's own)
        key = f"{target}_{split}" if table is None else f"target column {table['target']!r}"
        if loss.labels:
            if a.dtype.kind not in "iub" or a.ndim != 1:
                raise UserError(
                    f"{where}: {key} must be integer class labels of shape (N,) for "
                    f"model.loss {loss.name.value}. Received: {a.dtype} {list(a.shape)}"
                )
        else:
            cols = 1 if a.ndim == 1 else int(np.prod(a.shape[1:]))
            if cols != width:
                raise UserError(
                    f"{where}: {key} has {cols} target column(s) per sample, the model outputs "
                    f"{width} (model.loss {loss.name.value}: one output per target column). "
                    f"Received: {key} {list(a.shape)}"
                )
        for s, e in arrays_mod.row_chunks(a):
            chunk = arrays_mod.take(a, slice(s, e))
            if len(chunk):
                lo, hi = min(lo, float(chunk.min())), max(hi, float(chunk.max()))
    if loss.labels:
        classes = int(hi) + 1
        names = data.class_names
        if table is not None and names is not None and len(names) > width:
            raise UserError(
                f"{where}: the target column {table['target']!r} has {len(names)} classes "
                f"({', '.join(names[:6])}{', ...' if len(names) > 6 else ''}), the model outputs "
                f"{width}: the last layer needs {len(names)} units. Received: {width} outputs"
            )
        if lo < 0 or classes > width:
            bad = int(lo) if lo < 0 else int(hi)
            raise UserError(
                f"{where}: label {bad} is out of range for the model's {width} outputs (labels "
                f"must be 0..{width - 1}; the last layer needs units >= {classes}). Received: "
                f"labels {int(lo)}..{int(hi)}"
            )
        facts["classes"] = classes if names is None else max(classes, len(names))
    elif loss.target_range is not None and not (
        loss.target_range[0] <= lo and hi <= loss.target_range[1]
    ):
        low, high = loss.target_range
        raise UserError(
            f"{where}: {target if table is None else key} must lie in [{low:g}, {high:g}] for "
            f"model.loss {loss.name.value}. Received: values {lo:g}..{hi:g}"
        )
    return facts


def check(spec: Experiment, *, digest: bool = True, width: int | None = None) -> Data:
    """Open the data and check it against the model, once, before any worker starts: shapes,
    row counts, finite values, target types and ranges against the model's output width. Returns
    the data with its content digest (``digest``) and facts (classes) filled in."""
    data = open_data(spec)
    where = where_of(data.source)
    width = output_width(spec.model) if width is None else width  # a model pair's: its own
    if spec.data.dataset is Dataset.MNIST:
        mnist.verify(spec.data)
        facts = _check_targets(data, width, "MNIST")
        sha = mnist.content_digest() if digest else ""
    else:
        for key, a in data.stored.items():
            arrays_mod.check_finite(a, key, where)
        facts = _check_targets(data, width, where)
        sha = arrays_mod.digest(data.stored) if digest else ""
    LOSSES[spec.model.loss].check_width(width)
    return dataclasses.replace(data, sha256=sha, facts={**data.facts, **facts})

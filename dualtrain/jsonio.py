"""File and JSON helpers every layer shares (framework-free; imports nothing of dualtrain).

One JSON sanitiser (JSON has no inf/nan), one atomic write, one flattening of nested dicts into
dotted paths, one way to name a new timestamped folder."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any


def json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float as the string "nan", "inf" or "-inf" (so each record
    stays valid JSON for any reader), numpy scalars as Python numbers, tuples as lists and keys as
    strings."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    item = getattr(obj, "item", None)
    if item is not None and type(obj).__module__ == "numpy":  # a numpy scalar
        return json_safe(item())
    return obj


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader (or a crash) sees the old file or the new one,
    never half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"optimizer": {"lr": 0.1}} -> {"optimizer.lr": 0.1}; lists and scalars are leaves, an empty
    dict adds nothing."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


def new_folder(parent: str | Path, name: str) -> Path:
    """``parent/name-YYYYmmdd-HHMMSS`` (``-2``, ``-3``... when that exists): where a run or a
    compare goes when no --out is given. Nothing is created."""
    base = Path(parent) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path

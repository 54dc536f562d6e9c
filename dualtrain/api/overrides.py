"""The Python API's spec overrides: section dicts merged into the spec (nested dicts
recursively), top-level fields set, a model dict naming preset or layers replacing both."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any


def to_plain(value: Any) -> Any:
    """Plain YAML-like data: mappings to dicts, tuples to lists, paths to strings."""
    if isinstance(value, Mapping):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def _merge(base: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = to_plain(value)
    return out


def merge_override(raw: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    base = raw
    if (
        key == "model"
        and isinstance(value, Mapping)
        and isinstance(raw.get("model"), dict)
        and ("preset" in value or "layers" in value)
    ):  # mutually exclusive: the new one replaces
        model = {k: v for k, v in raw["model"].items() if k not in ("preset", "layers")}
        base = {**raw, "model": model}
    return _merge(base, {key: value})

"""The spec a Python API call runs (:func:`experiment`): a YAML file, a dict or an Experiment, with
the call's overrides: section dicts merged into the spec (nested dicts recursively), top-level
fields set, a model dict naming preset or layers replacing both, then ``--set`` strings, the world
size and the precision (the order dualtrain.api's docstring gives)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Union

from dualtrain.api import inmemory
from dualtrain.errors import UserError
from dualtrain.spec import Experiment, apply_overrides, from_dict, read_yaml

PathLike = Union[str, "os.PathLike[str]"]
SpecLike = Union[PathLike, Mapping[str, Any], "Experiment"]
"""A path to a YAML spec, a dict with the YAML schema, or a :class:`dualtrain.spec.Experiment`."""


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


def experiment(
    spec: SpecLike,
    *,
    world_size: int | None = None,
    precision: str | Mapping[str, Any] | None = None,
    set: Sequence[str] = (),
    **overrides: Any,
) -> Experiment:
    """The spec :func:`run` would run, validated; nothing is started, and nothing is written but
    the cache a DataFrame or NumPy arrays given as ``data`` go into.

    ``spec``: a path to a YAML file, a dict (the YAML schema) or an Experiment. Overrides: see the
    module docstring; ``data`` may also be a pandas DataFrame or a dict of NumPy arrays
    (:mod:`dualtrain.api.inmemory`: written into dualtrain's cache, the one thing this writes).
    Raises UserError (one line, naming the field) for an unknown key or a bad value.
    """
    strings = [set] if isinstance(set, str) else list(set)
    if isinstance(spec, Experiment):
        if not (overrides or strings or world_size is not None or precision is not None):
            return spec
        raw = spec.to_dict()
    elif isinstance(spec, Mapping):
        raw = to_plain(spec)
    elif isinstance(spec, (str, os.PathLike)):
        raw = read_yaml(Path(spec))
    else:
        raise UserError(
            f"spec must be a path to a YAML file, a dict or a "
            f"dualtrain.spec.Experiment. Received: {type(spec).__name__}"
        )
    raw = apply_overrides(raw, [])  # the loader's short forms (precision: fp16) first
    for key, value in overrides.items():
        if key == "data":  # a DataFrame or NumPy arrays: the section's path (api/inmemory.py)
            value = inmemory.data_section(value)
        raw = merge_override(raw, key, value)
    raw = apply_overrides(raw, strings)
    if world_size is not None:
        raw = merge_override(raw, "distribution", {"world_size": world_size})
    if precision is not None:
        raw = merge_override(
            raw, "precision", {"dtype": precision} if isinstance(precision, str) else precision
        )
    raw, held = inmemory.hold(raw)  # validated with placeholders, then written into the cache
    return inmemory.materialise(from_dict(raw), held)

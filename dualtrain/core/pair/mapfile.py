"""A model pair's explicit weight map, ``model.weight_map``'s file (YAML or JSON): read and
checked (:func:`read_map_file`, :func:`load_map_file`), and the check every map passes, explicit or
automatic: each array of both sides mapped exactly once (:func:`check_complete`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dualtrain.core.pair.record import MapEntry, Side
from dualtrain.core.pair.transforms import SPLIT, TRANSFORMS, keras_shapes, to_canonical_parts
from dualtrain.errors import UserError


def read_map_file(path: str) -> list[dict[str, Any]]:
    """``model.weight_map``'s file, read: it exists, parses as YAML/JSON and is a list of
    mappings. Checked before the frameworks load (dualtrain.driver.pair) as well as with them."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"model.weight_map: file not found. Received: {path!r}")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise UserError(
            f"model.weight_map: {p} is not YAML/JSON ({exc}). Received: {path!r}"
        ) from None
    if not isinstance(raw, list) or not all(isinstance(e, dict) for e in raw):
        raise UserError(
            f"model.weight_map: {p} must be a list of {{torch, keras, transform}} mappings. "
            f"Received: {type(raw).__name__}"
        )
    return raw


def load_map_file(path: str, torch: Side, keras: Side) -> tuple[MapEntry, ...]:
    """An explicit map (``model.weight_map``): YAML or JSON, a list of ``{torch: NAME, keras:
    PATH, transform: T}`` (``chw: [C, H, W]`` for flatten_chw), covering every array of both
    sides once."""
    raw = read_map_file(path)
    t_arrays = {a.name: a for a in torch.torch}
    k_vars = {v.path: v for v in keras.keras}
    entries: list[MapEntry] = []
    for i, e in enumerate(raw):
        where = f"model.weight_map[{i}]"
        t, targets = _parse(where, e, k_vars)
        if e["torch"] not in t_arrays:
            raise UserError(
                f"{where}.torch: no such array in the torch model. Received: {e['torch']!r} "
                f"(the model's: {sorted(t_arrays)})"
            )
        a, vs = t_arrays[e["torch"]], [k_vars[k] for k in targets]
        chw = e.get("chw")
        entry = MapEntry(
            e["torch"],
            targets[0] if t not in SPLIT else tuple(targets),
            t,
            tuple(chw) if chw else None,
            e.get("heads", _heads(t, vs[0].shape)),
        )
        got = keras_shapes(entry, a.shape)
        if got != tuple(v.shape for v in vs):
            raise UserError(
                f"{where}: {t} makes {[list(s) for s in got or ()] or ['nothing']} of torch "
                f"{a.name} {list(a.shape)}, not Keras {', '.join(v.path for v in vs)}'s "
                f"{[list(v.shape) for v in vs]}: a reshape dualtrain cannot justify. Received: "
                f"{e!r}"
            )
        if any(a.trainable != v.trainable for v in vs):
            raise UserError(
                f"{where}: torch {a.name} and Keras {vs[0].path} differ in trainability. "
                f"Received: {e!r}"
            )
        entries.append(entry)
    check_complete(entries, torch, keras)
    return tuple(entries)


def _parse(where: str, e: dict[str, Any], variables: Iterable[str]) -> tuple[str, list[str]]:
    """One map entry's transform and Keras targets, checked: its keys, a known transform, one
    target or (a split transform) several, each a variable of ``variables``."""
    unknown = sorted(set(e) - {"torch", "keras", "transform", "chw", "heads"})
    if unknown or "torch" not in e or "keras" not in e:
        raise UserError(
            f"{where} needs torch and keras (and a transform: {', '.join(TRANSFORMS)}). "
            f"Received: {e!r}"
        )
    t = e.get("transform", "identity")
    if t not in TRANSFORMS:
        raise UserError(f"{where}.transform must be one of {list(TRANSFORMS)}. Received: {t!r}")
    targets = [e["keras"]] if isinstance(e["keras"], str) else e["keras"]
    if (t in SPLIT) != (isinstance(targets, list) and len(targets) > 1) or not all(
        isinstance(k, str) for k in targets
    ):
        want = f"a list of {SPLIT[t][0]} variables" if t in SPLIT else "one variable"
        raise UserError(f"{where}.keras: {t} maps onto {want}. Received: {e['keras']!r}")
    known = set(variables)
    for k in targets:
        if k not in known:
            raise UserError(
                f"{where}.keras: no such variable in the Keras model. Received: {k!r} "
                f"(the model's: {sorted(known)})"
            )
    return t, targets


def canonical_from_keras(
    path: str, values: dict[str, np.ndarray], required: Iterable[str]
) -> dict[str, np.ndarray]:
    """A Keras model's arrays (``values``, by variable path) under the torch names and in the torch
    layout an explicit map (``model.weight_map``'s format) gives them: how dualtrain.audit's Keras
    recorder names a model pair's weights. Each array the map names once; every ``required`` one
    (the trainable) must be among them, the others (moving statistics, seed states) may be."""
    out: dict[str, np.ndarray] = {}
    used: list[str] = []
    for i, e in enumerate(read_map_file(path)):
        where = f"weight_map[{i}]"
        t, targets = _parse(where, e, values)
        chw = e.get("chw")
        entry = MapEntry(
            str(e["torch"]),
            targets[0] if t not in SPLIT else tuple(targets),
            t,
            tuple(chw) if chw else None,
            e.get("heads", _heads(t, np.shape(values[targets[0]]))),
        )
        out[entry.torch] = to_canonical_parts(entry, [values[k] for k in targets])
        used += targets
    twice = sorted({k for k in used if used.count(k) > 1})
    missing = [k for k in required if k not in used]
    if twice or missing:
        raise UserError(
            f"weight_map {path} maps Keras {twice[0]} twice"
            if twice
            else f"weight_map {path} leaves Keras {missing[0]} out (every array needs an entry). "
            f"Received: {len(missing)} unmapped"
        )
    return out


def _heads(transform: str, shape: tuple[int, ...]) -> int | None:
    """The number of heads an attention transform's Keras shape says (kernel (E, heads, dim) or
    bias (heads, dim) for the input projections, kernel (heads, dim, E) for the output)."""
    if transform in ("heads_in", "qkv_heads"):
        return shape[1] if len(shape) == 3 else shape[0] if len(shape) == 2 else None
    if transform == "heads_out":
        return shape[0] if len(shape) == 3 else None
    return None


def check_complete(entries: Iterable[MapEntry], torch: Side, keras: Side) -> None:
    """Every array of both sides mapped exactly once."""
    entries = list(entries)
    for side, names, used in (
        ("torch", [a.name for a in torch.torch], [e.torch for e in entries]),
        ("Keras", [v.path for v in keras.keras], [k for e in entries for k in e.targets]),
    ):
        twice = sorted({n for n in used if used.count(n) > 1})
        if twice:
            raise UserError(
                f"model.weight_map maps {side} {twice[0]} more than once (two arrays onto one). "
                f"Received: {len(used)} entries"
            )
        missing = [n for n in names if n not in used]
        if missing:
            raise UserError(
                f"model.weight_map leaves {side} {missing[0]} out (every array of both models "
                f"needs an entry). Received: {len(missing)} {side} array(s) unmapped"
            )

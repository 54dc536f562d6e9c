"""A model pair's explicit weight map, ``model.weight_map``'s file (YAML or JSON): read and
checked (:func:`read_map_file`, :func:`load_map_file`), and the check every map passes, explicit or
automatic: each array of both sides mapped exactly once (:func:`check_complete`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from dualtrain.core.pair.record import MapEntry, Side
from dualtrain.core.pair.transforms import TRANSFORMS, keras_shape
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
        unknown = sorted(set(e) - {"torch", "keras", "transform", "chw"})
        if unknown or "torch" not in e or "keras" not in e:
            raise UserError(
                f"{where} needs torch and keras (and a transform: {', '.join(TRANSFORMS)}). "
                f"Received: {e!r}"
            )
        t = e.get("transform", "identity")
        if t not in TRANSFORMS:
            raise UserError(f"{where}.transform must be one of {list(TRANSFORMS)}. Received: {t!r}")
        if e["torch"] not in t_arrays:
            raise UserError(
                f"{where}.torch: no such array in the torch model. Received: {e['torch']!r} "
                f"(the model's: {sorted(t_arrays)})"
            )
        if e["keras"] not in k_vars:
            raise UserError(
                f"{where}.keras: no such variable in the Keras model. Received: {e['keras']!r} "
                f"(the model's: {sorted(k_vars)})"
            )
        chw = e.get("chw")
        entry = MapEntry(e["torch"], e["keras"], t, tuple(chw) if chw else None)
        a, v = t_arrays[entry.torch], k_vars[entry.keras]
        if keras_shape(entry, a.shape) != v.shape:
            raise UserError(
                f"{where}: {t} makes {list(keras_shape(entry, a.shape) or ['nothing'])} of torch "
                f"{a.name} {list(a.shape)}, not Keras {v.path}'s {list(v.shape)}: a reshape "
                f"dualtrain cannot justify. Received: {e!r}"
            )
        if a.trainable != v.trainable:
            raise UserError(
                f"{where}: torch {a.name} and Keras {v.path} differ in trainability. Received: "
                f"{e!r}"
            )
        entries.append(entry)
    check_complete(entries, torch, keras)
    return tuple(entries)


def check_complete(entries: Iterable[MapEntry], torch: Side, keras: Side) -> None:
    """Every array of both sides mapped exactly once."""
    entries = list(entries)
    for side, names, used in (
        ("torch", [a.name for a in torch.torch], [e.torch for e in entries]),
        ("Keras", [v.path for v in keras.keras], [e.keras for e in entries]),
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

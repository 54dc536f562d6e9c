"""A model pair as recorded (``model_pair.json``): each side's description (:class:`TorchArray`,
:class:`KerasVar`, :class:`Side`: what its describe child printed), the map's entries
(:class:`MapEntry`) and the :class:`Layout` that holds them, with their JSON. The canonical layout
of a pair is the torch module's state dict, less :data:`SKIPPED_BUFFERS`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.core.pair.dropout import DropoutEntry, entry_from_json

PAIR_FILE = "model_pair.json"
#: a converted pair's torch side writes it beside its side.json (backends/torch/convert.py): the
#: learned map's entries (``map``), the port as Keras's JSON (``keras``), the map in words
CONVERTED_FILE = "converted.json"
#: in a Keras export being written: the user's objects model.keras refers to, {name: [module,
#: attribute]} (backends/tf/export.py writes it; driver/export_check.py reads it into export.json)
CUSTOM_OBJECTS_FILE = "custom_objects.json"
#: The torch state dict entries that are no weight (BatchNorm's counter: the run's step count
#: is the optimizer's, and Keras has no such variable)
SKIPPED_BUFFERS = ("num_batches_tracked",)


@dataclass(frozen=True)
class TorchArray:
    name: str
    shape: tuple[int, ...]
    trainable: bool
    module: str
    """The module path ("" for the top module), as in named_modules()."""
    kind: str
    """dense, conv2d, batchnorm, attention or other (the module's class: Linear, Conv2d,
    BatchNorm*, MultiheadAttention)."""
    cls: str = ""
    heads: int | None = None
    """An nn.MultiheadAttention's arrays (and its out_proj's): its num_heads."""


@dataclass(frozen=True)
class KerasVar:
    path: str
    shape: tuple[int, ...]
    trainable: bool
    layer: str
    kind: str
    """dense, conv2d, batchnorm, attention (a MultiHeadAttention's query, key, value and
    attention_output projections) or other (the layer's class)."""
    role: str
    """The variable's own name in its layer: kernel, bias, gamma, beta, moving_mean, ..."""
    cls: str = ""
    flatten_hwc: tuple[int, int, int] | None = None
    """dense only: the (H, W, C) a Flatten layer right before it flattens."""


@dataclass(frozen=True)
class MapEntry:
    torch: str
    keras: str | tuple[str, ...]
    """The Keras variable, or the variables one torch array is split across, in order (torch's
    packed in_proj_weight: the query, key and value kernels)."""
    transform: str
    chw: tuple[int, int, int] | None = None
    """flatten_chw: the (C, H, W) torch flattens."""
    heads: int | None = None
    """qkv_heads, heads_in, heads_out: the attention's number of heads."""
    views: tuple[ViewOf, ...] = ()
    """``view`` (a map learned from a converter): each target as a strided view of the array."""

    @property
    def targets(self) -> tuple[str, ...]:
        """The Keras variables this entry maps onto (one, or the parts in order)."""
        return (self.keras,) if isinstance(self.keras, str) else tuple(self.keras)

    def part(self, i: int) -> str:
        """The name of the array's ``i``-th part, as a split entry's TF side names its variable
        (``blocks.0.self_attn.in_proj_weight#1``: the key part)."""
        return f"{self.torch}{PART}{i}"


#: the separator of a split entry's part names (torch names hold no '#')
PART = "#"


@dataclass(frozen=True)
class ViewOf:
    """A Keras variable as a strided view of one torch array flattened in C order: element
    ``i`` of the view (over ``shape``, C order) is the array's element ``offset + sum(i_k *
    strides[k])``; the view, read in C order, is the variable reshaped to ``keras`` (a converter's
    transpose, reshape, split or slice; dualtrain.core.pair.learn)."""

    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    keras: tuple[int, ...]
    array: tuple[int, ...]
    """The torch array's shape."""

    def indices(self) -> np.ndarray:
        """Each Keras element's index into the flat array, in the variable's shape."""
        idx: np.ndarray = np.full(self.shape, self.offset, dtype=np.int64)
        for axis, (n, s) in enumerate(zip(self.shape, self.strides, strict=True)):
            at = [1] * len(self.shape)
            at[axis] = n
            idx += (np.arange(n, dtype=np.int64) * s).reshape(at)
        return idx.reshape(self.keras)


@dataclass(frozen=True)
class Side:
    """One backend's description of its model (what its describe child printed)."""

    factory: str
    cls: str
    """The model's class (nn.Module subclass, keras.Model subclass)."""
    output: tuple[int, ...]
    """One sample's output shape."""
    torch: tuple[TorchArray, ...] = ()
    keras: tuple[KerasVar, ...] = ()
    layers: tuple[dict[str, Any], ...] = ()
    """Every leaf layer in call order, with its kind and settings (the locator's input)."""
    digest: str = ""
    """sha256 of the factory's source file."""
    dropouts: tuple[dict[str, Any], ...] = ()
    """Every dropout call in forward order (dualtrain.core.pair.dropout.call_record)."""
    config: str = ""
    """The Keras side of a converter (model.convert): the converted model as Keras's JSON
    (``model.to_json()``), which every TF process builds again under its run's dtype policy."""


@dataclass(frozen=True)
class Layout:
    """A run's model pair: both sides and the map (``model_pair.json``)."""

    torch: Side
    keras: Side
    entries: tuple[MapEntry, ...]
    explicit: bool = False
    """The map came from model.weight_map (else: matched automatically)."""
    dropouts: tuple[DropoutEntry, ...] = ()
    """The dropout calls with a rate above 0, matched in forward order (the k-th is hash layer
    k: dualtrain.core.pair.dropout)."""
    learned: bool = False
    """The map was learned from a converter (model.convert: dualtrain.core.pair.learn)."""

    # -- the canonical layout ------------------------------------------------------------------
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {a.name: a.shape for a in self.torch.torch}

    def trainable(self) -> list[str]:
        return [a.name for a in self.torch.torch if a.trainable]

    @property
    def output_width(self) -> int:
        out = self.torch.output
        return int(np.prod(out)) if out else 1

    def by_torch(self) -> dict[str, MapEntry]:
        return {e.torch: e for e in self.entries}

    def digest(self) -> str:
        """sha256 of the pair as recorded (both sides' code digests, arrays and the map): a
        checkpoint continues only the model it was trained as."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()

    # -- records --------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        # a pair without dropout is written as before dropout was carried (its digest unchanged)
        d = {
            "torch": _side_json(self.torch),
            "keras": _side_json(self.keras),
            "map": map_json(self.entries),
            "explicit": self.explicit,
        }
        if self.learned:
            d["learned"] = True
        return {**d, "dropouts": [asdict(e) for e in self.dropouts]} if self.dropouts else d

    @staticmethod
    def from_json(d: dict[str, Any]) -> Layout:
        return Layout(
            side_from_json(d["torch"]),
            side_from_json(d["keras"]),
            map_from_json(d["map"]),
            bool(d.get("explicit", False)),
            tuple(entry_from_json(e) for e in d.get("dropouts", ())),
            bool(d.get("learned", False)),
        )


def _side_json(side: Side) -> dict[str, Any]:
    d = asdict(side)
    if not side.dropouts:
        del d["dropouts"]
    if not side.config:  # written as before converters were carried (the pair's digest)
        del d["config"]
    for a in d["torch"]:  # an array of no attention is written as before (the pair's digest)
        if a["heads"] is None:
            del a["heads"]
    return d


def map_json(entries: tuple[MapEntry, ...]) -> list[dict[str, Any]]:
    """A map's entries as JSON (``model_pair.json``'s ``map``)."""
    return [_entry_json(e) for e in entries]


def map_from_json(d: list[dict[str, Any]]) -> tuple[MapEntry, ...]:
    return tuple(_entry(e) for e in d)


def _entry_json(e: MapEntry) -> dict[str, Any]:
    d = asdict(e)
    if e.heads is None:  # written as before attention was carried (the pair's digest)
        del d["heads"]
    if not isinstance(e.keras, str):
        d["keras"] = list(e.keras)
    if e.views:
        d["views"] = [list(map(list, (v.shape, v.strides, v.keras, v.array))) for v in e.views]
        d["offsets"] = [v.offset for v in e.views]
    else:
        del d["views"]
    return d


def _entry(e: dict[str, Any]) -> MapEntry:
    chw, keras = e.get("chw"), e["keras"]
    return MapEntry(
        e["torch"],
        keras if isinstance(keras, str) else tuple(keras),
        e["transform"],
        tuple(chw) if chw else None,
        e.get("heads"),
        tuple(
            ViewOf(int(o), tuple(shape), tuple(strides), tuple(k), tuple(a))
            for o, (shape, strides, k, a) in zip(
                e.get("offsets", ()), e.get("views", ()), strict=True
            )
        ),
    )


def side_from_json(d: dict[str, Any]) -> Side:
    return Side(
        factory=d["factory"],
        cls=d.get("cls", ""),
        output=tuple(d["output"]),
        torch=tuple(
            TorchArray(
                a["name"],
                tuple(a["shape"]),
                a["trainable"],
                a["module"],
                a["kind"],
                a.get("cls", ""),
                a.get("heads"),
            )
            for a in d.get("torch", ())
        ),
        keras=tuple(
            KerasVar(
                v["path"],
                tuple(v["shape"]),
                v["trainable"],
                v["layer"],
                v["kind"],
                v["role"],
                v.get("cls", ""),
                tuple(v["flatten_hwc"]) if v.get("flatten_hwc") else None,
            )
            for v in d.get("keras", ())
        ),
        layers=tuple(d.get("layers", ())),
        digest=d.get("digest", ""),
        dropouts=tuple(d.get("dropouts", ())),
        config=d.get("config", ""),
    )


def write(layout: Layout, run_dir: Path) -> None:
    (Path(run_dir) / PAIR_FILE).write_text(json.dumps(layout.to_json(), indent=1) + "\n")


def read(run_dir: Path | str) -> Layout | None:
    p = Path(run_dir) / PAIR_FILE
    return Layout.from_json(json.loads(p.read_text())) if p.is_file() else None

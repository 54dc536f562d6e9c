"""A model pair's canonical <-> Keras layout on the TF side (dualtrain.core.pair's map): the Keras
variables in canonical (torch state dict) order, the run's weights loaded through the map and read
back, and :class:`PairConversion`, which the engine's weights, gradients and optimizer slots go
through. An array split across several variables (torch's packed in_proj_weight; a converter's
split) is handled as its parts (``MapEntry.part``)."""

from __future__ import annotations

from collections.abc import Iterable

import keras
import numpy as np

from dualtrain.core import pair
from dualtrain.core.weights import Weights

from .layers import Model, Variable
from .model import Conversion
from .pair import var_path


def named_variables(net: Model, layout: pair.Layout) -> list[tuple[str, Variable]]:
    """[(name, Keras variable)] in the canonical (torch state dict) order: the canonical name, or
    for an array split across several variables (torch's packed in_proj_weight onto the query,
    key and value kernels) each part's name (``MapEntry.part``), whose canonical form is its
    rows of the array (:class:`PairConversion`)."""
    by_path = {var_path(net, v, layout.learned): v for v in net.weights}
    entries = layout.by_torch()
    out = []
    for a in layout.torch.torch:
        e = entries[a.name]
        if len(e.targets) == 1:
            out.append((a.name, by_path[e.targets[0]]))
        else:
            out += [(e.part(i), by_path[k]) for i, k in enumerate(e.targets)]
    return out


def load_canonical(
    named: list[tuple[str, Variable]], layout: pair.Layout, weights: Weights
) -> None:
    conv = PairConversion(layout)
    if set(weights) != set(layout.shapes()):
        raise ValueError(f"weights do not match the pair: {sorted(weights)}")
    parts = conv.split(weights)
    for name, var in named:
        value = conv.to_keras(name, parts[name], var.dtype)
        if tuple(var.shape) != value.shape:
            raise ValueError(f"{name}: Keras shape {tuple(var.shape)} != mapped {value.shape}")
        var.assign(value)


def export_canonical(named: list[tuple[str, Variable]], layout: pair.Layout) -> Weights:
    conv = PairConversion(layout)
    return conv.join(
        (name, conv.to_canonical(name, keras.ops.convert_to_numpy(var.value)))
        for name, var in named
    )


class PairConversion(Conversion):
    """A model pair's canonical <-> Keras layout, by its weight map's transforms. A part's name
    (an array split across several variables: ``MapEntry.part``) converts its own rows of the
    canonical array; :meth:`join` and :meth:`split` go between the parts and the array."""

    def __init__(self, layout: pair.Layout):
        self.entries = layout.by_torch()

    def _entry(self, name: str) -> pair.MapEntry:
        base, sep, _ = name.rpartition(pair.PART)
        if sep and base in self.entries:
            return pair.part_entry(self.entries[base])
        return self.entries[name]

    def to_keras(self, name: str, array: np.ndarray, dtype: str = "float32") -> np.ndarray:
        return pair.to_keras(self._entry(name), np.asarray(array, dtype=dtype))

    def to_canonical(self, name: str, array: np.ndarray) -> np.ndarray:
        a = np.asarray(array)
        a = a if a.dtype == np.float64 else a.astype(np.float32, copy=False)
        return pair.to_canonical(self._entry(name), a)

    def join(self, items: Iterable[tuple[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """Canonical arrays by name from canonical arrays and parts (in part order)."""
        out: dict[str, np.ndarray] = {}
        parts: dict[str, list[np.ndarray]] = {}
        for name, a in items:
            base, sep, _ = name.rpartition(pair.PART)
            if sep and base in self.entries:
                parts.setdefault(base, []).append(a)
                out.setdefault(base, a)  # its place in the order
            else:
                out[name] = a
        for base, arrays in parts.items():
            out[base] = pair.join_canonical(self.entries[base], arrays)
        return out

    def split(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The inverse of :meth:`join`: a split entry's array as its parts' rows."""
        out: dict[str, np.ndarray] = {}
        for name, a in arrays.items():
            e = self.entries.get(name)
            if e is not None and pair.is_split(e):
                for i, p in enumerate(pair.split_canonical(e, a)):
                    out[e.part(i)] = p
            else:
                out[name] = a
        return out


def canonical(conversion: Conversion, items: Iterable[tuple[str, object]]) -> dict[str, np.ndarray]:
    """Arrays in the Keras layout by the engine's names (weights, gradients, optimizer slots) as
    canonical arrays by canonical name: a pair's split parts joined."""
    converted = ((n, conversion.to_canonical(n, np.asarray(a))) for n, a in items)
    if isinstance(conversion, PairConversion):
        return conversion.join(converted)
    return dict(converted)


def engine_names(conversion: Conversion, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Canonical arrays by the engine's names (a pair's split arrays as their parts), still in the
    canonical layout (the inverse of :func:`canonical`'s join)."""
    return conversion.split(arrays) if isinstance(conversion, PairConversion) else arrays

"""Pairing two records' initial arrays: by name where both use the same names (a Keras record
made with a model pair's weight map has the torch script's), else in order (shapes equal, Keras's
layouts converted by kind), else by their values: a converter's port (KerasHub's of a Hugging Face
model) holds the very numbers of the source's arrays in another order, shape and layout (BERT's
attention kernels as (hidden, heads, head_dim), each block's feed-forward layer norm built before
its dense layers), so each array is paired with the one holding the same values (arrays of one
value set, such as zero biases and unit layer-norm scales, in order among themselves). Value pairs
are compared as value sets: their arrangement is not judged."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from dualtrain.audit.read import Recorded


@dataclass(frozen=True)
class Paired:
    """A's array ``a`` and B's ``b``, as compared: ``va`` and ``vb`` are the arrays (pairs by
    name or order) or their sorted values (pairs by value)."""

    a: str
    b: str
    va: np.ndarray
    vb: np.ndarray
    by_values: bool = False


def paired_weights(a: Recorded, b: Recorded) -> list[Paired] | str:
    """A's and B's initial arrays paired, or why they cannot be (computed once for a pair of
    weight sets: the records' copies share them)."""
    key = (id(a.weights_init), id(b.weights_init))
    if key not in a.pairings:  # (the value holds both weight sets: the ids stay theirs)
        a.pairings[key] = (a.weights_init, b.weights_init, _paired(a, b))
    return a.pairings[key][2]


def _paired(a: Recorded, b: Recorded) -> list[Paired] | str:
    wa, wb = a.weights_init, b.weights_init
    na, nb = list(wa), list(wb)
    if set(na) == set(nb):
        nb = na
    why = _in_order(a, b, na, nb)
    if why is None:
        return [Paired(x, y, wa[x], wb[y]) for x, y in zip(na, nb, strict=True)]
    return _by_values(a, b) or f"{why}; nor do they pair by their values"


def _in_order(a: Recorded, b: Recorded, na: list[str], nb: list[str]) -> str | None:
    if len(na) != len(nb):
        return f"A has {len(na)} arrays, B has {len(nb)}"
    for x, y in zip(na, nb, strict=True):
        if a.weights_init[x].shape != b.weights_init[y].shape:
            return (
                f"A's {x} {tuple(a.weights_init[x].shape)} against B's {y} "
                f"{tuple(b.weights_init[y].shape)}"
            )
    return None


def _values(x: np.ndarray) -> np.ndarray:
    return np.sort(np.asarray(x, dtype=np.float64).ravel())


def _by_values(a: Recorded, b: Recorded) -> list[Paired] | None:
    """Each of A's arrays with B's of the same values (None: some array has no such partner)."""
    groups: dict[str, list[str]] = defaultdict(list)
    for y, v in b.weights_init.items():
        groups[hashlib.sha256(_values(v).tobytes()).hexdigest()].append(y)
    out = []
    for x, v in a.weights_init.items():
        mine = groups.get(hashlib.sha256(_values(v).tobytes()).hexdigest())
        if not mine:
            return None
        y = mine.pop(0)
        out.append(Paired(x, y, _values(v), _values(b.weights_init[y]), by_values=True))
    return out if not any(groups.values()) else None

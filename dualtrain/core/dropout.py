"""Dropout masks defined once: a counter-based hash of (seed, global step, sample id, layer,
element).

Neither framework's RNG is involved. Each backend computes the mask in its own graph, with integer
arithmetic only, by calling :func:`keep` with a tiny array namespace (:class:`IntOps`: three
bitwise functions; ``*`` on int64 tensors does the rest), so the masks are bit-identical on torch
and TF. Because the mask of an element depends on its sample's id, not on the replica that holds the
sample or on the world size, a sample gets the same mask whatever the strategy, the world size or a
resume (unlike Keras under tf.distribute, where the mirrored seed generator gives every replica the
same mask).

The hash: every value is kept in [0, 2**32) in int64. ``mix`` is a 32-bit integer finalizer
(xorshift, multiply, xorshift, multiply, xorshift) whose multipliers are odd and below 2**31, so no
product reaches 2**63 (no signed overflow in either framework). Inputs are chained:
``h = mix(mix(mix(mix(SALT ^ seed) ^ step) ^ sample_id) ^ layer)``, then per element
``mix(h ^ element)``. An element is kept when the top 24 bits of that are >= round(rate * 2**24);
kept values are scaled by 1 / (1 - rate) (inverted dropout). ``element`` counts the layer input's
features in canonical (C, H, W) order, whatever the backend's memory layout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

MASK32 = 0xFFFFFFFF
SALT = 0x9E3779B9
M1 = 0x7FEB352D
M2 = 0x5BD1E995
BITS = 24


@dataclass(frozen=True)
class IntOps:
    """The array namespace :func:`keep` needs (int64 tensors)."""

    xor: Callable[[Any, Any], Any]
    shr: Callable[[Any, int], Any]
    and_: Callable[[Any, int], Any]


NUMPY = IntOps(xor=np.bitwise_xor, shr=np.right_shift, and_=np.bitwise_and)


def mix(ops: IntOps, x: Any) -> Any:
    x = ops.xor(x, ops.shr(x, 16))
    x = ops.and_(x * M1, MASK32)
    x = ops.xor(x, ops.shr(x, 15))
    x = ops.and_(x * M2, MASK32)
    return ops.xor(x, ops.shr(x, 16))


def threshold(rate: float) -> int:
    return int(round(rate * (1 << BITS)))


def _seed_hash(seed: int) -> int:
    x = np.int64((SALT ^ seed) & MASK32)
    return int(mix(NUMPY, x))


def keep(
    ops: IntOps, seed: int, step: Any, ids: Any, layer: int, elements: Any, rate: float
) -> Any:
    """Boolean mask (len(ids), len(elements)): True where the element is kept at dropout ``rate``.

    ``step``: int64 scalar tensor (the 1-based global step); ``ids``: int64 vector of sample ids;
    ``elements``: int64 vector of canonical element indices. ``seed`` and ``layer`` are Python
    ints."""
    h = mix(ops, ops.xor(ops.and_(step, MASK32), _seed_hash(seed)))
    h = mix(ops, ops.xor(ops.and_(ids, MASK32), h))
    h = mix(ops, ops.xor(h, layer & MASK32))
    h = mix(ops, ops.xor(h[:, None], ops.and_(elements, MASK32)[None, :]))
    return ops.shr(h, 32 - BITS) >= threshold(rate)


def canonical_elements(shape: tuple[int, ...]) -> np.ndarray:
    """Element indices of a layer input of canonical shape (C, H, W) or (F,), flattened in canonical
    order: 0 .. prod(shape) - 1."""
    return np.arange(int(np.prod(shape)), dtype=np.int64)

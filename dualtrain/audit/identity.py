"""Sample identity for recorded runs: a digest of each input row that both frameworks compute
with exact integer arithmetic (so a torch script and a Keras script name the same sample alike).

Two digests per row, each two 32-bit sums of the row's words times fixed odd multipliers, modulo
2**32 (addition modulo 2**32 is exact and order-free, so any reduction order gives the same):

* ``exact``: of the float32 bit patterns of the row's values (the input as fed, after the script's
  own normalisation);
* ``pattern``: of the row's mask ``value > min(row)`` (the same for any positive affine
  normalisation: ``x/255`` and ``(x/255-0.1307)/0.3081`` of one MNIST image give one pattern).

Equal ``exact`` digests: the same sample fed with the same values. Equal ``pattern`` digests but
different ``exact`` ones: the same sample, normalised differently.
"""

from __future__ import annotations

import numpy as np

MASK32 = 0xFFFFFFFF


def multipliers(width: int) -> np.ndarray:
    """``(width, 2)`` int64 odd multipliers below 2**31, fixed for a row width (both recorders
    build the same ones)."""
    rng = np.random.default_rng(0x5EED + width)
    return (rng.integers(1, 2**30, size=(width, 2), dtype=np.int64) * 2 + 1).astype(np.int64)


def hexes(pairs: np.ndarray) -> list[str]:
    """``(n, 2)`` integer sums -> one 16-hex-digit digest per row."""
    pairs = np.asarray(pairs, dtype=np.int64) & MASK32
    return [f"{int(a):08x}{int(b):08x}" for a, b in pairs]


def _sums(words: np.ndarray) -> np.ndarray:
    mult = multipliers(words.shape[1])
    out = np.zeros((words.shape[0], 2), dtype=np.int64)
    for k in range(2):
        out[:, k] = ((words * mult[:, k]) & MASK32).sum(axis=1) & MASK32
    return out


def row_digests(rows: np.ndarray) -> tuple[list[str], list[str]]:
    """NumPy reference of what both recorders compute: (exact, pattern) digests of each row of
    ``rows`` (first axis: the samples; any dtype, read as float32)."""
    x = np.asarray(rows, dtype=np.float32).reshape(len(rows), -1)
    bits = x.view(np.int32).astype(np.int64) & MASK32
    pattern = (x > x.min(axis=1, keepdims=True)).astype(np.int64)
    return hexes(_sums(bits)), hexes(_sums(pattern))

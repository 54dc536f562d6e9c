"""Sample identity for recorded runs: a digest of each input row that both frameworks compute
exactly (so a torch script and a Keras script name the same sample alike).

Each digest is two sums of the row's 16-bit words times fixed multipliers below 2**16, reduced
modulo 2**32. Every product and partial sum is an integer below 2**53 (rows of at most
``CHUNK / 2`` values per chunk; longer rows are summed chunk by chunk in int64), so one float64
matrix product computes it exactly in any summation order, on any device:

* ``exact``: of the float32 bit patterns of the row's values (the input as fed, after the script's
  own normalisation), each split into its low and high 16 bits;
* ``pattern``: of the row's mask ``value > min(row)`` (the same for any positive affine
  normalisation: ``x/255`` and ``(x/255-0.1307)/0.3081`` of one MNIST image give one pattern).

Equal ``exact`` digests: the same sample fed with the same values. Equal ``pattern`` digests but
different ``exact`` ones: the same sample, normalised differently.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

MASK32 = 0xFFFFFFFF
#: columns per float64 product: CHUNK * 2**16 * 2**16 < 2**53
CHUNK = 2**20


def multipliers(width: int) -> np.ndarray:
    """``(2 * width, 2)`` float64 multipliers in [1, 2**16), fixed for a row width (both
    recorders build the same ones): rows ``[:width]`` weigh the low 16-bit words (and the
    pattern), rows ``[width:]`` the high ones."""
    rng = np.random.default_rng(0x5EED + width)
    return rng.integers(1, 2**16, size=(2 * width, 2)).astype(np.float64)


def hexes(pairs: np.ndarray) -> list[str]:
    """``(n, 2)`` integer sums -> one 16-hex-digit digest per row."""
    pairs = np.asarray(pairs, dtype=np.int64) & MASK32
    return [f"{int(a):08x}{int(b):08x}" for a, b in pairs]


def _dot(words: np.ndarray, mult: np.ndarray) -> np.ndarray:
    out = np.zeros((words.shape[0], 2), dtype=np.int64)
    for lo in range(0, words.shape[1], CHUNK):
        out += (words[:, lo : lo + CHUNK] @ mult[lo : lo + CHUNK]).astype(np.int64)
    return out & MASK32


def row_digests(rows: np.ndarray) -> tuple[list[str], list[str]]:
    """NumPy reference of what both recorders compute: (exact, pattern) digests of each row of
    ``rows`` (first axis: the samples; any dtype, read as float32)."""
    x = np.asarray(rows, dtype=np.float32).reshape(len(rows), -1)
    mult = multipliers(x.shape[1])
    bits = x.view(np.uint32)
    words = np.concatenate([bits & 0xFFFF, bits >> 16], axis=1).astype(np.float64)
    mask = (x > x.min(axis=1, keepdims=True)).astype(np.float64)
    return hexes(_dot(words, mult)), hexes(_dot(mask, mult[: x.shape[1]]))


#: a batch's keys that name its targets or masks, never the input whose rows are digested
TARGET_KEYS = ("label", "labels", "label_ids", "target", "targets", "y")
#: keys that name the input, in this order of preference (Hugging Face's and common names)
INPUT_KEYS = (
    "input_ids",
    "token_ids",
    "pixel_values",
    "input_values",
    "inputs",
    "input",
    "x",
    "image",
    "images",
    "features",
)


def input_key(keys: Iterable[Any]) -> Any:
    """The key of a dict batch whose rows both recorders digest: a known input name (``input_ids``,
    ``pixel_values``, ...), else the first key in sorted order (as Keras flattens a dict) that
    names no target (``labels``) or mask (``attention_mask``), else the first key in sorted order;
    None for no key."""
    named = {str(k): k for k in keys}
    for k in INPUT_KEYS:
        if k in named:
            return named[k]
    rest = sorted(k for k in named if k.lower() not in TARGET_KEYS and "mask" not in k.lower())
    rest = rest or sorted(named)  # every key names a target or mask: the first of them
    return named[rest[0]] if rest else None

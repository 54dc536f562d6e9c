"""Each input row's digests (dualtrain.audit.identity) in TensorFlow, in a replica's train step:
in the graph where the row width is known when traced, else on the host (identity.row_digests,
the NumPy reference the graph's digests equal)."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from dualtrain.audit.identity import CHUNK, MASK32, hexes, input_key, multipliers, row_digests


def input_of(data: Any) -> Any:
    """The input whose rows a step digests: a dict's by dualtrain.audit.identity.input_key (the
    torch recorder's rule: ``image`` of ``{"aux": ..., "image": ...}`` in either key order), a
    tuple's first."""
    x = data[0] if isinstance(data, (tuple, list)) else data
    if isinstance(x, dict):
        x = x[input_key(x.keys())]
    return x[0] if isinstance(x, (tuple, list)) else x


def _dot(words: Any, mult: Any) -> Any:
    """dualtrain.audit.identity's exact sums: float64 products of integers below 2**53."""
    out = None
    for lo in range(0, int(words.shape[1]), CHUNK):
        part = tf.cast(tf.matmul(words[:, lo : lo + CHUNK], mult[lo : lo + CHUNK]), tf.int64)
        out = part if out is None else out + part
    return tf.bitwise.bitwise_and(out, MASK32)


class Digests:
    """A train step's digests: :meth:`traced` in the graph, :meth:`host` in its tf.py_function."""

    def __init__(self) -> None:
        self.mults: dict[int, Any] = {}

    def traced(self, x: Any) -> list[Any]:
        """(exact, pattern) sums where the row width is static; else the rows (as float32) for
        :meth:`host` (a generator's None dimensions, padded text batches)."""
        if not x.shape[1:].is_fully_defined():
            return [tf.cast(x, tf.float32)]
        width = int(np.prod(x.shape[1:]))
        x = tf.cast(tf.reshape(x, (-1, width)), tf.float32)
        if width not in self.mults:
            self.mults[width] = tf.constant(multipliers(width))
        mult = self.mults[width]
        bits = tf.bitwise.bitwise_and(tf.cast(tf.bitcast(x, tf.int32), tf.int64), MASK32)
        low, high = tf.bitwise.bitwise_and(bits, 0xFFFF), tf.bitwise.right_shift(bits, 16)
        words = tf.cast(tf.concat([low, high], axis=1), tf.float64)
        mask = tf.cast(x > tf.reduce_min(x, axis=1, keepdims=True), tf.float64)
        return [_dot(words, mult), _dot(mask, mult[:width])]

    @staticmethod
    def host(*traced: Any) -> tuple[list[str], list[str]]:
        """The (exact, pattern) digests of what :meth:`traced` gave, as eager tensors."""
        if len(traced) == 2:
            return hexes(traced[0].numpy()), hexes(traced[1].numpy())
        x = traced[0].numpy()
        return row_digests(x) if len(x) else ([], [])

"""TensorFlow's float64 ops that are only float32-accurate (dualtrain.core.limits), run exactly in
fp64 runs.

:func:`install` replaces ``tf.nn.gelu`` and ``tf.nn.leaky_relu`` in this process (Keras's gelu and
leaky_relu, its Activation, LeakyReLU and ReLU layers and ``keras.ops`` all call them) by
functions that compute the exact form for float64 inputs and call TensorFlow's own op for any
other dtype, bit for bit. Only fp64 processes install it (the TF worker of an fp64 run, the
locator): the user's code is not touched, and an export holds the user's own layers. Each call
with a float64 input records the name scope it ran in (the Keras layer) and its width, which
:func:`report` gives to summary.json (``exact_ops``) with the measured distance of TensorFlow's
own op from the exact form.
"""
# the eager forward that builds a pair's Keras model (pair.build_keras) runs every layer once, so
# the layers that use an op are known before training starts

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
from keras.src.backend.tensorflow import nn as keras_nn

from .layers import Tensor

ORIGINAL: dict[str, Callable[..., Any]] = {}
#: op -> {name scope: width} of each float64 call since install
_SEEN: dict[str, dict[str, int]] = {}
#: the probe the measured error is taken on: where both ops differ most (|x| up to 6)
_PROBE = np.linspace(-6.0, 6.0, 2401)


def _f64(v: float) -> tf.Tensor:
    return tf.constant(v, tf.float64)  # not tf.cast: a Python float cast goes through float32


def exact_gelu(x: tf.Tensor, approximate: bool = False) -> tf.Tensor:
    """torch's CPU gelu in float64: x * 0.5 * (1 + erf(x * M_SQRT1_2)), or the tanh form
    0.5 * x * (1 + tanh(kBeta * (x + kKappa * x^3)))."""
    if approximate:
        inner = _f64(math.sqrt(2.0 / math.pi)) * (x + _f64(0.044715) * x * x * x)
        return _f64(0.5) * x * (_f64(1.0) + tf.math.tanh(inner))
    return x * _f64(0.5) * (_f64(1.0) + tf.math.erf(x * _f64(math.sqrt(0.5))))


def exact_leaky_relu(x: tf.Tensor, alpha: float = 0.2) -> tf.Tensor:
    """torch's leaky_relu: x where x > 0, else x * negative_slope (gradient alike)."""
    return tf.where(x > 0, x, x * _f64(float(alpha)))


def _record(op: str, x: tf.Tensor) -> None:
    if not tf.executing_eagerly():  # a trace's scopes are made unique (act_1): the eager build's
        return  # forward (build_keras) has them as the model names its layers
    scope = tf.get_current_name_scope() or "(top level)"
    width = int(x.shape[-1]) if x.shape.rank and x.shape[-1] is not None else 0
    _SEEN.setdefault(op, {})[scope] = width


def _gelu(features: Tensor, approximate: bool = False, name: str | None = None) -> tf.Tensor:
    x = tf.convert_to_tensor(features)
    if x.dtype != tf.float64:
        return ORIGINAL["gelu"](features, approximate=approximate, name=name)
    _record("gelu", x)
    return exact_gelu(x, approximate)


def _leaky_relu(features: Tensor, alpha: float = 0.2, name: str | None = None) -> tf.Tensor:
    x = tf.convert_to_tensor(features)
    if x.dtype != tf.float64:
        return ORIGINAL["leaky_relu"](features, alpha=alpha, name=name)
    _record("leaky_relu", x)
    return exact_leaky_relu(x, alpha)


def _attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    bias: Tensor | None,
    mask: Tensor | None,
    is_causal: bool,
    scale: float | None,
) -> Tensor:
    """Keras's TensorFlow dot_product_attention (MultiHeadAttention's) with its scale, a Python
    float, as a float64 constant for float64 inputs (its own tf.cast of the float goes through
    float32)."""
    if query.dtype == tf.float64 and isinstance(scale, float):
        _record("attention_scale", value)
        scale = _f64(scale)
    return ORIGINAL["attention_scale"](query, key, value, bias, mask, is_causal, scale)


_REPLACEMENTS: dict[str, Callable[..., Any]] = {"gelu": _gelu, "leaky_relu": _leaky_relu}


def install() -> None:
    """Replace the ops (once per process)."""
    for op, fn in _REPLACEMENTS.items():
        if op not in ORIGINAL:
            ORIGINAL[op] = getattr(tf.nn, op)
            setattr(tf.nn, op, fn)
    if "attention_scale" not in ORIGINAL:  # a module-level function the backend calls by name
        ORIGINAL["attention_scale"] = keras_nn._dot_product_attention_xla
        keras_nn._dot_product_attention_xla = _attention


def installed() -> bool:
    return bool(ORIGINAL)


def measured_error(op: str) -> float:
    """Max |TensorFlow's own op - the exact form| on the probe, in float64 (both gelu forms;
    leaky_relu at Keras's default slope 0.2)."""
    if op == "attention_scale":  # one head of 8 over 4 positions, the scale 1/sqrt(8)
        q = tf.reshape(tf.constant(_PROBE[:32], tf.float64), (1, 4, 1, 8))
        fn = ORIGINAL.get(op, keras_nn._dot_product_attention_xla)
        a = fn(q, q, q, None, None, False, 1.0 / math.sqrt(8.0))
        b = fn(q, q, q, None, None, False, _f64(1.0 / math.sqrt(8.0)))
        return float(tf.reduce_max(tf.abs(a - b)))
    x = tf.constant(_PROBE, tf.float64)
    original = ORIGINAL.get(op, getattr(tf.nn, op))
    if op == "gelu":
        pairs = [(original(x, approximate=a), exact_gelu(x, a)) for a in (False, True)]
    else:
        pairs = [(original(x, alpha=0.2), exact_leaky_relu(x, 0.2))]
    return max(float(tf.reduce_max(tf.abs(a - b))) for a, b in pairs)


def report() -> list[dict[str, Any]]:
    """summary.json ``exact_ops``: each substituted op the model used, where (Keras name scopes,
    with the width), and how far TensorFlow's own op is from the exact form here."""
    return [
        {
            "op": op,
            "backend": "tf",
            "where": [
                f"{scope} ({width} wide)" if width else scope for scope, width in seen.items()
            ],
            "error": measured_error(op),
        }
        for op, seen in sorted(_SEEN.items())
        if seen
    ]

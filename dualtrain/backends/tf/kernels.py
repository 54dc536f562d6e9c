"""TensorFlow's products in a low precision, for the kernel calibration (dualtrain.core.kernels),
and which implementation runs them on this CPU. Imports TensorFlow when called."""

from __future__ import annotations

from typing import Any

import numpy as np

from dualtrain.backends.tf.envinfo import onednn_enabled
from dualtrain.core import kernels


def product(kind: str, a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
    """The product as a Keras layer under the mixed policy computes it (the inputs in ``dtype``,
    the output too): tf.matmul, and tf.nn.conv2d in NHWC / HWIO."""
    import tensorflow as tf  # lazy: framework

    d = {"bf16": tf.bfloat16, "fp16": tf.float16}[dtype]
    if kind == "matmul":
        out = tf.matmul(tf.cast(a, d), tf.cast(b, d))
        return np.asarray(tf.cast(out, tf.float64).numpy())
    x = tf.cast(np.transpose(a, (0, 2, 3, 1)), d)
    w = tf.cast(np.transpose(b, (2, 3, 1, 0)), d)
    out = tf.nn.conv2d(x, w, strides=1, padding="VALID")
    return np.transpose(tf.cast(out, tf.float64).numpy(), (0, 3, 1, 2))


def _onednn(dtype: str, flags: set[str]) -> bool:
    """Whether TensorFlow hands a ``dtype`` product to oneDNN here: its oneDNN ops on, and the
    CPU one oneDNN supports the dtype on (TensorFlow's IsDataTypeSupportedByOneDNNOnThisCPU,
    tensorflow/core/util/util.cc: bf16 needs AVX-512 or AVX-NE-CONVERT, fp16 AVX512-FP16 or
    AMX-FP16); else Eigen ("oneDNN supports DT_BFLOAT16 only on platforms with AVX-512. Falling
    back to the default Eigen-based implementation")."""
    if not onednn_enabled():
        return False
    if dtype == "bf16":
        return bool({"avx512f", "avx_ne_convert"} & flags)
    return bool({"avx512_fp16", "amx_fp16"} & flags)


def static_facts(flags: set[str]) -> dict[str, Any]:
    """Which implementation runs TensorFlow's low-precision products here (core.kernels)."""
    return kernels.static_facts(flags, lambda dtype: _onednn(dtype, flags), "Eigen")

"""TensorFlow / Keras facts for ``dualtrain env`` and summary.json ``env.tf`` (docs/env.md).

``backend_facts()`` imports TensorFlow when called (not at import: the worker must set its
environment first) and reads the state of this process: in a worker, after ``configure_tf`` (what
the run used: its thread counts, oneDNN choice, determinism); in ``python -m
dualtrain.backends.tf.tools env``, a fresh process's defaults.
"""

from __future__ import annotations

import os
from typing import Any


def onednn_enabled() -> bool | None:
    """TensorFlow's own answer (it reads TF_ENABLE_ONEDNN_OPTS and the platform default)."""
    try:
        from tensorflow.python.util import _pywrap_util_port  # lazy: framework

        return bool(_pywrap_util_port.IsMklEnabled())
    except Exception:  # a private module: absent in some build, say "unknown"
        return None


def _op_determinism() -> bool | None:
    try:
        from tensorflow.python.framework import config  # lazy: framework

        return bool(config.is_op_determinism_enabled())
    except Exception:
        return None


def _gpus(tf: Any) -> list[dict[str, Any]]:
    out = []
    for gpu in tf.config.list_physical_devices("GPU"):
        try:
            d = tf.config.experimental.get_device_details(gpu)
        except Exception:
            d = {}
        cc = d.get("compute_capability")
        out.append(
            {
                "name": d.get("device_name", gpu.name),
                "compute_capability": ".".join(str(x) for x in cc) if cc else None,
            }
        )
    return out


def backend_facts() -> dict[str, Any]:
    """TensorFlow and Keras versions, devices and kernel settings, as this process has them now."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras  # lazy: framework
    import tensorflow as tf  # lazy: framework

    build = dict(tf.sysconfig.get_build_info())
    threading = tf.config.threading
    return {
        "versions": {
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "keras_backend": keras.backend.backend(),
            "cuda_build": build.get("cuda_version") if build.get("is_cuda_build") else None,
            "cudnn_build": build.get("cudnn_version") if build.get("is_cuda_build") else None,
            "rocm_build": bool(build.get("is_rocm_build")),
        },
        "devices": {
            "gpus": _gpus(tf),
        },
        "settings": {
            # TF's oneDNN custom ops (TF_ENABLE_ONEDNN_OPTS; on by default on x86 Linux)
            "onednn_enabled": onednn_enabled(),
            # 0 = TensorFlow chooses (all cores)
            "intra_op_threads": threading.get_intra_op_parallelism_threads(),
            "inter_op_threads": threading.get_inter_op_parallelism_threads(),
            "op_determinism": _op_determinism(),
            "tf32": bool(tf.config.experimental.tensor_float_32_execution_enabled()),
            "xla_jit": tf.config.optimizer.get_jit() or "off",
            "mixed_precision_policy": keras.mixed_precision.global_policy().name,
            "floatx": keras.config.floatx(),
        },
    }

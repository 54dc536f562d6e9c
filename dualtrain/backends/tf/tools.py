"""Inspection tools for the tf backend.

``forward_logits(spec, weights, images_uint8)``: float32 logits of the Keras model (fp32, inference)
loaded with canonical weights. CLI:

    python -m dualtrain.backends.tf.tools forward SPEC_YAML WEIGHTS_NPZ N OUT_NPZ

writes the logits of the first N MNIST test images under key "logits".
"""

from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np

from dualtrain.spec import Experiment
from dualtrain.weights import Weights


def forward_logits(spec: Experiment, weights: Weights, images_uint8: np.ndarray,
                   batch_size: int = 1000) -> np.ndarray:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # as the workers (see worker.configure_tf)
    import tensorflow as tf

    from dualtrain.data import normalize

    from .model import build_model, load_canonical, to_nhwc

    tf.config.experimental.enable_tensor_float_32_execution(False)
    model, named = build_model(spec.model, "float32")
    load_canonical(named, weights)
    x = to_nhwc(normalize(np.asarray(images_uint8, dtype=np.uint8)))
    out = [np.asarray(model(tf.constant(x[i:i + batch_size]), training=False), dtype=np.float32)
           for i in range(0, len(x), batch_size)]
    return np.concatenate(out) if out else np.zeros((0, 10), np.float32)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 5 or args[0] != "forward":
        print("usage: python -m dualtrain.backends.tf.tools forward SPEC_YAML WEIGHTS_NPZ N OUT_NPZ",
              file=sys.stderr)
        return 2
    from dualtrain.data import load_mnist
    from dualtrain.errors import UserError
    from dualtrain.spec import load_spec
    from dualtrain.weights import check_layout, load_weights

    _, spec_path, weights_path, n, out_path = args
    try:
        spec = load_spec(spec_path)
        weights = load_weights(weights_path)
        check_layout(weights, spec.model, source=weights_path)
        n = int(n)
        if n < 1:
            raise UserError(f"N must be >= 1. Received: {n}")
        data = load_mnist(dataclasses.replace(spec.data, test_limit=None))  # the first N of all 10k
        if n > len(data.test_x):
            raise UserError(f"N must be <= {len(data.test_x)} (test set size). Received: {n}")
        logits = forward_logits(spec, weights, data.test_x[:n])
    except (UserError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    np.savez(out_path, logits=logits)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

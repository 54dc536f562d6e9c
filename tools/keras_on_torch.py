"""What holds for one Keras 3 model on the torch backend (KERAS_BACKEND=torch), the question of
issue 19 item 6: measured here, reported in docs/own-models.md.

    KERAS_BACKEND=torch python -m tools.keras_on_torch

Prints, for the installed Keras: the dtype keras.ops.matmul gives two float64 tensors, the
float64 Dense layer's error against NumPy's float64 matmul, whether module.train() switches
BatchNormalization to training, and whether its moving statistics are torch buffers (which DDP
broadcasts) or parameters (which it does not).
"""

from __future__ import annotations

import os
import sys

import numpy as np


def main() -> int:
    if os.environ.get("KERAS_BACKEND") != "torch":
        print("run with KERAS_BACKEND=torch", file=sys.stderr)
        return 2
    import keras  # lazy: framework (KERAS_BACKEND checked first)
    import torch  # lazy: framework

    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    rng = np.random.default_rng(0)
    a = keras.ops.ones((2, 2), dtype="float64")
    print(f"keras {keras.__version__}, torch {torch.__version__}")
    print(f"keras.ops.matmul(float64, float64) -> {keras.ops.matmul(a, a).dtype}")
    x = rng.normal(size=(64, 512))
    dense = keras.layers.Dense(256)
    y = np.asarray(dense(x).detach())
    w, b = (np.asarray(v.value.detach()) for v in (dense.kernel, dense.bias))
    exact = x @ w + b
    err = float(np.abs(y - exact).max() / np.abs(exact).max())
    print(f"float64 Dense (64x512 @ 512x256): relative error vs NumPy float64 {err:.2g}")
    inp = keras.Input((4,))
    bn = keras.layers.BatchNormalization()
    model = keras.Model(inp, bn(inp))
    model.train()
    model(rng.normal(size=(5, 4)))
    moved = bool(np.any(np.asarray(bn.moving_mean.value.detach()) != 0))
    print(f"module.train() then a call: BatchNormalization trains: {moved}")
    buffers = [n for n, _ in model.named_buffers()]
    params = [n for n, p in model.named_parameters() if "moving" in n]
    print(f"moving statistics as torch buffers: {buffers}; as parameters: {params}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

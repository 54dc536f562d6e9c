"""How far apart two frameworks' float32 step-1 losses are for the same weights on the same rows:
the bound behind dualtrain.audit.losses.LOSS_AGREES (the "different loss" finding).

    python -m tools.loss_gap
    KERNELS=avx2 ../shared/tools/under-kernels -- .venv/bin/python -m tools.loss_gap

MLPs of width 128 and 1024 (five weight draws each), 64 and 512 MNIST training rows, torch's
cross_entropy against Keras's SparseCategoricalCrossentropy on the same float32 weights; prints
the largest relative gap (2.1e-7 measured, 1.9e-7 under avx2, 2026-11-29)."""

from __future__ import annotations

import os

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main() -> None:
    import keras  # lazy: framework
    import torch  # lazy: framework

    from dualtrain.core.data.dataset import open_data  # lazy: heavy
    from dualtrain.core.data.splits import TRAIN  # lazy: heavy
    from dualtrain.spec import load_spec  # lazy: heavy

    data = open_data(load_spec(None))
    x = data.inputs(TRAIN, slice(0, 512))[0].astype(np.float32).reshape(512, -1)
    y = data.targets(TRAIN, slice(0, 512)).astype(np.int64)
    rng = np.random.default_rng(0)
    worst = 0.0
    for width in (128, 1024):
        for _ in range(5):
            w1 = (rng.standard_normal((784, width)) / 28).astype(np.float32)
            b1 = (rng.standard_normal(width) * 0.1).astype(np.float32)
            w2 = (rng.standard_normal((width, 10)) / np.sqrt(width)).astype(np.float32)
            b2 = (rng.standard_normal(10) * 0.1).astype(np.float32)
            model = keras.Sequential(
                [
                    keras.Input((784,)),
                    keras.layers.Dense(width, activation="relu"),
                    keras.layers.Dense(10),
                ]
            )
            model.set_weights([w1, b1, w2, b2])
            t = [torch.from_numpy(a) for a in (w1, b1, w2, b2)]
            for n in (64, 512):
                xt, yt = torch.from_numpy(x[:n]), torch.from_numpy(y[:n])
                logits = torch.relu(xt @ t[0] + t[1]) @ t[2] + t[3]
                lt = torch.nn.functional.cross_entropy(logits, yt).item()
                ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
                lk = float(ce(y[:n], model(x[:n])))
                worst = max(worst, abs(lt - lk) / abs(lk))
    print(f"largest relative step-1 loss gap, torch against Keras, float32: {worst:.2e}")


if __name__ == "__main__":
    main()

"""Throughput: dualtrain's TF runner vs plain Keras ``model.fit`` under MirroredStrategy.

    python bench/bench_tf.py [--repeat N] [--epochs E] [--model mlp|cnn] [--same-kernels]

Both sides train the MNIST MLP (784-256-128-10) or, with --model cnn, the CNN preset (conv 32,
max-pool, conv 64, max-pool, dense 128), SGD with momentum, global batch 128, world 2
(MirroredStrategy over two logical CPU devices), fp32, full MNIST in memory, each in its own
subprocess:

* dualtrain: ``dualtrain run --backend tf --config configs/mnist_mlp.yaml --world-size 2`` with
  ``tf.strategy=mirrored``; the figure is summary.json's ``train_samples_per_s`` (all training
  steps, evaluation excluded; the step function is traced while the engine starts, so the trace is
  not in it, but the first execution, with TF's graph optimisation, is).
* Keras: ``model.fit(x, y, batch_size=128)`` on the same model and optimizer settings; the figure is
  (samples - 128) / (time from the end of the first batch to the end of the epoch), measured by a
  callback: Keras's first step (trace, graph optimisation, first execution) is excluded, as are
  evaluation and data-adapter setup.

Prints both throughputs and their ratio (dualtrain / Keras; target >= 1.0). With --repeat N each
side runs N times (alternating) and the median is reported.

``--same-kernels``: Keras fit runs under the environment dualtrain's TF worker sets before
TensorFlow's import (dualtrain.backends.tf.launch.preimport_env): with the spec's determinism on,
oneDNN off, so both sides compute with TensorFlow's Eigen kernels. Without it, fit uses oneDNN's,
which are faster on convolutions; the difference between the two ratios is the kernels' share.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

KERAS_FIT = r"""
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf
epochs, kind = int(sys.argv[1]), sys.argv[2]
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from dualtrain.core.data.dataset import open_data
from dualtrain.core.data.splits import TRAIN
from dualtrain.spec import load_spec

keras.utils.set_random_seed(0)
data = open_data(load_spec(None))
n = data.size(TRAIN)
x = np.ascontiguousarray(data.inputs(TRAIN, slice(0, n))[0].transpose(0, 2, 3, 1))
y = data.targets(TRAIN, slice(0, n)).astype(np.int32)
strategy = tf.distribute.MirroredStrategy(devices=["/cpu:0", "/cpu:1"])
with strategy.scope():
    L = keras.layers
    if kind == "cnn":  # dualtrain's cnn preset (dualtrain/spec/model.py)
        body = [L.Conv2D(32, 3, activation="relu"), L.MaxPooling2D(2),
                L.Conv2D(64, 3, activation="relu"), L.MaxPooling2D(2), L.Flatten(),
                L.Dense(128, activation="relu")]
    else:
        body = [L.Flatten(), L.Dense(256, activation="relu"), L.Dense(128, activation="relu")]
    model = keras.Sequential([keras.Input((28, 28, 1)), *body, L.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


class Clock(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.t0 = None
        self.t1 = None

    def on_train_batch_end(self, batch, logs=None):
        if self.t0 is None:  # after the first step: its trace and graph optimisation excluded
            self.t0 = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.t1 = time.perf_counter()


clock = Clock()
model.fit(x, y, batch_size=128, epochs=epochs, shuffle=True, verbose=0, callbacks=[clock])
print(json.dumps({"samples_per_s": (epochs * len(x) - 128) / (clock.t1 - clock.t0),
                  "seconds": clock.t1 - clock.t0}))
"""


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return e


def run_dualtrain(epochs: int, kind: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [
            sys.executable,
            "-m",
            "dualtrain",
            "run",
            "--backend",
            "tf",
            "--config",
            str(ROOT / "configs" / "mnist_mlp.yaml"),
            "--world-size",
            "2",
            "--set",
            "tf.strategy=mirrored",
            "--set",
            f"train.epochs={epochs}",
            "--set",
            "precision.dtype=fp32",
            "--set",
            "data.batch_size=128",
            "--set",
            f"model.preset={kind}",
            "--out",
            str(out),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=ROOT)
        if proc.returncode != 0:
            sys.exit(f"dualtrain run failed:\n{proc.stdout}\n{proc.stderr}")
        return float(json.loads((out / "summary.json").read_text())["train_samples_per_s"])


def run_keras(epochs: int, kind: str, same_kernels: bool = False) -> float:
    extra = {}
    if same_kernels:
        from dualtrain.backends.tf.launch import preimport_env  # framework-free
        from dualtrain.spec import load_spec

        extra = preimport_env(load_spec(ROOT / "configs" / "mnist_mlp.yaml"))
    proc = subprocess.run(
        [sys.executable, "-c", KERAS_FIT, str(epochs), kind],
        capture_output=True,
        text=True,
        env={**env(), **extra},
        cwd=ROOT,
    )
    if proc.returncode != 0:
        sys.exit(f"keras fit failed:\n{proc.stdout}\n{proc.stderr}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["samples_per_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    ap.add_argument(
        "--same-kernels", action="store_true", help="fit under dualtrain's kernel environment"
    )
    args = ap.parse_args()
    ours, keras_fit = [], []
    for i in range(args.repeat):
        ours.append(run_dualtrain(args.epochs, args.model))
        keras_fit.append(run_keras(args.epochs, args.model, args.same_kernels))
        print(
            f"run {i + 1}: dualtrain tf {ours[-1]:,.0f} samples/s, keras fit {keras_fit[-1]:,.0f} "
            f"samples/s",
            flush=True,
        )
    a, b = statistics.median(ours), statistics.median(keras_fit)
    shown = {
        side: ", ".join(f"{x:,.0f}" for x in runs) for side, runs in (("a", ours), ("b", keras_fit))
    }
    kernels = ", fit on dualtrain's kernels" if args.same_kernels else ""
    where = f"(MirroredStrategy, 2 logical CPUs, {args.model}, batch 128, fp32{kernels})"
    print(f"dualtrain tf runner {where}: {a:,.0f} samples/s (median of {shown['a']})")
    print(f"keras model.fit     {where}: {b:,.0f} samples/s (median of {shown['b']})")
    print(f"ratio dualtrain / keras: {a / b:.2f} (target >= 1.0)")


if __name__ == "__main__":
    main()

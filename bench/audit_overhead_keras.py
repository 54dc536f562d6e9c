"""What the Keras audit recorder costs per step of ``fit`` on the MNIST CNN (examples/audit's Net:
corrected/keras_mnist.py's layers, batch 64 per replica, MirroredStrategy over ``--replicas``
logical CPUs, as examples/audit/keras_mnist.py runs), as a ratio measured within one run.

Two models of the one architecture, both compiled without jit_compile (the recorder turns it off),
are fit in alternating blocks of ``--block`` steps: the plain model, then the recorded one (a new
recorder each block: the recorder is written as its ``fit`` ends). A step's time runs from the
first callback's ``on_train_batch_begin`` to the last one's ``on_train_batch_end``, so the
recorder's own callback work counts; each block's first step (the recorded model's train function
is traced again there) is left out and counted in the one-off cost per ``fit`` instead, with
the record's writing. Reported: the overhead ``recorded / plain - 1`` by the means and the
medians (target: at most 5%) and the one-off cost per recorded ``fit``.

    python bench/audit_overhead_keras.py [--blocks 10] [--block 20] [--replicas 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import dualtrain.audit  # noqa: E402
from dualtrain.core.data import mnist  # noqa: E402
from dualtrain.spec import DataSpec  # noqa: E402


def net() -> tf.keras.Model:
    """examples/audit/corrected/keras_mnist.py's model (the torch script's Net)."""
    return tf.keras.Sequential(
        [
            tf.keras.Input((28, 28, 1)),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.Conv2D(64, 3, activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Dropout(0.25),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dropout(0.5),
            tf.keras.layers.Dense(10),
        ]
    )


class Clock(tf.keras.callbacks.Callback):
    """First in the callback list: each step's start; last: its end."""

    def __init__(self, times: list[float], start: bool, begun: list[float]):
        super().__init__()
        self.times, self.start, self.begun = times, start, begun

    def on_train_batch_begin(self, batch: int, logs: object = None) -> None:
        if self.start:
            self.begun.append(time.perf_counter())

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        if not self.start:
            self.times.append(time.perf_counter() - self.begun[-1])


def unwrap(model: tf.keras.Model) -> None:
    """Take a finished recorder's wrappers off (instance attributes over the class's methods)."""
    for obj, name in ((model, "train_step"), (model.optimizer, "_all_reduce_sum_gradients")):
        if name in vars(obj):
            delattr(obj, name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=10, help="pairs of blocks")
    p.add_argument("--block", type=int, default=20, help="steps per block (the first left out)")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="TF's intra-op threads")
    p.add_argument("--batch", type=int, default=64, help="per replica")
    args = p.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas
    )
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.replicas)])
    tf.keras.utils.set_random_seed(0)
    global_batch = args.batch * args.replicas
    arrays = mnist.read_source(mnist.locate(DataSpec()))
    n = global_batch * args.block
    images = arrays["train_images"][:n, :, :, None].astype(np.float32) / 255.0
    labels = arrays["train_labels"][:n].astype(np.int64)
    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(global_batch).cache()
    models = {}
    with strategy.scope():
        for kind in ("plain", "recorded"):
            models[kind] = net()
            models[kind].compile(
                optimizer=tf.keras.optimizers.Adadelta(learning_rate=1.0),
                loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                jit_compile=False,
            )
    times: dict[str, list[float]] = {"plain": [], "recorded": []}
    walls: dict[str, list[float]] = {"plain": [], "recorded": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(2 * args.blocks):
            kind = "recorded" if i % 2 else "plain"
            model, steps, begun = models[kind], [], []
            callbacks = [Clock(steps, True, begun)]
            if kind == "recorded":
                unwrap(model)
                callbacks.append(dualtrain.audit.keras_recorder(Path(tmp) / str(i), model=model))
            callbacks.append(Clock(steps, False, begun))
            t0 = time.perf_counter()
            model.fit(data, epochs=1, steps_per_epoch=args.block, callbacks=callbacks, verbose=0)
            walls[kind].append(time.perf_counter() - t0 - sum(steps[1:]))
            times[kind] += steps[1:]
    mean_p, mean_r = statistics.fmean(times["plain"]), statistics.fmean(times["recorded"])
    med_p, med_r = statistics.median(times["plain"]), statistics.median(times["recorded"])
    q_p, q_r = statistics.quantiles(times["plain"]), statistics.quantiles(times["recorded"])
    print(
        f"Keras fit, MNIST CNN, MirroredStrategy over {args.replicas} logical CPU(s), batch "
        f"{args.batch} per replica, {args.threads} thread(s), {len(times['plain'])} plain and "
        f"{len(times['recorded'])} recorded steps in one run:\n"
        f"  plain step    {mean_p * 1e3:.2f} ms mean, {med_p * 1e3:.2f} ms median\n"
        f"  recorded step {mean_r * 1e3:.2f} ms mean, {med_r * 1e3:.2f} ms median\n"
        f"  overhead      {mean_r / mean_p - 1:+.1%} of a step by the means, "
        f"{med_r / med_p - 1:+.1%} by the medians; target <= +5%\n"
        f"  quartiles     plain {q_p[0] * 1e3:.1f} / {q_p[2] * 1e3:.1f} ms, recorded "
        f"{q_r[0] * 1e3:.1f} / {q_r[2] * 1e3:.1f} ms\n"
        f"  per fit       the first step and fit's own work: plain "
        f"{statistics.median(walls['plain']) * 1e3:.0f} ms, recorded "
        f"{statistics.median(walls['recorded']) * 1e3:.0f} ms (the train function traced again, "
        f"the record written)"
    )


if __name__ == "__main__":
    main()

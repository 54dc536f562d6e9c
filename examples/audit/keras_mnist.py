"""MNIST with Keras ``fit`` under MirroredStrategy, in the style of the TensorFlow tutorial
"Distributed training with Keras": two logical CPU devices, tf.data (scale, cache, shuffle,
batch), Adam, the tutorial's ``decay`` through LearningRateScheduler.

``--multi-worker N`` runs it as the tutorial "Multi-worker training with Keras" does instead:
MultiWorkerMirroredStrategy, one replica per worker process, N workers on localhost ports (the
script starts them, each with its TF_CONFIG; started with a TF_CONFIG of its own it is one worker
of that cluster), tf.data's auto-shard splitting each global batch over the workers. Keras 3's
``fit`` needs two fixes there (multi_worker.py beside this script; docs/audit.md).

The two lines marked AUDIT are all dualtrain adds. Then ``dualtrain compare`` on this record and
ddp_mnist.py's (see that script's docstring). The flags after ``--seed`` each plant one classic
difference (tests/audit uses them).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from multi_worker import launch_workers, multi_worker_fixes  # noqa: E402  (examples/audit)

import dualtrain.audit  # noqa: E402  # AUDIT
from dualtrain.core.data import mnist  # noqa: E402
from dualtrain.spec import DataSpec  # noqa: E402


def decay(epoch: int) -> float:
    if epoch < 3:
        return 1e-3
    elif epoch < 7:
        return 1e-4
    return 1e-5


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/audit_keras")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--train-size", type=int, default=4000, help="the first N training images")
    p.add_argument("--batch-size", type=int, default=64, help="per replica")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--mixed", action="store_true", help="LossScaleOptimizer")
    p.add_argument("--drop-remainder", action="store_true")
    p.add_argument("--batchnorm", type=float, default=None, help="BatchNormalization momentum")
    p.add_argument("--multi-worker", type=int, default=0, help="N MWMS workers on localhost")
    args = p.parse_args()

    if args.multi_worker and not os.environ.get("TF_CONFIG"):
        return launch_workers(args.multi_worker)
    tf.keras.utils.set_random_seed(args.seed)
    if args.multi_worker:  # the tutorial: one replica per worker, the cluster from TF_CONFIG
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        multi_worker_fixes(strategy)
    else:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas
        )
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.replicas)])
    print(f"Number of devices: {strategy.num_replicas_in_sync}")

    arrays = mnist.read_source(mnist.locate(DataSpec()))  # real MNIST, offline
    images = arrays["train_images"][: args.train_size, :, :, None]
    labels = arrays["train_labels"][: args.train_size].astype(np.int64)
    batch_size = args.batch_size * strategy.num_replicas_in_sync

    def scale(image, label):
        image = tf.cast(image, tf.float32)
        image /= 255
        return image, label

    train_dataset = (
        tf.data.Dataset.from_tensor_slices((images, labels))
        .map(scale)
        .cache()
        .shuffle(10000, seed=args.seed)
        .batch(batch_size, drop_remainder=args.drop_remainder)
    )

    with strategy.scope():
        layers = [
            tf.keras.Input((28, 28, 1)),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.MaxPooling2D(),
        ]
        if args.batchnorm:
            layers.append(tf.keras.layers.BatchNormalization(momentum=args.batchnorm))
        layers += [
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
        model = tf.keras.Sequential(layers)
        optimizer = tf.keras.optimizers.Adam()
        if args.mixed:
            optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
        model.compile(
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            optimizer=optimizer,
            metrics=["accuracy"],
        )

    rec = dualtrain.audit.keras_recorder(args.out, model=model)  # AUDIT
    callbacks = [tf.keras.callbacks.LearningRateScheduler(decay), rec]  # AUDIT: rec
    model.fit(train_dataset, epochs=args.epochs, callbacks=callbacks, verbose=2)


if __name__ == "__main__":
    main()

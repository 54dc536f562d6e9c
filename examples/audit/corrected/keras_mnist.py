"""keras_mnist.py corrected to train as corrected/ddp_mnist.py does (docs/audit.md shows the diff):
the torch script's normalisation, per-epoch permutation and model (its initial weights loaded from
the torch record), Adadelta with torch's options, StepLR's per-epoch decay.

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

import dualtrain.audit  # noqa: E402  # AUDIT
from dualtrain.core.data import mnist  # noqa: E402
from dualtrain.spec import DataSpec  # noqa: E402


def decay(epoch: int) -> float:
    return 1.0 * 0.7**epoch  # StepLR(step_size=1, gamma=0.7), stepped once per epoch


def torch_weights(model: tf.keras.Model, path: str) -> None:
    """The torch run's initial weights (its record's weights_init.npz, torch's layout)."""
    with np.load(path) as f:
        arrays = [f[k] for k in f.files]
    kernels = [w for w in model.weights if w.path.rpartition("/")[2] in ("kernel", "bias")]
    for w, a in zip(kernels, arrays, strict=True):
        if a.ndim == 4:
            a = a.transpose(2, 3, 1, 0)  # OIHW -> HWIO
        elif a.ndim == 2:
            a = a.T  # (out, in) -> (in, out)
        w.assign(a)


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
    p.add_argument("--init-from", default="runs/audit_torch/weights_init.npz")
    p.add_argument("--epsilon", type=float, default=1e-6, help="Adadelta's (Keras's default 1e-7)")
    args = p.parse_args()

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas
    )
    tf.keras.utils.set_random_seed(args.seed)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.replicas)])
    print(f"Number of devices: {strategy.num_replicas_in_sync}")

    arrays = mnist.read_source(mnist.locate(DataSpec()))  # real MNIST, offline
    images = arrays["train_images"][: args.train_size, :, :, None].astype(np.float32) / 255.0
    images = (images - 0.1307) / 0.3081  # the torch script's Normalize((0.1307,), (0.3081,))
    labels = arrays["train_labels"][: args.train_size].astype(np.int64)
    batch_size = args.batch_size * strategy.num_replicas_in_sync
    n, steps = len(images), len(images) // batch_size
    order = np.concatenate(  # the torch script's BlockSampler order, epoch after epoch
        [
            np.random.default_rng(args.seed + e).permutation(n)[: steps * batch_size]
            for e in range(1, args.epochs + 1)
        ]
    )

    train_dataset = (
        tf.data.Dataset.from_tensor_slices(order)
        .map(lambda i: (tf.gather(images, i), tf.gather(labels, i)))
        .batch(batch_size, drop_remainder=True)
    )

    with strategy.scope():
        layers = [  # the torch script's Net
            tf.keras.Input((28, 28, 1)),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.Conv2D(64, 3, activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Dropout(0.25),
            tf.keras.layers.Permute((3, 1, 2)),  # flatten in torch's (C, H, W) order
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dropout(0.5),
            tf.keras.layers.Dense(10),
        ]
        model = tf.keras.Sequential(layers)
        torch_weights(model, args.init_from)
        optimizer = tf.keras.optimizers.Adadelta(learning_rate=1.0, rho=0.9, epsilon=args.epsilon)
        if args.mixed:
            optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
        model.compile(
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            optimizer=optimizer,
            metrics=["accuracy"],
        )

    rec = dualtrain.audit.keras_recorder(args.out, model=model)  # AUDIT
    callbacks = [tf.keras.callbacks.LearningRateScheduler(decay), rec]  # AUDIT: rec
    model.fit(
        train_dataset, epochs=args.epochs, steps_per_epoch=steps, callbacks=callbacks, verbose=2
    )


if __name__ == "__main__":
    main()

"""lit_mnist.py's model ported to Keras 3 and trained with ``fit`` under a MirroredStrategy of 2
CPU replicas, recorded for dualtrain's audit: the same MLP from the Lightning run's initial
weights, Adam with torch's epsilon, cross-entropy of the logits (torch's NLL of log-softmax), and
the rows the Lightning run fed (its DistributedSampler's order, read from its record: each global
batch as replica 0's rows then replica 1's, the blocks MirroredStrategy hands out).

The two lines marked AUDIT are all dualtrain adds (lit_mnist.py's docstring shows the commands).
The flags after ``--seed`` each change one thing a team might (tests/audit uses them).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import dualtrain.audit  # noqa: E402  # AUDIT
from dualtrain.core.data import mnist  # noqa: E402
from dualtrain.spec import DataSpec  # noqa: E402


def lightning_order(record: Path, replicas: int) -> np.ndarray:
    """The Lightning run's rows, step by step: each step's replica 0 rows, then replica 1's."""
    rows = [json.loads(line) for line in (record / "replicas.jsonl").read_text().splitlines()]
    rows.sort(key=lambda r: (r["step"], r["replica"]))
    assert all(r["replica"] < replicas for r in rows)
    return np.concatenate([np.asarray(r["indices"], np.int64) for r in rows])


def torch_weights(model: keras.Model, record: Path) -> None:
    """The Lightning run's initial weights (its record's weights_init.npz, torch's layout)."""
    with np.load(record / "weights_init.npz") as f:
        arrays = [f[k] for k in f.files]
    for w, a in zip(model.weights, arrays, strict=True):
        w.assign(a.T if a.ndim == 2 else a)  # Linear's (out, in) -> Dense's (in, out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/audit_lightning_keras")
    p.add_argument("--torch-record", type=Path, default=Path("runs/audit_lightning"))
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--train-size", type=int, default=2048, help="the first N training images")
    p.add_argument("--batch-size", type=int, default=64, help="per replica")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--epsilon", type=float, default=1e-8, help="Adam's (Keras's default 1e-7)")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--l2", type=float, default=0.0, help="L2 regularizers on every weight")
    p.add_argument(
        "--shuffle", action="store_true", help="each epoch shuffled, not in the run's order"
    )
    args = p.parse_args()

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas
    )
    keras.utils.set_random_seed(args.seed)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.replicas)])

    arrays = mnist.read_source(mnist.locate(DataSpec()))  # real MNIST, offline
    images = arrays["train_images"][: args.train_size].astype(np.float32) / 255.0
    images = (images - 0.1307) / 0.3081  # lit_mnist.py's normalisation
    labels = arrays["train_labels"][: args.train_size].astype(np.int64)
    order = lightning_order(args.torch_record, args.replicas)
    batch_size = args.batch_size * strategy.num_replicas_in_sync
    steps = len(order) // batch_size // args.epochs
    if args.shuffle:  # each epoch's rows in an order of its own
        rng = np.random.default_rng(args.seed)
        order = np.concatenate([rng.permutation(e) for e in np.split(order, args.epochs)])
    dataset = (
        tf.data.Dataset.from_tensor_slices(order)
        .map(lambda i: (tf.gather(images, i)[..., None], tf.gather(labels, i)))
        .batch(batch_size)
    )

    with strategy.scope():
        reg = {"kernel_regularizer": keras.regularizers.L2(args.l2)} if args.l2 else {}
        reg |= {"bias_regularizer": keras.regularizers.L2(args.l2)} if args.l2 else {}
        model = keras.Sequential(
            [
                keras.Input((28, 28, 1)),
                keras.layers.Flatten(),
                keras.layers.Dense(64, activation="relu", **reg),
                keras.layers.Dropout(args.dropout),
                keras.layers.Dense(64, activation="relu", **reg),
                keras.layers.Dropout(args.dropout),
                keras.layers.Dense(10, **reg),
            ]
        )
        torch_weights(model, args.torch_record)
        model.compile(
            optimizer=keras.optimizers.Adam(learning_rate=args.lr, epsilon=args.epsilon),
            loss=keras.losses.CategoricalCrossentropy(
                from_logits=True, label_smoothing=args.label_smoothing
            )
            if args.label_smoothing
            else keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    if args.label_smoothing:
        dataset = dataset.map(lambda x, y: (x, tf.one_hot(y, 10)))

    rec = dualtrain.audit.keras_recorder(args.out, model=model)  # AUDIT
    model.fit(dataset, epochs=args.epochs, steps_per_epoch=steps, callbacks=[rec], verbose=2)


if __name__ == "__main__":
    main()

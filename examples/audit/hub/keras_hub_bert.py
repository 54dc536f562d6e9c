"""hf_bert.py's model as KerasHub's port, trained with Keras ``fit``, recorded for dualtrain's
audit: KerasHub's own Hugging Face converter loads the saved initial model
(``BertBackbone.from_preset`` on the folder, offline), the classifier head takes the Hugging Face
head's weights, and the training follows the Trainer's defaults: AdamW (epsilon 1e-8, no weight
decay), a linear decay of the lr to 0 over the run, the global norm clipped at 1, the rows the
Trainer fed (read from its record by their digests).

The two lines marked AUDIT are all dualtrain adds (hf_bert.py's docstring shows the commands).
The flags after ``--seed`` each change one thing a team might (tests/audit uses them).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import keras_hub  # noqa: E402
import tensorflow as tf  # noqa: E402
from hf_bert import token_task  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

import dualtrain.audit  # noqa: E402  # AUDIT


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/audit_keras_hub")
    p.add_argument("--initial", type=Path, default=Path("runs/audit_hf_initial"))
    p.add_argument("--torch-record", type=Path, default=Path("runs/audit_hf"))
    p.add_argument("--train-size", type=int, default=512)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--epsilon", type=float, default=1e-8, help="AdamW's (Keras's default 1e-7)")
    p.add_argument("--clipnorm", type=float, default=1.0, help="global_clipnorm (0: none)")
    p.add_argument("--constant-lr", action="store_true", help="no linear decay")
    args = p.parse_args()

    keras.utils.set_random_seed(args.seed)
    data = token_task(args.train_size, args.seed)
    order = dualtrain.audit.rows_fed(args.torch_record, data["input_ids"])
    steps = len(order) // args.batch_size // args.epochs
    dataset = (
        tf.data.Dataset.from_tensor_slices(order)
        .map(
            lambda i: (
                {
                    "token_ids": tf.gather(data["input_ids"], i),
                    "segment_ids": tf.zeros([16], tf.int64),
                    "padding_mask": tf.ones([16], tf.bool),
                },
                tf.gather(data["labels"], i),
            )
        )
        .batch(args.batch_size)
    )

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        backbone = keras_hub.models.BertBackbone.from_preset(str(args.initial))
        model = keras_hub.models.BertTextClassifier(
            backbone=backbone, num_classes=3, preprocessor=None
        )
        head = load_file(str(args.initial / "model.safetensors"))
        model.output_dense.set_weights([head["classifier.weight"].T, head["classifier.bias"]])
        total = steps * args.epochs
        lr = (
            args.lr
            if args.constant_lr
            else keras.optimizers.schedules.PolynomialDecay(args.lr, total, 0.0)
        )
        model.compile(
            optimizer=keras.optimizers.AdamW(
                learning_rate=lr,
                weight_decay=0.0,
                epsilon=args.epsilon,
                global_clipnorm=args.clipnorm or None,
            ),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    rec = dualtrain.audit.keras_recorder(args.out, model=model)  # AUDIT
    model.fit(dataset, epochs=args.epochs, steps_per_epoch=steps, callbacks=[rec], verbose=2)


if __name__ == "__main__":
    main()

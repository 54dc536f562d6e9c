"""The Keras recorder's cases on what a model is built from: inputs, layer names, custom
weights, dict inputs, a model compiled again, the dtype policy."""

import json

import keras
import numpy as np
import tensorflow as tf

from dualtrain.audit.identity import row_digests
from dualtrain.errors import UserError
from tests.audit import keras_case_kit as kit


def generator():  # widths unknown when traced: the digests are made on the host; its length
    # unknown: fit begins a third batch, finds the data spent and ends none (no step)
    rng = np.random.default_rng(0)
    batches = [rng.normal(size=(4, n, 3)).astype("float32") for n in (5, 7)]
    data = tf.data.Dataset.from_generator(
        lambda: ((b, np.zeros((4, 2), "float32")) for b in batches),
        output_signature=(tf.TensorSpec((None, None, 3)), tf.TensorSpec((None, 2))),
    )
    with kit.SCOPE():
        m = keras.Sequential(
            [keras.Input((None, 3)), keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2)]
        )
        m.compile(optimizer="sgd", loss="mse")
    m.fit(data, callbacks=[kit.recorder("gen", m)], verbose=0)
    rows, steps = kit.lines("gen", "replicas.jsonl"), kit.lines("gen", "metrics.jsonl")
    return [len(rows), len(steps)] + [
        (r["exact"], r["pattern"]) == row_digests(b) for r, b in zip(rows, batches, strict=False)
    ]


def towers():  # Keras 3 names both towers' first layer fc1/kernel
    def tower(name):
        inp = keras.Input((3,))
        h = keras.layers.Dense(4, name="fc1")(inp)
        return keras.Model(inp, keras.layers.Dense(2, name="fc2")(h), name=name)

    with kit.SCOPE():
        img = keras.Input((6,))
        left, right = tower("left"), tower("right")
        cat = keras.layers.Concatenate()([left(img[:, :3]), right(img[:, 3:])])
        m = keras.Model(img, keras.layers.Dense(1, name="head")(cat))
        m.compile(optimizer="sgd", loss="mse")
    kernels = {t: m.get_layer(t).get_layer("fc1").kernel.numpy() for t in ("left", "right")}
    m.fit(
        np.ones((4, 6), "float32"),
        np.ones((4, 1), "float32"),
        callbacks=[kit.recorder("tw", m)],
        verbose=0,
    )
    w = kit.weights("tw")
    same = [np.array_equal(w[t + ".fc1.weight"], kernels[t].T) for t in ("left", "right")]
    # a map names variables by path: fc1/kernel twice
    with open(kit.OUT + "/towers.yaml", "w") as f:
        f.write("- {torch: fc.weight, keras: fc1/kernel}\n")
    try:
        kit.recorder("twm", m, weight_map=kit.OUT + "/towers.yaml")
        said = "no error"
    except UserError as e:
        said = str(e)
    return [len(w.files), len(m.weights), *same, "|" + said]


def custom():  # add_weight names of its own; BatchNorm's statistics; no Dropout seed state
    class Scale(keras.layers.Layer):
        def build(self, shape):
            self.w = self.add_weight(shape=(shape[-1],), initializer="ones", name="w")
            self.s = self.add_weight(shape=(), initializer="ones", name="s", trainable=False)

        def call(self, x):
            return x * self.w * self.s

    with kit.SCOPE():
        m = keras.Sequential(
            [
                keras.Input((3,)),
                Scale(name="scale"),
                keras.layers.BatchNormalization(name="bn", synchronized=True),
                keras.layers.Dropout(0.5),
                keras.layers.Dense(2, name="fc"),
            ]
        )
        m.compile(optimizer="sgd", loss="mse")
    m.fit(
        np.ones((4, 3), "float32"),
        np.ones((4, 2), "float32"),
        callbacks=[kit.recorder("cu", m)],
        verbose=0,
    )
    w = kit.weights("cu")
    (bn,) = json.load(open(f"{kit.OUT}/cu/audit.json"))["config"]["batchnorm"]
    return [",".join(sorted(w.files)), w["scale.w"].shape == (3,), bn["synchronized"]]


def dict_order():  # the input is the same key ("image") whichever order the dict was built in
    rng = np.random.default_rng(1)
    image = rng.normal(size=(4, 5)).astype("float32")
    aux = rng.normal(size=(4, 2)).astype("float32")
    with kit.SCOPE():
        i, a = keras.Input((5,), name="image"), keras.Input((2,), name="aux")
        out = keras.layers.Dense(1)(keras.layers.Concatenate()([i, a]))
        m = keras.Model({"image": i, "aux": a}, out)
        m.compile(optimizer="sgd", loss="mse")
    got = []
    for name, x in (("d1", {"image": image, "aux": aux}), ("d2", {"aux": aux, "image": image})):
        data = tf.data.Dataset.from_tensor_slices((x, np.zeros((4, 1), "float32"))).batch(4)
        m.fit(data, callbacks=[kit.recorder(name, m)], verbose=0)
        got.append(kit.lines(name, "replicas.jsonl")[0]["exact"])
    return [got[0] == got[1], got[0] == row_digests(image)[0]]


def recompiled(name, jit):  # the recorder made, then compiled again: the new optimizer's norm
    with kit.SCOPE():
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        m.compile(optimizer="sgd", loss="mse")
    rec = kit.recorder(name, m)
    with kit.SCOPE():
        m.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse", jit_compile=jit)
    m.fit(
        np.ones((8, 3), "float32"),
        np.ones((8, 2), "float32"),
        batch_size=4,
        callbacks=[rec],
        verbose=0,
    )
    norms = [s["grad_norm"] for s in kit.lines(name, "metrics.jsonl")]
    return [
        len(norms),
        all(isinstance(n, float) and np.isfinite(n) and n > 0 for n in norms),
        "_all_reduce_sum_gradients" in vars(m.optimizer),
        m.jit_compile,
    ]


def precision():  # the dtype policy the model computes in
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with kit.SCOPE():
            m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
            m.compile(optimizer="sgd", loss="mse")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    m.fit(
        np.ones((4, 3), "float32"),
        np.ones((4, 2), "float32"),
        callbacks=[kit.recorder("pr", m)],
        verbose=0,
    )
    return [json.dumps(json.load(open(kit.OUT + "/pr/audit.json"))["config"]["precision"])]


CASES = [
    ("generator", generator),
    ("towers", towers),
    ("custom", custom),
    ("dict", dict_order),
    ("recompiled", lambda: recompiled("rc", False)),
    ("xla", lambda: recompiled("xla", True)),
    ("precision", precision),
]

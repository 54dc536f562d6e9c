"""The Keras recorder's cases on how fit runs: errors before its callbacks, callbacks beside the
recorder, two fits, weight decay's exclusions, the data's split, lr callbacks, early stopping, a
loop of the script's own."""

import json
import os

import keras
import numpy as np
import tensorflow as tf

from dualtrain.errors import UserError
from tests.audit import keras_case_kit as kit


def early_errors():  # fit fails before any callback; an uncompiled model
    with kit.SCOPE():
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        m.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensor_slices((np.ones((4, 3)), np.ones((4, 2)))).batch(2)
    rec = kit.recorder("ee", m)  # made before the call: fit's wrapper sees the call fail
    try:
        m.fit(data, validation_split=0.5, callbacks=[rec], verbose=0)
    except ValueError:
        pass
    state, wrapped = os.path.exists(kit.OUT + "/ee"), "fit" in vars(m)
    with kit.SCOPE():
        bare = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    try:
        kit.recorder("un", bare)
        said = "no error"
    except UserError as e:
        said = str(e)
    kit.recorder("after", m)  # the process may still record
    return [state, wrapped, os.path.exists(kit.OUT + "/un"), "|" + said]


def lr_late():  # a callback after the recorder sets the lr at each batch's start (a warmup)
    with kit.SCOPE():
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        m.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")

    class Warmup(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.model.optimizer.learning_rate = 0.1 * (batch + 1)

    m.fit(
        np.ones((12, 3), "float32"),
        np.ones((12, 2), "float32"),
        batch_size=4,
        callbacks=[kit.recorder("lr", m), Warmup()],
        verbose=0,
    )
    return [round(s["lr"], 6) for s in kit.lines("lr", "metrics.jsonl")]


def listed_twice():  # callbacks=[rec, rec]: the first listing records, the second does nothing
    with kit.SCOPE():
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        m.compile(optimizer="sgd", loss="mse")
    rec = kit.recorder("tw2", m)
    m.fit(
        np.ones((8, 3), "float32"),
        np.ones((8, 2), "float32"),
        batch_size=4,
        callbacks=[rec, rec],
        verbose=0,
    )
    state = json.load(open(kit.OUT + "/tw2/audit.json"))["state"]
    return [state, len(kit.lines("tw2", "metrics.jsonl")), len(kit.lines("tw2", "replicas.jsonl"))]


def two_fits():  # a warm-up fit the recorder is not given, then its fit, then a second fit
    with kit.SCOPE():
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        m.compile(optimizer="sgd", loss="mse")
    rec = kit.recorder("two", m)
    x, y = np.ones((8, 3), "float32"), np.ones((8, 2), "float32")
    m.fit(x, y, batch_size=4, verbose=0)  # not recorded: no rows, the train step as built
    m.fit(x, y, batch_size=4, callbacks=[rec], verbose=0)
    steps, rows = kit.lines("two", "metrics.jsonl"), kit.lines("two", "replicas.jsonl")
    out = [len(steps), sorted({r["step"] for r in rows}), all(s["grad_norm"] > 0 for s in steps)]
    try:
        m.fit(x, y, batch_size=4, callbacks=[rec], verbose=0)
        return out + ["no error"]
    except UserError as e:
        return out + [str(e).splitlines()[0].replace(" ", "_")]


def no_decay():  # AdamW's exclude_from_weight_decay (not in its get_config): the names it skips
    with kit.SCOPE():
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="fc")])
        opt = keras.optimizers.AdamW(weight_decay=0.1, use_ema=True)
        opt.exclude_from_weight_decay(var_names=["bias"])
        m.compile(optimizer=opt, loss="mse")
    m.fit(
        np.ones((8, 3), "float32"),
        np.ones((8, 2), "float32"),
        batch_size=4,
        callbacks=[kit.recorder("nd", m)],
        verbose=0,
    )
    cfg = json.load(open(f"{kit.OUT}/nd/audit.json"))["config"]["optimizer"]
    return [cfg["no_decay"], cfg["use_ema"]]


def restored():  # a callback after the recorder restores weights in on_train_begin (as
    # BackupAndRestore does when it resumes): the initial weights are those the first step uses
    with kit.SCOPE():
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        m.compile(optimizer="sgd", loss="mse")
    saved = [np.full(w.shape, 0.25, "float32") for w in m.get_weights()]

    class Restore(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.model.set_weights(saved)

    m.fit(
        np.ones((8, 3), "float32"),
        np.ones((8, 2), "float32"),
        batch_size=4,
        callbacks=[kit.recorder("res", m), Restore()],
        verbose=0,
    )
    init = kit.weights("res")
    return [len(init.files), all(bool(np.all(init[k] == 0.25)) for k in init.files)]


def data_split():  # what fit reads, as far as it says how workers split it
    out = []
    for name, policy in (("ds", "FILE"), ("arr", None)):
        with kit.SCOPE():
            m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
            m.compile(optimizer="sgd", loss="mse")
        x, y = np.ones((8, 3), "float32"), np.ones((8, 2), "float32")
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
        if policy:
            opts = tf.data.Options()
            policy = tf.data.experimental.AutoShardPolicy.FILE
            opts.experimental_distribute.auto_shard_policy = policy
            m.fit(data.with_options(opts), callbacks=[kit.recorder(name, m)], verbose=0)
        else:
            m.fit(x, y, batch_size=4, callbacks=[kit.recorder(name, m)], verbose=0)
        cfg = json.load(open(f"{kit.OUT}/{name}/audit.json"))["config"]["data"]
        out.append(json.dumps(cfg, sort_keys=True).replace(" ", ""))
    return out


def frozen_layer():  # a frozen layer's kernel and bias; a Normalization's statistics are not
    with kit.SCOPE():
        norm = keras.layers.Normalization(mean=0.0, variance=1.0)
        body = keras.layers.Dense(4, name="body")
        m = keras.Sequential([keras.Input((3,)), norm, body, keras.layers.Dense(2, name="head")])
        body.trainable = False
        m.compile(optimizer="sgd", loss="mse")
    m.fit(
        np.ones((8, 3), "float32"),
        np.ones((8, 2), "float32"),
        batch_size=4,
        callbacks=[kit.recorder("frz", m)],
        verbose=0,
    )
    cfg = json.load(open(f"{kit.OUT}/frz/audit.json"))["config"]["frozen"]
    return [json.dumps(cfg, sort_keys=True).replace(" ", "")]


def lr_callbacks():  # fit's lr callbacks and its own shuffle of arrays, read from fit's frame
    with kit.SCOPE():
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="fc")])
        m.compile(optimizer="sgd", loss="mse")
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.2, patience=3)
    m.fit(
        np.ones((8, 3), "float32"),
        np.ones((8, 2), "float32"),
        batch_size=4,
        shuffle=False,
        callbacks=[kit.recorder("lrc", m), plateau],
        verbose=0,
    )
    cfg = json.load(open(f"{kit.OUT}/lrc/audit.json"))["config"]
    (cb,) = cfg["lr_callbacks"]
    return [cb["type"], cb["patience"], cb["factor"], cb["monitor"], cfg["data"]["fit_shuffle"]]


def early_stop():  # an EarlyStopping listed after the recorder restores its best weights in its
    # own on_train_end, after the recorder's: the record's final weights are those fit ends with
    with kit.SCOPE():
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="fc")])
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    stop = keras.callbacks.EarlyStopping(
        monitor="loss", patience=1, min_delta=1e9, restore_best_weights=True
    )  # epoch 2 is no better
    rng = np.random.default_rng(0)
    m.fit(
        rng.normal(size=(8, 3)).astype("float32"),
        np.ones((8, 2), "float32"),
        batch_size=4,
        epochs=4,
        callbacks=[kit.recorder("stop", m), stop],
        verbose=0,
    )
    cfg = json.load(open(f"{kit.OUT}/stop/audit.json"))["config"]["early_stopping"]
    final = np.load(f"{kit.OUT}/stop/weights_final.npz")["fc.weight"]
    moved = not np.array_equal(final, kit.weights("stop")["fc.weight"])
    return [
        cfg["stopped_epoch"],
        cfg["restore_best_weights"],
        moved,
        np.array_equal(final, m.get_layer("fc").kernel.numpy().T),
    ]


def own_loop():  # the callbacks called by a loop of the script's own, not fit: no row recorded
    with kit.SCOPE():
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="fc")])
        m.compile(optimizer="sgd", loss="mse")
    rec = kit.recorder("own", m)
    rec.set_model(m)
    rec.on_train_begin()
    for i in range(2):
        rec.on_train_batch_begin(i)
        rec.on_train_batch_end(i)
    try:
        rec.on_train_end()
    except UserError as e:
        state = json.load(open(f"{kit.OUT}/own/audit.json"))["state"]
        return ["UserError", str(e).split(":")[0], state]
    return ["no error"]


CASES = [
    ("early", early_errors),
    ("lr", lr_late),
    ("twice", listed_twice),
    ("fits", two_fits),
    ("decay", no_decay),
    ("restored", restored),
    ("data", data_split),
    ("frozen", frozen_layer),
    ("lrcb", lr_callbacks),
    ("stop", early_stop),
    ("own", own_loop),
]

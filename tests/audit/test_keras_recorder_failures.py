"""A Keras recorder that fails inside fit never stops the training (issue 48 item 5): each call
the recorder makes into Keras, TensorFlow or its own record, failing in turn in a real fit under a
MirroredStrategy of 2 replicas, is said once on stderr at the place it failed; the fit trains every
step all the same, the folder is refused by compare (never read as a record), and the process may
start another recorder. A misuse the recorder names (a UserError) is still raised."""

from __future__ import annotations

import json

import pytest

from testkit.tf_runs import run_python

#: (the recorder's call planted to fail, which of its calls fails, where the recorder says it
#: stopped): the callback's hooks, the wrappers traced into fit's train function (failing as
#: traced), and the host functions those call each step
PLANTS = [
    ("dualtrain.backends.tf.audit.fit_config", 1, "on_train_begin"),
    ("dualtrain.backends.tf.audit.canonical_weights", 1, "on_train_batch_begin"),
    ("dualtrain.backends.tf.audit.KerasRecorder._iterations", 3, "on_train_batch_end"),
    ("dualtrain.backends.tf.audit_watch.Digests.traced", 1, "the train step"),
    ("tensorflow.linalg.global_norm", 1, "the gradient all-reduce"),
    ("dualtrain.backends.tf.audit_digests.Digests.host", 4, "a replica's rows"),
    ("dualtrain.backends.tf.audit.KerasRecorder._norm", 2, "the gradient norm"),
    ("dualtrain.backends.tf.audit.final_weights", 1, "on_train_end"),
    ("dualtrain.audit.record.finish", 1, "on_train_end"),
]

SCRIPT = """
import contextlib, importlib, io, json, sys
import keras, numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import dualtrain.audit as audit
from dualtrain.backends.tf import audit as recorder_module  # noqa: F401  (the planted modules)

def planted(target, nth):
    module_name, _, attr = target.rpartition(".")
    try:
        owner = importlib.import_module(module_name)
    except ModuleNotFoundError:  # a class's method: module.Class.method
        module_name, _, cls = module_name.rpartition(".")
        owner = getattr(importlib.import_module(module_name), cls)
    real, calls = getattr(owner, attr), [0]
    raw = vars(owner)[attr]  # (a class's staticmethod put back as one)
    def fail(*args, **kwargs):
        calls[0] += 1
        if calls[0] == nth:
            raise RuntimeError(f"planted in {attr}")
        return real(*args, **kwargs)
    setattr(owner, attr, staticmethod(fail) if isinstance(raw, staticmethod) else fail)
    return lambda: setattr(owner, attr, raw)

x = np.random.default_rng(0).normal(size=(24, 3)).astype("float32")
y = np.random.default_rng(1).normal(size=(24, 2)).astype("float32")
for i, (target, nth) in enumerate(PLANTS):
    with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = model.layers[0].kernel.numpy().copy()
    rec = audit.keras_recorder(f"{OUT}/r{i}", model=model)
    undo = planted(target, nth)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, callbacks=[rec],
                                verbose=0)
        trained = (len(history.history["loss"]), int(model.optimizer.iterations.numpy()),
                   not np.array_equal(model.layers[0].kernel.numpy(), before))
        again = audit.keras_recorder(f"{OUT}/again{i}", model=model)  # the process is free
        again.close()
        print("RESULT", json.dumps({"target": target, "trained": trained, "err": err.getvalue()}))
    except BaseException as e:
        print("RESULT", json.dumps({"target": target, "raised": f"{type(e).__name__}: {e}"}))
    finally:
        undo()
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("failing")
    plants = [(target, nth) for target, nth, _ in PLANTS]
    code = f"OUT = {str(out)!r}\nPLANTS = {plants!r}\n" + SCRIPT
    proc = run_python("-c", code, timeout=300)
    found = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[len("RESULT ") :])
            found[r["target"]] = r
    assert len(found) == len(PLANTS), proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, found


@pytest.mark.parametrize(("target", "nth", "where"), PLANTS, ids=[p[0] for p in PLANTS])
def test_a_failing_keras_recorder_never_stops_the_fit(results, target, nth, where):
    out, found = results
    i = [p[0] for p in PLANTS].index(target)
    r = found[target]
    assert "raised" not in r, r
    assert r["trained"] == [2, 6, True]  # both epochs, every step, the weights moved
    line = f"dualtrain audit: the recorder stopped at {where} and records nothing more"
    assert r["err"].count("dualtrain audit: the recorder stopped") == 1, r["err"]
    assert line in r["err"], r["err"]
    assert f"RuntimeError: planted in {target.rpartition('.')[2]}" in r["err"], r["err"]
    meta = out / f"r{i}" / "audit.json"  # (no folder where the recorder never began writing)
    assert not meta.exists() or json.loads(meta.read_text())["state"] == "failed"

"""The Keras recorder's one-line errors for a recorder used wrongly (in a child process: a model
under no strategy, two recorders, steps_per_execution), its row digests against NumPy's, and a
LossScaleOptimizer's skipped step, each replica's own loss, a failed fit."""

from __future__ import annotations

from testkit.tf_runs import run_python

SCRIPT = """
import keras, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import dualtrain.audit as audit
from dualtrain.errors import UserError
def say(fn):
    try:
        fn()
        print("no error")
    except UserError as e:
        print("UserError:", e)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
model.compile(optimizer="sgd", loss="mse")
say(lambda: audit.keras_recorder(OUT + "/a", model=model))
with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    m.compile(optimizer="sgd", loss="mse", steps_per_execution=2)
rec = audit.keras_recorder(OUT + "/b", model=m)
say(lambda: audit.keras_recorder(OUT + "/c", model=m))
say(lambda: m.fit(tf.zeros((4, 3)), tf.zeros((4, 2)), callbacks=[rec], verbose=0))
import json, os, numpy as np
from dualtrain.audit.identity import row_digests
with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
    m = keras.Sequential([keras.Input((2, 3)), keras.layers.Flatten(), keras.layers.Dense(2)])
    m.compile(optimizer="sgd", loss="mse")
x = np.random.default_rng(0).normal(size=(8, 2, 3)).astype("float32")
rec = audit.keras_recorder(OUT + "/d", model=m)
data = tf.data.Dataset.from_tensor_slices((x, np.zeros((8, 2), "float32"))).batch(4)
m.fit(data, callbacks=[rec], verbose=0)
rows = [json.loads(line) for line in open(OUT + "/d/replicas.jsonl")]
exact, pattern = row_digests(x[4:])
print("digests", rows[1]["exact"] == exact, rows[1]["pattern"] == pattern)
with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    calls = tf.Variable(0, trainable=False)
    def loss(y, p):  # an overflow at the second step
        calls.assign_add(1)
        return tf.reduce_mean((y - p) ** 2) * tf.where(calls == 2, np.inf, 1.0)
    m.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)), loss=loss)
rec = audit.keras_recorder(OUT + "/e", model=m)
x = np.ones((16, 3), "float32")
m.fit(x, x[:, :2], batch_size=4, callbacks=[rec], verbose=0, shuffle=False)
steps = [json.loads(line) for line in open(OUT + "/e/metrics.jsonl")]
print("scale", [s["loss_scale"] for s in steps], [s["skipped"] for s in steps])
with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():  # a model pair's record: its weight map
    m = keras.Sequential([keras.Input((2, 2, 3)), keras.layers.Flatten(), keras.layers.Dense(2)])
    m.compile(optimizer="sgd", loss="mse")
kernel, bias = m.layers[-1].kernel, m.layers[-1].bias
with open(OUT + "/bad.yaml", "w") as f:
    f.write(f"- {{torch: fc.weight, keras: {kernel.path}_typo}}")
with open(OUT + "/map.yaml", "w") as f:
    f.write(f"- {{torch: fc.weight, keras: {kernel.path}, transform: flatten_chw, "
            f"chw: [3, 2, 2]}}\\n- {{torch: fc.bias, keras: {bias.path}}}\\n")
say(lambda: audit.keras_recorder(OUT + "/f", model=m, weight_map=OUT + "/bad.yaml"))
k0 = kernel.numpy()
rec = audit.keras_recorder(OUT + "/g", model=m, weight_map=OUT + "/map.yaml")
m.fit(np.ones((4, 2, 2, 3), "float32"), np.ones((4, 2), "float32"), callbacks=[rec], verbose=0)
w = np.load(OUT + "/g/weights_init.npz")
chw = k0.reshape(2, 2, 3, 2).transpose(3, 2, 0, 1).reshape(2, 12)  # torch's (out, C*H*W)
print("mapped", sorted(w.files), np.array_equal(w["fc.weight"], chw))
with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():  # each replica's own loss
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    m.compile(optimizer="sgd", loss="mse")
x = np.random.default_rng(1).normal(size=(8, 3)).astype("float32")
kernel, bias = (v.numpy() for v in m.weights)
rec = audit.keras_recorder(OUT + "/h", model=m)
m.fit(x, np.zeros((8, 2), "float32"), batch_size=8, shuffle=False, callbacks=[rec], verbose=0)
rows = [json.loads(line) for line in open(OUT + "/h/replicas.jsonl")]
halves = [x[:4], x[4:]]
mine = [next(h for h in halves if row_digests(h)[0] == r["exact"]) for r in rows]
want = [float(np.mean((h @ kernel + bias) ** 2)) for h in mine]  # MSE against zeros
step = json.loads(open(OUT + "/h/metrics.jsonl").readline())["loss"]
print("replica losses", [r["replica"] for r in rows], np.allclose([r["loss"] for r in rows], want,
      rtol=1e-6), want[0] != want[1], np.isclose(step, sum(want) / 2, rtol=1e-6))
with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():  # a fit that fails: no callback says so
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    m.compile(optimizer="sgd", loss="mse")
jit = m.jit_compile
rec = audit.keras_recorder(OUT + "/i", model=m)
class Boom(keras.callbacks.Callback):  # the script's own error at the first step's end
    def on_train_batch_end(self, batch, logs=None):
        raise ValueError("boom")
try:
    m.fit(np.ones((4, 3), "float32"), np.ones((4, 2), "float32"), callbacks=[rec, Boom()],
          verbose=0)
except ValueError:
    pass
state = json.load(open(OUT + "/i/audit.json"))["state"]
rec = audit.keras_recorder(OUT + "/k", model=m)  # a fit failing before it starts: no folder
try:
    data = tf.data.Dataset.from_tensor_slices((np.ones((4, 3)), np.ones((4, 2)))).batch(2)
    m.fit(data, validation_split=0.5, callbacks=[rec], verbose=0)  # fit refuses the split
except ValueError:
    pass
state += " " + str(os.path.exists(OUT + "/k"))
again = audit.keras_recorder(OUT + "/j", model=m)  # the process may record again
m.fit(np.ones((4, 3), "float32"), np.ones((4, 2), "float32"), callbacks=[again], verbose=0)
print("after a failed fit", state, json.load(open(OUT + "/j/audit.json"))["state"],
      "train_step" in vars(m), m.jit_compile == jit)
class Warmup(keras.optimizers.schedules.LearningRateSchedule):  # no get_config: fit trains fine
    def __call__(self, step):
        return 0.1 * tf.minimum(1.0, tf.cast(step + 1, tf.float32) / 3.0)
with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    m.compile(optimizer=keras.optimizers.SGD(Warmup(), momentum=0.5), loss="mse")
rec = audit.keras_recorder(OUT + "/l", model=m)
m.fit(np.ones((16, 3), "float32"), np.ones((16, 2), "float32"), batch_size=4, callbacks=[rec],
      verbose=0)
config = json.load(open(OUT + "/l/audit.json"))["config"]
opt = config["optimizer"]
lrs = [round(json.loads(line)["lr"], 6) for line in open(OUT + "/l/metrics.jsonl")]
kept = isinstance(m.optimizer._learning_rate, Warmup)
print("schedule", opt["learning_rate"], opt["momentum"], lrs, kept)
with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():  # the layers drawing random numbers
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dropout(0.5, name="drop"),
                          keras.layers.GaussianNoise(0.1, name="noise"), keras.layers.Dense(2)])
    m.compile(optimizer="sgd", loss="mse")
rec = audit.keras_recorder(OUT + "/m", model=m)
m.fit(np.ones((4, 3), "float32"), np.ones((4, 2), "float32"), callbacks=[rec], verbose=0)
random = json.load(open(OUT + "/m/audit.json"))["config"]["random_layers"]
print("random layers", config["random_layers"], random)
with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():  # what fit's arguments add to the loss
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    m.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
rec = audit.keras_recorder(OUT + "/n", model=m)
m.fit(np.ones((4, 3), "float32"), np.array([0, 1, 0, 1]), class_weight={0: 1.0, 1: 3.0},
      callbacks=[rec], verbose=0)
terms = json.load(open(OUT + "/n/audit.json"))["config"]["loss_terms"]
print("loss terms", terms["class_weight"], terms["sample_weight"], terms["loss"]["from_logits"])
class Sparse(keras.layers.Layer):  # a loss term of its own, added in call
    def call(self, x):
        self.add_loss(0.01 * tf.reduce_sum(tf.abs(x)))
        return x
with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():  # add_loss, an activity regularizer,
    i = keras.Input((3,))  # loss_weights over two outputs
    h = Sparse(name="act")(keras.layers.Dense(4, activity_regularizer="l2", name="reg")(i))
    m = keras.Model(i, [keras.layers.Dense(2, name="a")(h), keras.layers.Dense(1, name="b")(h)])
    m.compile(optimizer="sgd", loss=["mse", "mse"], loss_weights=[1.0, 0.5])
rec = audit.keras_recorder(OUT + "/o", model=m)
m.fit(np.ones((4, 3), "float32"), [np.ones((4, 2), "float32"), np.ones((4, 1), "float32")],
      callbacks=[rec], verbose=0)
terms = json.load(open(OUT + "/o/audit.json"))["config"]["loss_terms"]
with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():  # sample weights the dataset yields
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    m.compile(optimizer="sgd", loss="mse")
rec = audit.keras_recorder(OUT + "/p", model=m)
ones = np.ones((4, 3), "float32")
weighted = tf.data.Dataset.from_tensor_slices((ones, ones[:, :2], np.arange(4.0))).batch(2)
m.fit(weighted, callbacks=[rec], verbose=0)
weighted_terms = json.load(open(OUT + "/p/audit.json"))["config"]["loss_terms"]
print("dataset weights", weighted_terms["sample_weight"])
print("add_loss", terms["add_loss"], terms["loss_weights"],
      [r["kind"] for r in terms["regularizers"]], keras.layers.Layer.add_loss.__qualname__)
"""


def test_keras_recorder_misuse_is_one_line(tmp_path):
    proc = run_python("-c", f"OUT = {str(tmp_path)!r}\n" + SCRIPT, timeout=180)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("UserError", "no "))]
    assert len(lines) == 4, proc.stdout + proc.stderr[-2000:]
    assert "needs a model built under a MirroredStrategy" in lines[0]
    assert "one audit recorder per process" in lines[1]
    assert "steps_per_execution=1" in lines[2]
    assert "weight_map[0].keras: no such variable in the Keras model" in lines[3]
    assert not (tmp_path / "f").exists()  # a map that does not fit: refused before writing
    # with the pair's map the weights are the torch script's names and layout (C, H, W flattened)
    assert "mapped ['fc.bias', 'fc.weight'] True" in proc.stdout, proc.stdout
    assert not (tmp_path / "a").exists()  # refused before writing
    assert "digests True True" in proc.stdout, proc.stdout  # Keras's digests are NumPy's
    # a LossScaleOptimizer's skip: the scale halves, the optimizer's iterations stay
    assert "scale [32768.0, 32768.0, 16384.0, 16384.0] [False, True, False, False]" in proc.stdout
    # each replica's loss is its own rows' (not the step's global loss), and they make the step's
    assert "replica losses [0, 1] True True True" in proc.stdout, proc.stdout
    # a failed fit marks its record failed and frees the process for another recorder; a finished
    # one leaves the model as the script built it (its own train step, its jit_compile)
    assert "after a failed fit failed False complete False True" in proc.stdout, proc.stdout
    # a LearningRateSchedule without get_config (fit trains with one; Keras needs it only to
    # save): recorded, named by its class, its lr per step read from its values, the optimizer's
    # other options still read, the script's schedule left in place (issue 48's crash)
    assert "schedule Warmup 0.5 [0.033333, 0.066667, 0.1, 0.1] True" in proc.stdout, proc.stdout
    # the layers that draw random numbers in training, which make two runs' step-1 losses differ
    want = "random layers [] ['drop (Dropout)', 'noise (GaussianNoise)']"
    assert want in proc.stdout, proc.stdout
    # fit's class_weight is read from fit's own arguments (issue 48: class weights were read by
    # nothing), with the loss's options
    assert "loss terms {'0': 1.0, '1': 3.0} False True" in proc.stdout, proc.stdout
    # a layer's add_loss term (not the activity regularizer's, read as a regularizer) and
    # compile's loss_weights (issue 48 item 2); Layer.add_loss as Keras made it after the fit
    assert "add_loss ['act (Sparse)'] [1.0, 0.5] ['activity'] Layer.add_loss" in proc.stdout, (
        proc.stdout
    )
    # sample weights a dataset yields as (x, y, sample_weight): read as fit's train step saw them
    assert "dataset weights True" in proc.stdout, proc.stdout

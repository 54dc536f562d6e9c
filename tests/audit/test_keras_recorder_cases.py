"""The Keras recorder on what real scripts feed and build (in one child process, one case a line):
inputs whose width is unknown when traced (digested on the host, as NumPy's row_digests), two
sub-models with layers of one name, a custom layer's add_weight and BatchNorm's statistics, a dict
input in either key order, a model compiled again after the recorder was made, the dtype policy,
and an error inside fit before its callbacks run."""

from __future__ import annotations

import pytest

from dualtrain.audit.read import read_recorded
from testkit.tf_runs import run_python

SCRIPT = """
import json, numpy as np, keras, tensorflow as tf
import dualtrain.audit as audit
from dualtrain.audit.identity import row_digests
from dualtrain.errors import UserError
SCOPE = tf.distribute.MirroredStrategy(["/cpu:0"]).scope
recs = []
def recorder(name, model, **kw):
    recs.append(audit.keras_recorder(OUT + "/" + name, model=model, **kw))
    return recs[-1]
def case(name, fn):
    try:
        print(name, *fn())
    except Exception as e:
        print(name, "ERROR", type(e).__name__, str(e).splitlines()[0][:300])
    for r in recs:
        r.close()  # a case that failed half-way leaves the process free for the next
def lines(name, file):
    return [json.loads(line) for line in open(f"{OUT}/{name}/{file}")]
def weights(name):
    return np.load(f"{OUT}/{name}/weights_init.npz")

def generator():  # widths unknown when traced: the digests are made on the host; its length
    # unknown: fit begins a third batch, finds the data spent and ends none (no step)
    rng = np.random.default_rng(0)
    batches = [rng.normal(size=(4, n, 3)).astype("float32") for n in (5, 7)]
    data = tf.data.Dataset.from_generator(
        lambda: ((b, np.zeros((4, 2), "float32")) for b in batches),
        output_signature=(tf.TensorSpec((None, None, 3)), tf.TensorSpec((None, 2))))
    with SCOPE():
        m = keras.Sequential([keras.Input((None, 3)), keras.layers.GlobalAveragePooling1D(),
                              keras.layers.Dense(2)])
        m.compile(optimizer="sgd", loss="mse")
    m.fit(data, callbacks=[recorder("gen", m)], verbose=0)
    rows, steps = lines("gen", "replicas.jsonl"), lines("gen", "metrics.jsonl")
    return [len(rows), len(steps)] + [(r["exact"], r["pattern"]) == row_digests(b)
                                      for r, b in zip(rows, batches)]
case("generator", generator)

def towers():  # Keras 3 names both towers' first layer fc1/kernel
    def tower(name):
        inp = keras.Input((3,))
        h = keras.layers.Dense(4, name="fc1")(inp)
        return keras.Model(inp, keras.layers.Dense(2, name="fc2")(h), name=name)
    with SCOPE():
        img = keras.Input((6,))
        left, right = tower("left"), tower("right")
        cat = keras.layers.Concatenate()([left(img[:, :3]), right(img[:, 3:])])
        m = keras.Model(img, keras.layers.Dense(1, name="head")(cat))
        m.compile(optimizer="sgd", loss="mse")
    kernels = {t: m.get_layer(t).get_layer("fc1").kernel.numpy() for t in ("left", "right")}
    m.fit(np.ones((4, 6), "float32"), np.ones((4, 1), "float32"), callbacks=[recorder("tw", m)],
          verbose=0)
    w = weights("tw")
    same = [np.array_equal(w[t + ".fc1.weight"], kernels[t].T) for t in ("left", "right")]
    with open(OUT + "/towers.yaml", "w") as f:  # a map names variables by path: fc1/kernel twice
        f.write("- {torch: fc.weight, keras: fc1/kernel}\\n")
    try:
        recorder("twm", m, weight_map=OUT + "/towers.yaml")
        said = "no error"
    except UserError as e:
        said = str(e)
    return [len(w.files), len(m.weights), *same, "|" + said]
case("towers", towers)

def custom():  # add_weight names of its own; BatchNorm's statistics; no Dropout seed state
    class Scale(keras.layers.Layer):
        def build(self, shape):
            self.w = self.add_weight(shape=(shape[-1],), initializer="ones", name="w")
            self.s = self.add_weight(shape=(), initializer="ones", name="s", trainable=False)
        def call(self, x):
            return x * self.w * self.s
    with SCOPE():
        m = keras.Sequential([keras.Input((3,)), Scale(name="scale"),
                              keras.layers.BatchNormalization(name="bn", synchronized=True),
                              keras.layers.Dropout(0.5), keras.layers.Dense(2, name="fc")])
        m.compile(optimizer="sgd", loss="mse")
    m.fit(np.ones((4, 3), "float32"), np.ones((4, 2), "float32"), callbacks=[recorder("cu", m)],
          verbose=0)
    w = weights("cu")
    (bn,) = json.load(open(f"{OUT}/cu/audit.json"))["config"]["batchnorm"]
    return [",".join(sorted(w.files)), w["scale.w"].shape == (3,), bn["synchronized"]]
case("custom", custom)

def dict_order():  # the input is the same key ("image") whichever order the dict was built in
    rng = np.random.default_rng(1)
    image = rng.normal(size=(4, 5)).astype("float32")
    aux = rng.normal(size=(4, 2)).astype("float32")
    with SCOPE():
        i, a = keras.Input((5,), name="image"), keras.Input((2,), name="aux")
        out = keras.layers.Dense(1)(keras.layers.Concatenate()([i, a]))
        m = keras.Model({"image": i, "aux": a}, out)
        m.compile(optimizer="sgd", loss="mse")
    got = []
    for name, x in (("d1", {"image": image, "aux": aux}), ("d2", {"aux": aux, "image": image})):
        data = tf.data.Dataset.from_tensor_slices((x, np.zeros((4, 1), "float32"))).batch(4)
        m.fit(data, callbacks=[recorder(name, m)], verbose=0)
        got.append(lines(name, "replicas.jsonl")[0]["exact"])
    return [got[0] == got[1], got[0] == row_digests(image)[0]]
case("dict", dict_order)

def recompiled(name, jit):  # the recorder made, then compiled again: the new optimizer's norm
    with SCOPE():
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        m.compile(optimizer="sgd", loss="mse")
    rec = recorder(name, m)
    with SCOPE():
        m.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse", jit_compile=jit)
    m.fit(np.ones((8, 3), "float32"), np.ones((8, 2), "float32"), batch_size=4,
          callbacks=[rec], verbose=0)
    norms = [s["grad_norm"] for s in lines(name, "metrics.jsonl")]
    return [len(norms), all(isinstance(n, float) and np.isfinite(n) and n > 0 for n in norms),
            "_all_reduce_sum_gradients" in vars(m.optimizer), m.jit_compile]
case("recompiled", lambda: recompiled("rc", False))
case("xla", lambda: recompiled("xla", True))

def precision():  # the dtype policy the model computes in
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with SCOPE():
            m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
            m.compile(optimizer="sgd", loss="mse")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    m.fit(np.ones((4, 3), "float32"), np.ones((4, 2), "float32"), callbacks=[recorder("pr", m)],
          verbose=0)
    return [json.dumps(json.load(open(OUT + "/pr/audit.json"))["config"]["precision"])]
case("precision", precision)

def early_errors():  # fit fails before any callback; an uncompiled model
    with SCOPE():
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        m.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensor_slices((np.ones((4, 3)), np.ones((4, 2)))).batch(2)
    rec = recorder("ee", m)  # made before the call: fit's wrapper sees the call fail
    try:
        m.fit(data, validation_split=0.5, callbacks=[rec], verbose=0)
    except ValueError:
        pass
    import os
    state, wrapped = os.path.exists(OUT + "/ee"), "fit" in vars(m)
    with SCOPE():
        bare = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    try:
        recorder("un", bare)
        said = "no error"
    except UserError as e:
        said = str(e)
    recorder("after", m)  # the process may still record
    return [state, wrapped, os.path.exists(OUT + "/un"),
            "|" + said]
case("early", early_errors)

def lr_late():  # a callback after the recorder sets the lr at each batch's start (a warmup)
    with SCOPE():
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        m.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    class Warmup(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.model.optimizer.learning_rate = 0.1 * (batch + 1)
    m.fit(np.ones((12, 3), "float32"), np.ones((12, 2), "float32"), batch_size=4,
          callbacks=[recorder("lr", m), Warmup()], verbose=0)
    return [round(s["lr"], 6) for s in lines("lr", "metrics.jsonl")]
case("lr", lr_late)

def listed_twice():  # callbacks=[rec, rec]: the first listing records, the second does nothing
    with SCOPE():
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        m.compile(optimizer="sgd", loss="mse")
    rec = recorder("tw2", m)
    m.fit(np.ones((8, 3), "float32"), np.ones((8, 2), "float32"), batch_size=4,
          callbacks=[rec, rec], verbose=0)
    state = json.load(open(OUT + "/tw2/audit.json"))["state"]
    return [state, len(lines("tw2", "metrics.jsonl")), len(lines("tw2", "replicas.jsonl"))]
case("twice", listed_twice)

def two_fits():  # a warm-up fit the recorder is not given, then its fit, then a second fit
    with SCOPE():
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        m.compile(optimizer="sgd", loss="mse")
    rec = recorder("two", m)
    x, y = np.ones((8, 3), "float32"), np.ones((8, 2), "float32")
    m.fit(x, y, batch_size=4, verbose=0)  # not recorded: no rows, the train step as built
    m.fit(x, y, batch_size=4, callbacks=[rec], verbose=0)
    steps, rows = lines("two", "metrics.jsonl"), lines("two", "replicas.jsonl")
    out = [len(steps), sorted({r["step"] for r in rows}), all(s["grad_norm"] > 0 for s in steps)]
    try:
        m.fit(x, y, batch_size=4, callbacks=[rec], verbose=0)
        return out + ["no error"]
    except UserError as e:
        return out + [str(e).splitlines()[0].replace(" ", "_")]
case("fits", two_fits)

def no_decay():  # AdamW's exclude_from_weight_decay (not in its get_config): the names it skips
    with SCOPE():
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="fc")])
        opt = keras.optimizers.AdamW(weight_decay=0.1, use_ema=True)
        opt.exclude_from_weight_decay(var_names=["bias"])
        m.compile(optimizer=opt, loss="mse")
    m.fit(np.ones((8, 3), "float32"), np.ones((8, 2), "float32"), batch_size=4,
          callbacks=[recorder("nd", m)], verbose=0)
    cfg = json.load(open(f"{OUT}/nd/audit.json"))["config"]["optimizer"]
    return [cfg["no_decay"], cfg["use_ema"]]
case("decay", no_decay)

def restored():  # a callback after the recorder restores weights in on_train_begin (as
    # BackupAndRestore does when it resumes): the initial weights are those the first step uses
    with SCOPE():
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        m.compile(optimizer="sgd", loss="mse")
    saved = [np.full(w.shape, 0.25, "float32") for w in m.get_weights()]
    class Restore(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.model.set_weights(saved)
    m.fit(np.ones((8, 3), "float32"), np.ones((8, 2), "float32"), batch_size=4,
          callbacks=[recorder("res", m), Restore()], verbose=0)
    init = weights("res")
    return [len(init.files), all(bool(np.all(init[k] == 0.25)) for k in init.files)]
case("restored", restored)

def data_split():  # what fit reads, as far as it says how workers split it
    out = []
    for name, policy in (("ds", "FILE"), ("arr", None)):
        with SCOPE():
            m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
            m.compile(optimizer="sgd", loss="mse")
        x, y = np.ones((8, 3), "float32"), np.ones((8, 2), "float32")
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
        if policy:
            opts = tf.data.Options()
            policy = tf.data.experimental.AutoShardPolicy.FILE
            opts.experimental_distribute.auto_shard_policy = policy
            m.fit(data.with_options(opts), callbacks=[recorder(name, m)], verbose=0)
        else:
            m.fit(x, y, batch_size=4, callbacks=[recorder(name, m)], verbose=0)
        cfg = json.load(open(f"{OUT}/{name}/audit.json"))["config"]["data"]
        out.append(json.dumps(cfg, sort_keys=True).replace(" ", ""))
    return out
case("data", data_split)

def frozen_layer():  # a frozen layer's kernel and bias; a Normalization's statistics are not
    with SCOPE():
        norm = keras.layers.Normalization(mean=0.0, variance=1.0)
        body = keras.layers.Dense(4, name="body")
        m = keras.Sequential([keras.Input((3,)), norm, body, keras.layers.Dense(2, name="head")])
        body.trainable = False
        m.compile(optimizer="sgd", loss="mse")
    m.fit(np.ones((8, 3), "float32"), np.ones((8, 2), "float32"), batch_size=4,
          callbacks=[recorder("frz", m)], verbose=0)
    cfg = json.load(open(f"{OUT}/frz/audit.json"))["config"]["frozen"]
    return [json.dumps(cfg, sort_keys=True).replace(" ", "")]
case("frozen", frozen_layer)

def lr_callbacks():  # fit's lr callbacks and its own shuffle of arrays, read from fit's frame
    with SCOPE():
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="fc")])
        m.compile(optimizer="sgd", loss="mse")
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.2, patience=3)
    m.fit(np.ones((8, 3), "float32"), np.ones((8, 2), "float32"), batch_size=4, shuffle=False,
          callbacks=[recorder("lrc", m), plateau], verbose=0)
    cfg = json.load(open(f"{OUT}/lrc/audit.json"))["config"]
    (cb,) = cfg["lr_callbacks"]
    return [cb["type"], cb["patience"], cb["factor"], cb["monitor"], cfg["data"]["fit_shuffle"]]
case("lrcb", lr_callbacks)

def early_stop():  # an EarlyStopping listed after the recorder restores its best weights in its
    # own on_train_end, after the recorder's: the record's final weights are those fit ends with
    with SCOPE():
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="fc")])
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=1, min_delta=1e9,
                                         restore_best_weights=True)  # epoch 2 is no better
    rng = np.random.default_rng(0)
    m.fit(rng.normal(size=(8, 3)).astype("float32"), np.ones((8, 2), "float32"), batch_size=4,
          epochs=4, callbacks=[recorder("stop", m), stop], verbose=0)
    cfg = json.load(open(f"{OUT}/stop/audit.json"))["config"]["early_stopping"]
    final = np.load(f"{OUT}/stop/weights_final.npz")["fc.weight"]
    moved = not np.array_equal(final, weights("stop")["fc.weight"])
    return [cfg["stopped_epoch"], cfg["restore_best_weights"], moved,
            np.array_equal(final, m.get_layer("fc").kernel.numpy().T)]
case("stop", early_stop)

def own_loop():  # the callbacks called by a loop of the script's own, not fit: no row recorded
    with SCOPE():
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="fc")])
        m.compile(optimizer="sgd", loss="mse")
    rec = recorder("own", m)
    rec.set_model(m)
    rec.on_train_begin()
    for i in range(2):
        rec.on_train_batch_begin(i)
        rec.on_train_batch_end(i)
    try:
        rec.on_train_end()
    except UserError as e:
        state = json.load(open(f"{OUT}/own/audit.json"))["state"]
        return ["UserError", str(e).split(":")[0], state]
    return ["no error"]
case("own", own_loop)
"""


@pytest.fixture(scope="module")
def printed(tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("keras_cases")
    proc = run_python("-c", f"OUT = {str(out)!r}\n" + SCRIPT, timeout=180)
    cases = (
        "generator",
        "towers",
        "custom",
        "dict",
        "recompiled",
        "xla",
        "precision",
        "early",
        "lr",
        "twice",
        "fits",
        "decay",
        "restored",
        "data",
        "frozen",
        "lrcb",
        "stop",
        "own",
    )
    lines = {line.split(" ", 1)[0]: line for line in proc.stdout.splitlines()}
    missing = [c for c in cases if c not in lines]
    assert not missing, f"{missing}: {proc.stdout}\n{proc.stderr[-3000:]}"
    return lines


def test_inputs_of_a_width_unknown_when_traced_are_digested_on_the_host(printed):
    # a from_generator dataset with None dimensions: two batches of different widths, each
    # replica's digests NumPy's row_digests of the rows fed; two steps (none for the batch fit
    # began when the generator's length was not yet known)
    assert printed["generator"] == "generator 2 2 True True"


def test_two_sub_models_with_layers_of_one_name_keep_every_array(printed):
    # 10 variables, 10 arrays: each tower's fc1 named by its tower (left.fc1.weight); a weight
    # map, which names Keras variables by path, cannot tell them apart: a one-line error
    assert printed["towers"] == (
        "towers 10 10 True True |weight_map names Keras variables by path, and the model has 2 "
        "variables at 'fc1/kernel': give its layers distinct names"
    )


def test_a_custom_layers_weights_and_batchnorm_statistics_are_recorded(printed):
    # add_weight's own names (layout kept), BatchNorm's moving statistics, no seed state; a
    # BatchNormalization(synchronized=True) recorded as synchronised over the replicas
    want = "bn.bias,bn.running_mean,bn.running_var,bn.weight,fc.bias,fc.weight,scale.s,scale.w"
    assert printed["custom"] == f"custom {want} True True"


def test_a_dict_input_is_digested_by_its_key_not_its_insertion_order(printed):
    assert printed["dict"] == "dict True True"


def test_a_model_compiled_again_after_the_recorder_has_its_grad_norm(printed):
    # every step's norm finite: the new optimizer's, unwrapped after fit
    assert printed["recompiled"] == "recompiled 2 True False False"


def test_a_model_compiled_again_with_jit_compile_fits_without_xla_while_recorded(printed):
    # the new compile's jit_compile=True: fit runs without XLA (the recorder's tf.py_function),
    # then the model is as compiled
    assert printed["xla"] == "xla 2 True False True"


def test_the_dtype_policy_is_recorded(printed):
    want = '{"policy": "mixed_float16", "compute_dtype": "float16", "variable_dtype": "float32"}'
    assert printed["precision"] == f"precision {want}"


def test_a_fit_failing_before_its_callbacks_and_an_uncompiled_model(printed):
    # fit's own error before on_train_begin: no folder written (the recorder writes from fit's
    # start), the model unwrapped; an uncompiled model: a one-line error before anything is
    # written or claimed
    want = "early False False False |keras_recorder needs a compiled model (call model.compile"
    assert printed["early"].startswith(want), printed["early"]


def test_only_the_fit_given_the_recorder_is_recorded_and_once(printed):
    """A warm-up fit before the recorded one used to leave rows of step 0 and reuse its train
    function (no gradient norm at any recorded step); a second fit given the closed recorder
    trained unrecorded, silently."""
    assert printed["fits"] == (
        "fits 2 [1, 2] True this_audit_recorder_is_closed;_make_a_new_one_for_another_fit"
    ), printed["fits"]


def test_the_variables_left_out_of_weight_decay_are_recorded(printed):
    assert printed["decay"] == "decay ['fc.bias'] True", printed["decay"]


def test_the_lr_is_the_one_the_update_used(printed):
    # read in the optimizer's all-reduce wrapper, so a per-batch callback placed after the
    # recorder is seen (at the batch's start the recorder would read the previous batch's lr)
    assert printed["lr"] == "lr 0.1 0.2 0.3"


def test_a_recorder_listed_twice_in_callbacks_records_once(printed):
    # fit calls it twice at every event; the second on_train_end wrote into removed parts/
    assert printed["twice"] == "twice complete 2 2"


def test_the_initial_weights_are_those_the_first_step_uses(printed):
    # a callback after the recorder that restores weights (BackupAndRestore resuming): before,
    # the weights read at on_train_begin were the fresh ones, and a resumed run passed the
    # initial-weights check against a fresh one
    assert printed["restored"] == "restored 2 True"


@pytest.mark.slow  # two TF worker processes, twice (~20 s)
def test_multi_worker_with_a_chief_task_and_a_recorder_on_the_chief_only(tmp_path):
    """TF_CONFIG with a chief task and a worker (both task_id 0): the recorder numbers them as
    MWMS does (0 and 1), where both used to write part 0 and fail; a recorder on the chief only
    is a one-line error as fit begins, with nothing written (it used to train, then wait at its
    end for the worker's part and leave the folder 'recording')."""
    script = ("-m", "tests.audit.keras_mwms_case")
    both = run_python(*script, str(tmp_path / "a"), "--chief-task", timeout=240)
    assert "codes [0, 0]" in both.stdout, both.stderr[-3000:]
    run = read_recorded(tmp_path / "a")
    assert sorted({rep for _, rep in run.replicas}) == [0, 1] and len(run.steps) == 8
    lone = run_python(*script, str(tmp_path / "b"), "--chief-only", timeout=240)
    assert "codes [3, " in lone.stdout, lone.stdout + lone.stderr[-3000:]
    error = (tmp_path / "b.rank0.err").read_text()
    assert error.count("\n") == 1 and "worker(s) [1] made none in 5 s" in error
    assert not (tmp_path / "b").exists()


def test_the_datasets_split_over_workers_is_recorded(printed):
    # a tf.data dataset's auto-shard policy (compare names a different one); arrays: their kind
    # and fit's own shuffle of them (its default, True)
    assert printed["data"] == (
        'data {"auto_shard_policy":"FILE","kind":"tf.data.Dataset","workers":1} '
        '{"fit_shuffle":true,"kind":"ndarray","workers":1}'
    )


def test_a_frozen_layers_parameters_are_recorded_not_its_statistics(printed):
    assert printed["frozen"] == 'frozen {"body.bias":4,"body.weight":12}'


def test_fits_lr_callbacks_and_its_shuffle_of_arrays_are_recorded(printed):
    assert printed["lrcb"] == "lrcb ReduceLROnPlateau 3 0.2 loss False", printed["lrcb"]


def test_the_final_weights_are_those_an_early_stopping_restores(printed):
    # stopped after epoch 2 (index 1), its best weights (epoch 1's) restored after the
    # recorder's on_train_end: the record holds them, not epoch 2's
    assert printed["stop"] == "stop 1 True True True", printed["stop"]


def test_callbacks_called_by_a_loop_of_the_scripts_own_are_one_line(printed):
    # a strategy.run loop calling the recorder's callbacks: the record held steps without rows
    # or losses, complete, and compare PASSed its samples
    assert printed["own"] == "own UserError keras_recorder records model.fit failed", printed["own"]

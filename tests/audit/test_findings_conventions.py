"""Findings the eighth round of unseen scripts got wrong, on records written in the test: optimizer
options and conventions (amsgrad, Keras's decoupled weight decay against none, NAdam's momentum
schedule, an optimizer Keras lacks), a loss divided by the global batch under DDP, fit's own
shuffle of NumPy arrays, ReduceLROnPlateau's patience and threshold, float64 on one side."""

from __future__ import annotations

from dualtrain.audit.checks import check_settings
from dualtrain.audit.diagnose import diagnose
from tests.audit.records import edit_steps, record, with_rows

TORCH = """\
opt = torch.optim.NAdam(model.parameters(), lr=0.002)
torch.set_default_dtype(torch.float64)
with torch.autocast("cpu", dtype=torch.float16, enabled=args.amp):
loss = nn.CrossEntropyLoss(reduction="sum")(out, target) / (len(target) * world)
sched = ReduceLROnPlateau(opt, patience=1)
sampler = SequentialSampler(ds)
"""
KERAS = """\
opt = keras.optimizers.Nadam(learning_rate=0.002)
keras.mixed_precision.set_global_policy("mixed_float16")
keras.config.set_floatx("float64")
cb = keras.callbacks.ReduceLROnPlateau(factor=0.1, patience=2)
model.fit(x, y, batch_size=64, epochs=2, callbacks=[rec, cb])
"""
ADAM = {"betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0, "amsgrad": False}
KADAM = {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-8, "amsgrad": False}


def _pair(torch_opt: dict, keras_opt: dict):
    a = record("torch", script=TORCH, config={"optimizer": torch_opt})
    return a, record("tf", script=KERAS, config={"optimizer": keras_opt})


def _conventions(a, b) -> str:
    found = [f for f in diagnose(a, b) if f.name.startswith("optimizer conventions")]
    return found[0].evidence if found else ""


def test_amsgrad_keras_weight_decay_and_nadams_momentum_schedule_are_named():
    """Each PASSed: Adam(amsgrad=True) against amsgrad off, Keras Adam(weight_decay=0.5) against a
    torch Adam without, NAdam's momentum_decay=4e-3 against Keras's 0.96**t (and its epsilon)."""
    adam, kadam = {"type": "Adam", **ADAM}, {"type": "Adam", **KADAM}
    assert _conventions(*_pair(adam, kadam)) == ""
    ams = _pair(adam | {"amsgrad": True}, kadam)
    assert "amsgrad: torch amsgrad=True, Keras amsgrad=False" in _conventions(*ams)
    assert check_settings(*ams).status == "FAIL"
    decayed = _pair(adam, kadam | {"weight_decay": 0.5})
    assert "Keras Adam's weight_decay=0.5 decays the weights (decoupled" in _conventions(*decayed)
    nadam = {"type": "NAdam", **ADAM, "momentum_decay": 0.004}
    knadam = {"type": "Nadam", **KADAM}
    assert "Keras's Nadam uses 0.96**t, which is torch's momentum_decay=1.0" in _conventions(
        *_pair(nadam, knadam)
    )
    assert _conventions(*_pair(nadam | {"momentum_decay": 1.0}, knadam)) == ""
    eps = _pair(nadam | {"momentum_decay": 1.0}, knadam | {"epsilon": 0.1})
    assert "epsilon: torch eps=1e-08, Keras epsilon=0.1" in _conventions(*eps)


def test_an_optimizer_keras_lacks_is_not_written_as_a_keras_one():
    a, b = _pair({"type": "RAdam", **ADAM}, {"type": "Adam", **KADAM})
    (f,) = [f for f in diagnose(a, b) if f.name == "different optimizers"]
    assert "Keras has no RAdam" in f.fixes[1] and "keras.optimizers.RAdam" not in f.fixes[1]


def test_a_loss_divided_by_the_global_batch_under_ddp_is_named():
    """sum / (local batch x world) under DDP's averaging: loss and gradient both 1/2 of a
    mean's, every step at half the lr; nothing was named."""
    half = record("torch", world=2, losses=[0.5] * 4, grad_norm=0.5, script=TORCH)
    half.config = half.config.edited({"ddp": True})
    found = {f.name: f for f in diagnose(half, record("tf", world=2))}
    f = found["per-replica loss reduction (divided by the global batch under DDP)"]
    assert "A's loss and gradient are both 1/2.00 of the other's" in f.evidence
    assert "torch.py:4: loss = nn.CrossEntropyLoss(" in f.fixes[0]
    assert diagnose(record("torch", world=2), record("tf", world=2)) == []


def test_fits_own_shuffle_of_arrays_is_the_fit_line_to_change():
    """fit(x, y) shuffles NumPy arrays every epoch: the fix sent the user to a tf.data buffer
    and a set_random_seed line."""
    seq = record("torch", script=TORCH, config={"sampler": {"type": "SequentialSampler"}})
    data = {"data": {"kind": "ndarray", "workers": 1, "fit_shuffle": True}}
    keras = with_rows(record("tf", script=KERAS, config=data), lambda s, r: [f"{5 - s:08x}0"])
    with_rows(seq, lambda s, r: [f"{s:08x}0"])
    f = {f.name: f for f in diagnose(seq, keras)}["shuffle seeds"]
    assert "fit shuffles its NumPy arrays every epoch by default" in f.evidence
    assert "tf.py:5: model.fit(x, y" in f.fixes[1] and "shuffle=False" in f.fixes[1]


def test_reduce_lr_on_plateaus_patience_and_threshold_conventions():
    """torch's patience=p cuts after p + 1 bad epochs, Keras's after p (at least 1); torch's
    threshold is relative by default: patience=1 on both FAILed the lr with nothing named."""
    sched = {"type": "ReduceLROnPlateau", "patience": 1, "factor": 0.1, "cooldown": 0}
    sched |= {"threshold": 1e-4, "threshold_mode": "rel"}
    torch_run = record("torch", script=TORCH, config={"scheduler": sched})
    cb = {"type": "ReduceLROnPlateau", "monitor": "val_loss", "factor": 0.1, "cooldown": 0}
    keras = record(
        "tf", script=KERAS, config={"lr_callbacks": [cb | {"patience": 1, "min_delta": 1e-4}]}
    )
    f = {f.name: f for f in diagnose(torch_run, keras)}["ReduceLROnPlateau conventions"]
    assert "torch patience=1 cuts after 2 epochs without improvement, Keras patience=1 after 1" in (
        f.evidence
    )
    assert "torch threshold=0.0001 (relative, of the best), Keras min_delta=0.0001" in f.evidence
    assert "torch.py:5: sched = ReduceLROnPlateau(" in f.fixes[0] and "patience=0" in f.fixes[0]
    assert "tf.py:4: cb = keras.callbacks.ReduceLROnPlateau(" in f.fixes[1]
    assert check_settings(torch_run, keras).status == "FAIL"
    keras.config = keras.config.edited({"lr_callbacks": [cb | {"patience": 2, "min_delta": 1e-4}]})
    torch_run.config = torch_run.config.edited(
        {"scheduler": {**torch_run.config.json["scheduler"], "threshold_mode": "abs"}}
    )
    assert not [f for f in diagnose(torch_run, keras) if f.name == "ReduceLROnPlateau conventions"]


def test_float64_on_one_side_is_one_finding_at_its_dtype_line():
    """set_default_dtype(float64) against float32: also 'different compute dtype', whose fix
    quoted a disabled autocast line."""
    f64 = {"param_dtype": "float64", "autocast": None, "compute_dtype": "float64"}
    a = record("torch", script=TORCH, config={"precision": f64})
    policy = {"policy": "float32", "compute_dtype": "float32", "variable_dtype": "float32"}
    b = record("tf", script=KERAS, config={"precision": policy})
    found = [f for f in diagnose(a, b) if f.name.startswith("different")]
    assert [f.name for f in found] == ["different parameters (float64 vs float32)"]
    assert "torch.py:2: torch.set_default_dtype(torch.float64)" in found[0].fixes[0]
    assert "tf.py:3: keras.config.set_floatx(" in found[0].fixes[1]


def test_kerass_per_replica_clipping_note_says_when_a_clip_was_active():
    """The note said 'the two agree while no clip is active' when torch's clip was active on 36
    of 69 steps and Keras's summed gradient reached 1.70 against a limit of 1: it now says what
    the records show, and that the two agree only where no clip was active."""
    calls = [{"function": "clip_grad_norm_", "limit": 1.0, "steps": 4, "active_steps": 3}]
    torch_run = record("torch", world=2, config={"clipping": {"calls": calls, "steps": 4}})
    opt = {"type": "SGD", "global_clipnorm": 1.0}
    keras_run = record("tf", world=2, config={"optimizer": opt})
    edit_steps(keras_run, lambda k, s: {"grad_norm": [1.7, 1.2, 0.4, 0.3][k]})
    (f,) = [f for f in diagnose(torch_run, keras_run) if "before the all-reduce" in f.name]
    assert "A's clip_grad_norm_ was active on 3 of 4 steps" in f.evidence, f.evidence
    assert "B's summed gradient's norm passed 1 on 2 of 4 steps (up to 1.7)" in f.evidence
    assert "while no clip is active" not in f.evidence
    quiet = [{**calls[0], "active_steps": 0}]
    torch_quiet = record("torch", world=2, config={"clipping": {"calls": quiet, "steps": 4}})
    edit_steps(keras_run, lambda k, s: {"grad_norm": 0.5})
    (g,) = [f for f in diagnose(torch_quiet, keras_run) if "before the all-reduce" in f.name]
    assert "no clip was active in either run: they agree here" in g.evidence, g.evidence

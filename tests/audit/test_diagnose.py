"""Diagnoses on records written in the test (what a recorder would read from an SGD with
momentum and a Keras SGD, an lr that changes): the conventions no example script plants."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from dualtrain.audit.checks import check_settings, run_checks
from dualtrain.audit.config import RunConfig
from dualtrain.audit.diagnose import diagnose
from dualtrain.audit.read import Recorded, Script
from dualtrain.audit.rows import ReplicaRow, StepRow
from dualtrain.records.verdict import FAIL, NOT_JUDGED, PASS
from tests.audit.records import edit_rows, edit_steps, record, with_rows


def _run(framework: str, optimizer: dict, lrs: list[float]) -> Recorded:
    steps = [
        {
            "step": i + 1,
            "epoch": 1 + i // 2,
            "lr": lr,
            "loss": 1.0,
            "samples": 8,
            "grad_norm": 1.0,
            "loss_scale": None,
            "skipped": False,
        }
        for i, lr in enumerate(lrs)
    ]
    rows = {
        (s["step"], 0): {
            "step": s["step"],
            "epoch": s["epoch"],
            "replica": 0,
            "count": 8,
            "exact": [f"{s['step']:016x}"],
            "pattern": [f"{s['step']:016x}"],
        }
        for s in steps
    }
    w = {"w": np.zeros(2, np.float32)}
    config = {"optimizer": optimizer}
    return Recorded(
        Path(framework),
        framework,
        1,
        RunConfig.from_json(config),
        Script(),
        [StepRow.of(s) for s in steps],
        {k: ReplicaRow.of(v) for k, v in rows.items()},
        w,
        w,
    )


def test_sgd_momentum_under_a_changing_lr_is_named():
    lrs = [0.1, 0.1, 0.01, 0.01]
    a = _run("torch", {"type": "SGD", "lr": 0.1, "momentum": 0.9, "nesterov": False}, lrs)
    b = _run("tf", {"type": "SGD", "learning_rate": 0.1, "momentum": 0.9, "nesterov": False}, lrs)
    found = {f.name: f for f in diagnose(a, b)}
    conv = found["SGD momentum convention under a changing lr"]
    assert "torch's momentum buffer holds gradients" in conv.evidence and conv.inherent
    assert check_settings(a, b).status == PASS  # no line of either script changes it
    assert diagnose(a, _run("torch", a.config.json["optimizer"], lrs)) == []  # the same: nothing


def test_adam_epsilon_and_coupled_weight_decay_are_named():
    lrs = [1e-3] * 4
    a = _run(
        "torch",
        {"type": "Adam", "lr": 1e-3, "eps": 1e-8, "betas": [0.9, 0.999], "weight_decay": 0.01},
        lrs,
    )
    b = _run(
        "tf",
        {"type": "Adam", "learning_rate": 1e-3, "epsilon": 1e-7, "beta_1": 0.9, "beta_2": 0.999},
        lrs,
    )
    (conv,) = [f for f in diagnose(a, b) if f.name.startswith("optimizer conventions")]
    assert "epsilon: torch eps=1e-08, Keras epsilon=1e-07" in conv.evidence
    assert "an L2 term" in conv.evidence
    # the fixes are the values to write (issue 48: they read "the torch values under Keras's
    # names"), each side's in its own framework's names
    # torch's coupled weight_decay=0.01 is Keras's L2(0.005) on every weight (2 * l2 * w)
    l2 = "keras.regularizers.L2(0.005)"
    decay = f"kernel_regularizer={l2} and bias_regularizer={l2} on every layer, weight_decay=None"
    assert f"-> epsilon=1e-08, {decay}" in conv.fixes[0], conv.fixes
    assert conv.fixes[1].endswith("-> or eps=1e-07, weight_decay=0"), conv.fixes
    keras = {"type": "Adam", "learning_rate": 1e-3, "epsilon": 1e-8, "beta_1": 0.8, "beta_2": 0.999}
    b2 = _run("tf", keras, lrs)
    a2 = _run("torch", {"type": "Adam", "lr": 1e-3, "eps": 1e-8, "betas": [0.9, 0.99]}, lrs)
    (conv,) = [f for f in diagnose(a2, b2) if f.name.startswith("optimizer conventions")]
    assert conv.fixes[0].endswith("-> beta_1=0.9, beta_2=0.99"), conv.fixes
    assert conv.fixes[1].endswith("-> or betas=(0.8, 0.999)"), conv.fixes


def test_a_torch_cumulative_batchnorm_is_named_not_a_crash():
    bn = {"name": "bn", "eps": 1e-5, "convention": "torch"}
    a = record("torch", config={"batchnorm": [bn | {"momentum": 0.1}]})
    b = record("torch", config={"batchnorm": [bn | {"momentum": None}]})
    (f,) = [f for f in diagnose(a, b) if f.name == "different BatchNorm settings"]
    assert "a cumulative average" in f.evidence  # torch against torch: torch's arguments
    assert f.fixes[0].endswith(
        "-> momentum=None, eps=1e-05 (the other run's, in torch's convention)"
    )
    assert check_settings(a, b).status == FAIL


def test_epochs_are_counted_from_each_runs_first_and_step_counts_may_differ():
    late = record("tf", first_epoch=2)  # fit(..., initial_epoch=1)
    assert late.epochs() == {1: [1, 2], 2: [3, 4]}
    checks = {c.name: c for c in run_checks(late, record("tf"))}
    assert checks["steps"].status == PASS and checks["samples"].status == PASS
    assert diagnose(late, record("tf")) == []
    short = record("tf", losses=[1.0] * 3)  # 3 steps against 4: windows of common steps only
    assert run_checks(short, record("tf"))[-1].status == PASS


def test_a_run_without_a_loss_is_not_judged_and_a_diverged_one_fails():
    nan = float("nan")
    checks = {c.name: c for c in run_checks(record("tf", losses=[nan] * 4), record("tf"))}
    assert checks["loss trajectory"].status == NOT_JUDGED
    assert "A has none at any step" in checks["loss trajectory"].detail
    diverged = {c.name: c for c in run_checks(record("tf", losses=[1, 1, nan, nan]), record("tf"))}
    assert diverged["loss trajectory"].status == FAIL
    assert diverged["loss trajectory"].first_step == 3


def test_a_loss_recorded_per_micro_batch_or_per_replica_is_named():
    micro = record("torch", losses=[0.25] * 4, batches=4, script="rec.step(loss)\n")
    (f,) = [f for f in diagnose(micro, record("torch")) if f.name.startswith("loss of one micro")]
    assert "4 micro-batches" in f.evidence and "torch.py:1: rec.step(loss)" in f.fixes[0]
    guide = record("tf", losses=[0.5] * 4, world=2)
    names = [f.name for f in diagnose(guide, record("tf", world=2))]
    assert "loss reported divided by the replicas (a custom train_step)" in names
    # a different gradient is a different training, not a reporting convention
    assert not [
        f
        for f in diagnose(record("tf", losses=[0.5] * 4, world=2, grad_norm=2.0), guide)
        if f.name.startswith("loss reported")
    ]


def test_lr_fixes_use_each_scripts_framework_and_a_peak_scheduler():
    a = record("torch", script="opt = torch.optim.SGD(model.parameters(), lr=0.1)\n")
    b = record("torch", script="opt = torch.optim.SGD(model.parameters(), lr=0.2)\n")
    edit_steps(b, lambda k, s: {"lr": 0.2})
    (f,) = [f for f in diagnose(a, b) if f.name == "different base learning rate"]
    assert f.fixes[1].endswith("-> lr=0.1"), f.fixes
    b.config = b.config.edited({"scheduler": {"type": "OneCycleLR"}})
    added = "sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1)\n"
    b.script = dataclasses.replace(b.script, text=f"{b.script.text}{added}")
    (f,) = [f for f in diagnose(a, b) if f.name == "different base learning rate"]
    assert "OneCycleLR(opt, max_lr=1) -> a max_lr" in f.fixes[1], f.fixes


def test_settings_that_differ_fail_the_verdict_and_precision_is_named():
    a = record("torch", config={"precision": {"param_dtype": "float64"}})
    b = record("torch", config={"precision": {"param_dtype": "float32"}})
    assert check_settings(a, b).status == FAIL
    assert "different parameters (float64 vs float32)" in [f.name for f in diagnose(a, b)]
    k = record(
        "tf", config={"precision": {"compute_dtype": "bfloat16", "variable_dtype": "float32"}}
    )
    assert (
        check_settings(record("tf", config={"precision": {"compute_dtype": "float32"}}), k).status
        == FAIL
    )
    assert check_settings(b, k).status == PASS  # float32 parameters in both
    zero = record(
        "torch",
        config={"optimizer": {"type": "SGD", "lr": 0.1, "wrapper": "ZeroRedundancyOptimizer"}},
    )
    assert check_settings(zero, b).status == PASS


def test_clipping_in_one_run_fails_and_kerass_per_replica_clipping_is_reported():
    clip = "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
    torch_clips = record("torch", world=2, script="loss.backward()\n" + clip)
    torch_plain = record("torch", world=2, script="loss.backward()\n")
    keras_clips = record(
        "tf", world=2, config={"optimizer": {"type": "SGD", "global_clipnorm": 1.0}}
    )
    keras_plain = record("tf", world=2, config={"optimizer": {"type": "SGD"}})
    (f,) = [f for f in diagnose(torch_plain, keras_clips) if f.name.startswith("gradient clipping")]
    assert "B clips its gradients (global_clipnorm=1)" in f.evidence
    assert "loss.backward() -> torch.nn.utils.clip_grad_norm_(model.parameters(), 1)" in f.fixes[0]
    assert check_settings(torch_plain, keras_clips).status == FAIL
    assert check_settings(torch_clips, keras_plain).status == FAIL
    both = diagnose(torch_clips, keras_clips)
    (g,) = [
        f for f in both if f.name == "Keras clips each replica's gradient before the all-reduce"
    ]
    assert g.inherent and check_settings(torch_clips, keras_clips).status == PASS
    assert g.title.endswith("[a convention of the frameworks: no line changes it, not a failure]")


BRANCHES = """\
opts = {
    "sgd": lambda: keras.optimizers.SGD(0.5),
    "adam": lambda: keras.optimizers.Adam(0.001),
}
lrs = {"cosine": keras.optimizers.schedules.CosineDecay(0.1, 100),
       "piecewise": keras.optimizers.schedules.PiecewiseConstantDecay([4], [0.1, 0.01])}
cbs = [keras.callbacks.LearningRateScheduler(decay)]
ds = ds.shuffle(1000, seed=1)
"""


def test_the_line_quoted_is_the_recorded_optimizers_and_schedules():
    """A script with argparse branches: the line of what the run recorded, not the first match."""
    a = record(
        "tf",
        config={"optimizer": {"type": "Adam", "learning_rate": "CosineDecay"}},
        script=BRANCHES,
    )
    b = record(
        "tf",
        config={"optimizer": {"type": "AdamW", "learning_rate": "PiecewiseConstantDecay"}},
        script=BRANCHES,
    )
    (f,) = [f for f in diagnose(a, b) if f.name == "different optimizer settings"]
    assert 'tf.py:3: "adam": lambda: keras.optimizers.Adam(0.001),' in f.fixes[0], f.fixes
    edit_steps(b, lambda k, s: {"lr": 0.01}, slice(2, None))
    (g,) = [f for f in diagnose(a, b) if f.name == "different lr schedules"]
    assert "tf.py:5: lrs = {" in g.fixes[0] and "tf.py:6:" in g.fixes[1], g.fixes


def test_a_shuffle_fix_is_in_each_runs_framework_words():
    a, b = record("tf", script=BRANCHES), record("tf", script=BRANCHES)
    # the same rows, another order inside epoch 1
    edit_rows(
        b,
        lambda s, r, row: (
            {k: getattr(a.replicas[(3 - s, 0)], k) for k in ("exact", "pattern")}
            if s in (1, 2)
            else {}
        ),
    )
    (f,) = [f for f in diagnose(a, b) if f.name == "shuffle seeds"]
    assert all("no `.shuffle`" in x and "Sampler" not in x for x in f.fixes), f.fixes
    assert "tf.py:8: ds = ds.shuffle(1000, seed=1)" in f.fixes[0]


def test_a_pass_with_a_check_not_judged_says_so():
    from dualtrain.audit.compare import AuditComparison

    nan = float("nan")
    a, b = record("tf", losses=[nan] * 4), record("tf")
    cmp = AuditComparison(a, b, run_checks(a, b), diagnose(a, b))
    assert cmp.verdict == (
        "verdict: PASS (7/7 judged checks of two recorded runs; not judged: loss trajectory)"
    )


def test_scheduler_owned_group_keys_are_not_settings_and_tabular_patterns_name_no_normalisation():
    swa = record("torch", config={"optimizer": {"type": "SGD", "lr": 0.1, "swa_lr": 0.05}})
    assert check_settings(record("torch"), swa).status == PASS  # SWALR's key, not a setting
    a, b = record("tf"), record("tf")
    for run, tag in ((a, "a"), (b, "b")):  # rows without ties share 'all but the argmin' masks
        edit_rows(run, lambda s, r, row, tag=tag: {"pattern": ["p0"], "exact": [f"{tag}{s}"]})
    assert not [f for f in diagnose(a, b) if f.name == "input normalisation"]


def _clipped(*calls: tuple[str, object]) -> dict:
    """A torch recorder's clipping: the calls it saw run, on every one of 4 steps."""
    return {
        "clipping": {
            "watched": True,
            "steps": 4,
            "calls": [{"function": f, "limit": x, "steps": 4, "active_steps": 1} for f, x in calls],
        }
    }


def test_a_torch_runs_clipping_is_the_calls_its_recorder_saw_not_its_text():
    never = "loss.backward()\nif args.clip:\n    clip_grad_norm_(model.parameters(), 1.0)\n"
    keras_plain = record("tf", world=2, config={"optimizer": {"type": "SGD"}})
    keras_half = record(
        "tf", world=2, config={"optimizer": {"type": "SGD", "global_clipnorm": 0.5}}
    )
    unrun = record("torch", world=2, script=never, config=_clipped())
    measured = record("torch", world=2, config=_clipped(("clip_grad_norm_", "inf")))
    one = record("torch", world=2, script=never, config=_clipped(("clip_grad_norm_", 1.0)))
    for run in (unrun, measured):  # a clip that did not run, a norm only measured: no clipping
        assert not [f for f in diagnose(run, keras_plain) if "clipping" in f.name]
        assert check_settings(run, keras_plain).status == PASS
    (f,) = [f for f in diagnose(one, keras_half) if "clipping" in f.name]
    assert f.name == "different gradient clipping"
    assert "A clips by global norm 1 (clip_grad_norm_(1) on 4 of 4 steps" in f.evidence
    assert "B by global norm 0.5 (global_clipnorm=0.5)" in f.evidence
    assert f.fixes[0].endswith("-> global_clipnorm=1"), f.fixes  # the value (issue 48 item 4)
    assert check_settings(one, keras_half).status == FAIL
    value = record("torch", world=2, config=_clipped(("clip_grad_value_", 1.0)))
    assert check_settings(one, value).status == FAIL  # by norm against by value
    (g,) = [f for f in diagnose(one, keras_plain) if "clipping" in f.name]
    assert "A clips its gradients (clip_grad_norm_(1) on 4 of 4 steps" in g.evidence
    assert g.fixes[0].endswith("the optimizer's global_clipnorm=1")
    same = record("tf", world=2, config={"optimizer": {"type": "SGD", "global_clipnorm": 1.0}})
    assert check_settings(one, same).status == PASS


def test_a_clipped_gradient_is_no_evidence_of_the_loss_reduction():
    """A gradient norm twice the other's at world 2 names a sum over the replicas, unless a
    run clips: the clipped norm is the limit, not the reduction's (the third round's false
    finding: 2.10x from a clip at 1.0)."""
    name = "per-replica loss reduction (local mean vs global batch)"
    summed = record("torch", world=2, grad_norm=2.0)
    assert [f.name for f in diagnose(summed, record("torch", world=2))] == [name]
    clipped = record("torch", world=2, config=_clipped(("clip_grad_norm_", 1.0)))
    assert name not in [f.name for f in diagnose(summed, clipped)]
    assert "gradient clipping in one run only" in [f.name for f in diagnose(summed, clipped)]


def test_replicas_feeding_each_others_rows_are_named_in_either_framework():
    """No DistributedSampler in a DDP script, AutoShardPolicy.OFF: every replica the same rows
    (the third round's k_OFF pair was only 'different data')."""
    for framework, needle in (("torch", "DistributedSampler(dataset)"), ("tf", "AutoShardPolicy")):
        same = with_rows(record(framework, world=2), lambda s, r: [f"{s:08x}{0:08x}"])
        found = {f.name: f for f in diagnose(record(framework, world=2), same)}
        f = found.pop("replicas feed the same rows (no sharding)")
        assert "B's 2 replicas feed each other's rows at 4 of 4 steps" in f.evidence
        assert needle in f.fixes[0] and "different data" not in found, list(found)
        again = with_rows(record(framework, world=2), lambda s, r: [f"{s:08x}{0:08x}"])
        assert diagnose(same, again) == []  # both alike: no difference


def test_a_different_auto_shard_policy_is_named_where_the_rows_differ():
    """FILE against DATA on a dataset of files: the same rows in another split, which the
    report called 'shuffle seeds'; AUTO against DATA on tensors feeds the same rows: nothing."""

    def keras(policy: str, swap: bool = False) -> Recorded:
        data = {"data": {"kind": "tf.data.Dataset", "workers": 2, "auto_shard_policy": policy}}
        run = record("tf", world=2, config=data)
        return with_rows(run, lambda s, r: [f"{s:08x}{(1 - r if swap else r):08x}"])

    found = {f.name: f for f in diagnose(keras("DATA"), keras("FILE", swap=True))}
    f = found.pop("different tf.data auto-shard policy")
    assert "A's workers split its dataset by AutoShardPolicy.DATA, B's by FILE" in f.evidence
    assert f.fixes[0].endswith("auto_shard_policy = AutoShardPolicy.DATA")
    assert "shuffle seeds" not in found, list(found)
    assert diagnose(keras("AUTO"), keras("DATA")) == []


def test_parameters_frozen_or_stepped_by_another_optimizer_in_one_run_only():
    """A frozen backbone against a trained one (by name in one framework, by values across
    them); parameters outside both recorded optimizers that one run's second optimizer moves
    (the third round's t_freeze and t_subset/t_twoopt pairs named nothing)."""
    trained = record("torch")
    body = record("torch", config={"frozen": {"body.weight": 12, "body.bias": 4}})
    (f,) = [f for f in diagnose(trained, body) if f.name == "parameters frozen in one run only"]
    assert "B freezes body.bias, body.weight (16 values) where the other run trains them" in (
        f.evidence
    )
    assert check_settings(trained, body).status == FAIL
    keras_body = record("tf", config={"frozen": {"body.weight": 12, "body.bias": 4}})
    assert check_settings(body, keras_body).status == PASS  # the same values frozen
    (g,) = [f for f in diagnose(trained, keras_body) if "frozen" in f.name]
    assert "B freezes body.bias, body.weight (16 values) where the other run freezes 0" in (
        g.evidence
    )
    held = {"not_held": {"names": ["w"], "of": 2}}
    alone, stepped = record("torch", config=held), record("torch", config=held)
    stepped.weights_final = {"w": np.ones(2, np.float32)}
    (h,) = [f for f in diagnose(alone, stepped) if "outside" in f.name]
    assert h.name == "parameters outside the recorded optimizer updated in one run only"
    assert "B's w change during the run" in h.evidence and h.fixes[0].startswith("A (torch)")
    assert check_settings(alone, record("torch", config=held)).status == PASS


def test_a_keras_fit_resumed_after_epoch_1_is_named_against_a_fresh_run():
    """A BackupAndRestore that resumed (the third round's k_resume): named, not only a FAIL of
    the initial weights; two resumed runs, or a torch script numbering its epochs, are not."""
    resumed, fresh = record("tf", first_epoch=2), record("tf")
    assert diagnose(fresh, resumed) == []  # the same weights: initial_epoch only numbers epochs
    resumed.weights_init = {"w": np.ones(2, np.float32)}  # a checkpoint's
    (f,) = [f for f in diagnose(fresh, resumed) if f.step == 0]
    assert f.name == "a resumed run against a fresh one"
    assert "B's fit begins at epoch 2" in f.evidence
    again = record("tf", first_epoch=2)
    again.weights_init = resumed.weights_init
    assert diagnose(resumed, again) == []
    numbered = record("torch", first_epoch=2)
    numbered.weights_init = resumed.weights_init
    assert not [f for f in diagnose(numbered, record("torch")) if "resumed" in f.name]

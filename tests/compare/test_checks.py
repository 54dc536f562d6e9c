"""Unit tests of every compare check and of the diagnosis, on synthetic run directories."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dualtrain.compare import TOLERANCES, compare_dirs, tolerance_for
from dualtrain.compare import checks as C
from dualtrain.compare import diagnose as D
from dualtrain.record import read_run
from dualtrain.spec import from_dict
from dualtrain.weights import init_weights, perturb_ulp
from tests.compare.synth import base_loss, base_spec, make_run, noisy


@pytest.fixture
def trio(tmp_path):
    """Two runs that agree to rounding, and A's twin, which drifts about as much."""
    a = make_run(tmp_path / "a", loss=noisy(1e-7, 1, grow=0.03), final_noise=1e-6, noise_seed=1)
    b = make_run(tmp_path / "b", backend="tf", loss=noisy(1e-7, 2, grow=0.03), final_noise=1e-6,
                 noise_seed=2)
    init = perturb_ulp(init_weights(from_dict(base_spec()).model, 0))
    t = make_run(tmp_path / "twin", loss=noisy(1e-7, 3, grow=0.03), final_noise=1e-6, noise_seed=3,
                 init=init)
    return a, b, t


def by_name(checks, name):
    return next(c for c in checks if c.name == name)


def test_matching_runs_pass_every_check(trio):
    a, b, t = trio
    cmp = compare_dirs(a, b, t)
    failed = [(c.name, c.detail) for c in cmp.checks if not c.passed]
    assert not failed, failed
    assert cmp.passed and cmp.diagnosis.passed and cmp.diagnosis.cause is None
    assert [c.name for c in cmp.checks] == ["spec", "sharding", "init_weights", "lr", "loss_scale",
                                            "skipped", "loss_early", "trajectory", "final_weights",
                                            "eval", "throughput"]
    traj = cmp.check("trajectory")
    assert traj.unit == "x noise floor" and "120 of 120 steps" in traj.detail


def test_shifted_shards_name_sample_ids_at_the_right_step(tmp_path):
    shift = 37
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b", backend="tf", shard_salt=lambda s: "x" if s >= shift else "",
                 loss=lambda s: base_loss(s) + (0.01 if s >= shift else 0.0))
    cmp = compare_dirs(a, b)
    shard = cmp.check("sharding")
    assert not shard.passed and shard.first_step == shift
    assert shard.value == 2 * (120 - shift + 1)  # every replica of every step from the shift on
    assert cmp.diagnosis.first_divergent_step == shift
    assert cmp.diagnosis.cause == D.IDS
    assert cmp.check("loss_early").first_step == shift


def test_count_mismatch_is_a_sharding_failure(tmp_path):
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b", spec=base_spec(**{"data.batch_size": 66}))
    c = C.check_sharding(read_run(a), read_run(b))
    assert not c.passed and c.first_step == 1 and "count 32" in c.detail and "count 33" in c.detail


def test_missing_steps_fail_sharding_and_lr(tmp_path):
    a = make_run(tmp_path / "a", steps=120)
    b = make_run(tmp_path / "b", steps=100)
    ra, rb = read_run(a), read_run(b)
    assert not C.check_sharding(ra, rb).passed
    lr = C.check_lr(ra, rb)
    assert not lr.passed and lr.first_step == 101 and "only in" in lr.detail


def test_different_lr_is_named(tmp_path):
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b", spec=base_spec(**{"optimizer.lr": 0.1}), lr=lambda s: 0.1,
                 loss=lambda s: base_loss(s) + (0.02 if s >= 2 else 0.0))
    cmp = compare_dirs(a, b)
    lr = cmp.check("lr")
    assert not lr.passed and lr.first_step == 1 and lr.value == pytest.approx(0.5)
    assert not cmp.check("spec").passed and "optimizer.lr" in cmp.check("spec").detail
    assert cmp.diagnosis.cause == D.LR
    assert cmp.diagnosis.first_divergent_step == 1
    fields = {s["field"] for s in cmp.diagnosis.spec_differences}
    assert "optimizer.lr" in fields


def test_lr_within_relative_tolerance_passes(tmp_path):
    a = make_run(tmp_path / "a", lr=lambda s: 0.05)
    b = make_run(tmp_path / "b", lr=lambda s: 0.05 * (1 + 1e-14))
    assert C.check_lr(read_run(a), read_run(b)).passed
    c = make_run(tmp_path / "c", lr=lambda s: 0.05 * (1 + 1e-9))
    assert not C.check_lr(read_run(a), read_run(c)).passed


def test_different_initial_weights_are_named(tmp_path):
    spec = from_dict(base_spec())
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b", init=perturb_ulp(init_weights(spec.model, 0)),
                 loss=noisy(1e-4, 5))
    cmp = compare_dirs(a, b)
    init = cmp.check("init_weights")
    assert not init.passed and init.first_step == 0 and init.value > 0
    assert "1 element(s) differ" in init.detail
    assert cmp.diagnosis.cause == D.INIT
    assert cmp.diagnosis.first_divergent_step == 1  # loss_early fails at step 1


def test_identical_init_is_exactly_zero(tmp_path):
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    c = C.check_init_weights(read_run(a), read_run(b))
    assert c.passed and c.value == 0.0


def test_another_seed_names_initial_weights_and_sample_ids(tmp_path):
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b", spec=base_spec(seed=1), shard_salt=lambda s: "seed1",
                 loss=noisy(1e-2, 9))
    cmp = compare_dirs(a, b)
    d = cmp.diagnosis
    kinds = [c.kind for c in d.causes]
    assert d.cause == D.INIT and D.IDS in kinds
    assert D.SPEC not in kinds  # the seed difference is explained by the ids and the init
    assert {"field": "seed", "a": 0, "b": 1, "cosmetic": False} in d.spec_differences
    assert d.first_divergent_step == 1


def test_fp16_vs_fp32_spec_is_a_precision_difference(tmp_path):
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b", spec=base_spec(precision={"dtype": "fp16"}),
                 loss_scale=lambda s: 65536.0, loss=noisy(1e-3, 4))
    cmp = compare_dirs(a, b)
    d = cmp.diagnosis
    assert d.cause == D.SPEC
    assert "precision.dtype" in next(c for c in d.causes if c.kind == D.SPEC).evidence
    assert D.SCALE in [c.kind for c in d.causes]
    assert cmp.tolerance.precision == "fp32"  # the strictest row of the two
    assert not cmp.check("loss_scale").passed and cmp.check("loss_scale").first_step == 1


def test_different_skip_decisions_are_loss_scale_decisions(tmp_path):
    spec = base_spec(precision={"dtype": "fp16"})
    a = make_run(tmp_path / "a", spec=spec, loss_scale=lambda s: 65536.0 if s < 10 else 32768.0,
                 skipped=lambda s: s == 9)
    b = make_run(tmp_path / "b", spec=spec, loss_scale=lambda s: 65536.0,
                 loss=lambda s: base_loss(s) + (0.05 if s >= 10 else 0.0))
    cmp = compare_dirs(a, b)
    assert cmp.check("skipped").first_step == 9
    assert cmp.check("loss_scale").first_step == 10
    assert cmp.diagnosis.cause == D.SCALE
    assert cmp.tolerance.precision == "fp16"


def test_numerics_when_everything_recorded_agrees(tmp_path, trio):
    a, _, t = trio
    b = make_run(tmp_path / "b2", backend="tf",
                 loss=lambda s: noisy(1e-7, 2, grow=0.03)(s) + (1e-3 if s >= 80 else 0.0))
    cmp = compare_dirs(a, b, t)
    traj = cmp.check("trajectory")
    assert not traj.passed and traj.first_step == 80
    assert cmp.check("loss_early").passed
    assert cmp.diagnosis.cause == D.NUMERICS and cmp.diagnosis.first_divergent_step == 80


def test_loss_early_tolerance_is_per_precision(tmp_path):
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b", loss=lambda s: base_loss(s) + 5e-5)
    c = C.check_loss_early(read_run(a), read_run(b))
    assert not c.passed and c.tolerance == TOLERANCES["fp32"].loss_early and c.first_step == 1
    spec16 = base_spec(precision={"dtype": "fp16"})
    a16 = make_run(tmp_path / "a16", spec=spec16)
    b16 = make_run(tmp_path / "b16", spec=spec16, loss=lambda s: base_loss(s) + 5e-5)
    assert C.check_loss_early(read_run(a16), read_run(b16)).passed


def test_loss_early_only_looks_at_the_first_50_steps(tmp_path):
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b", loss=lambda s: base_loss(s) + (1.0 if s > 50 else 0.0))
    c = C.check_loss_early(read_run(a), read_run(b))
    assert c.passed and "steps 1-50" in c.detail


def test_nan_loss_fails(tmp_path):
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b", loss=lambda s: math.nan if s == 3 else base_loss(s))
    ra, rb = read_run(a), read_run(b)
    early = C.check_loss_early(ra, rb)
    assert not early.passed and early.first_step == 3 and math.isinf(early.value)
    assert not C.check_trajectory(ra, rb).passed


def test_trajectory_without_twin_uses_the_fixed_tolerance(tmp_path):
    a = make_run(tmp_path / "a")
    tol = TOLERANCES["fp32"].traj_fixed
    b = make_run(tmp_path / "b", loss=lambda s: base_loss(s) + (tol * 2 if s == 100 else tol / 2))
    c = C.check_trajectory(read_run(a), read_run(b))
    assert "no noise-floor twin" in c.detail and c.tolerance == tol
    assert not c.passed and c.first_step == 100


def test_trajectory_envelope_is_a_running_max_with_look_ahead(tmp_path):
    # The twin drifts by 1e-3 at step 60 only; the cross diff is 5e-3 from some step on. A pointwise
    # noise floor would fail every step after 60; the running max keeps 10 x 1e-3 as the bound, and
    # the look-ahead lets the cross pair part up to traj_lag steps before the twin does.
    a = make_run(tmp_path / "a")
    t = make_run(tmp_path / "t", loss=lambda s: base_loss(s) + (1e-3 if s == 60 else 0.0))
    ra, rt = read_run(a), read_run(t)
    tol = TOLERANCES["fp32"]

    def cross_from(start):
        b = make_run(tmp_path / f"b{start}", loss=lambda s: base_loss(s) + (5e-3 if s >= start else 0.0))
        return C.check_trajectory(ra, read_run(b), rt, tol)

    tr = C.trajectory(ra, read_run(make_run(tmp_path / "b", loss=base_loss)), rt, tol)
    assert np.all(np.diff(tr.envelope) >= 0)
    assert tr.envelope[60 - tol.traj_lag - 1] > 5e-4  # index = step - 1
    assert tr.envelope[60 - tol.traj_lag - 2] == 0.0
    assert cross_from(60).passed
    assert cross_from(60 - tol.traj_lag).passed
    early = cross_from(60 - tol.traj_lag - 1)  # 5e-3 where the bound is 10 x the 1e-6 floor
    assert not early.passed and early.first_step == 60 - tol.traj_lag - 1


def test_short_twin_checks_the_rest_against_the_fixed_tolerance(tmp_path, trio):
    a, b, _ = trio
    t = make_run(tmp_path / "short", steps=60, loss=noisy(1e-7, 3, grow=0.03))
    c = C.check_trajectory(read_run(a), read_run(b), read_run(t))
    assert c.passed
    assert "60 of 120 steps" in c.detail and "steps 61-120 (no twin data)" in c.detail


def test_final_weights_against_twin_and_fixed(tmp_path, trio):
    a, b, t = trio
    ra, rb, rt = read_run(a), read_run(b), read_run(t)
    assert C.check_final_weights(ra, rb, rt).passed
    far = make_run(tmp_path / "far", final_noise=1e-3, noise_seed=7)
    c = C.check_final_weights(ra, read_run(far), rt)
    assert not c.passed and c.value > c.tolerance and "over:" in c.detail
    fixed = C.check_final_weights(ra, read_run(far))
    assert fixed.unit == "rel" and "no noise-floor twin" in fixed.detail
    assert fixed.passed == (fixed.value <= TOLERANCES["fp32"].weights_fixed)


def test_eval_accuracy_difference(tmp_path):
    a = make_run(tmp_path / "a", accuracy=lambda s: 0.95)
    near = make_run(tmp_path / "near", accuracy=lambda s: 0.952)
    far_mid = make_run(tmp_path / "mid", accuracy=lambda s: 0.945 if s == 40 else 0.95)
    far_end = make_run(tmp_path / "end", accuracy=lambda s: 0.954 if s == 120 else 0.95)
    ra = read_run(a)
    ok = C.check_eval(ra, read_run(near))
    assert ok.passed and ok.value == pytest.approx(0.2)
    mid = C.check_eval(ra, read_run(far_mid))
    assert not mid.passed and mid.first_step == 40
    end = C.check_eval(ra, read_run(far_end))
    assert not end.passed and end.value == pytest.approx(0.4)


def test_throughput_is_informational(tmp_path):
    a = make_run(tmp_path / "a", samples_per_s=1000.0)
    b = make_run(tmp_path / "b", backend="tf", samples_per_s=50.0)
    c = C.check_throughput(read_run(a), read_run(b))
    assert c.passed and c.informational and c.value == pytest.approx(0.05)


def test_spec_check_ignores_cosmetic_fields(tmp_path):
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b", spec=base_spec(name="other", output_dir="elsewhere",
                                                **{"train.log_every": 7}))
    c = C.check_spec(read_run(a), read_run(b))
    assert c.passed and "ignored" in c.detail and "name" in c.detail


def test_gradients_and_parameters_are_ranked(tmp_path):
    spec = from_dict(base_spec())
    w = init_weights(spec.model, 0)
    ga = {k: np.ones_like(v) for k, v in w.items()}
    gb = {k: (v * 1.5 if k == "3.weight" else v) for k, v in ga.items()}
    a = make_run(tmp_path / "a", grads={2: ga})
    b = make_run(tmp_path / "b", grads={2: gb}, loss=lambda s: base_loss(s) + (1e-3 if s >= 2 else 0),
                 final_noise=1e-2)
    cmp = compare_dirs(a, b)
    d = cmp.diagnosis
    assert d.gradient_step == 2 and d.top_gradients[0]["name"] == "3.weight"
    assert d.top_gradients[0]["rel_diff"] == pytest.approx(0.5)
    rel = [p["rel_diff"] for p in d.top_parameters]
    assert rel == sorted(rel, reverse=True) and len(rel) == 4


def test_tolerance_for_picks_the_strictest():
    assert tolerance_for("bf16", "fp16").precision == "fp16"
    assert tolerance_for("fp32", "bf16").precision == "fp32"
    assert tolerance_for("bf16").precision == "bf16"
    order = [TOLERANCES[p].loss_early for p in ("fp32", "fp16", "bf16")]
    assert order == sorted(order)


def test_a_collapsed_twin_falls_back_to_the_fixed_tolerances(tmp_path):
    # A twin whose one-ulp change was rounded away reproduces A exactly: it measures no noise floor,
    # so the checks must not read "10 x 0" (or 10 x the tiny floor) as the bound.
    a = make_run(tmp_path / "a")
    twin = make_run(tmp_path / "twin")  # bit-identical to A
    tol = TOLERANCES["fp32"]
    b = make_run(tmp_path / "b", loss=lambda s: base_loss(s) + tol.traj_fixed / 2,
                 final_noise=1e-4, noise_seed=3)
    ra, rb, rt = read_run(a), read_run(b), read_run(twin)
    traj = C.check_trajectory(ra, rb, rt, tol)
    assert "never left run A" in traj.detail and traj.tolerance == tol.traj_fixed
    assert traj.passed and traj.unit == "abs"
    fw = C.check_final_weights(ra, rb, rt, tol)
    assert "equal A's" in fw.detail and fw.tolerance == tol.weights_fixed and fw.passed


def test_twin_element_is_the_largest_output_weight():
    from dualtrain.compare.backends import twin_element

    w = init_weights(from_dict(base_spec()).model, 0)
    name, index = twin_element(w)
    assert name == "3.weight"  # the output layer of flatten-dense-relu-dense
    assert abs(w[name].flat[index]) == np.abs(w[name]).max()

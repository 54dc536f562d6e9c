"""Unit tests of every compare check and of the diagnosis, on synthetic run directories."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dualtrain.core.weights import init_weights
from dualtrain.parity import REFERENCE, TOLERANCES, compare_dirs, tolerance_for
from dualtrain.parity import checks as C
from dualtrain.parity import diagnose as D
from dualtrain.parity.checks.declared import CHECKS, declared
from dualtrain.records.record import read_run
from dualtrain.spec import from_dict
from testkit.synth import (
    base_loss,
    base_spec,
    fp64_spec,
    make_run,
    noisy,
    quad,
)

NAMES = [
    "spec",
    "sharding",
    "init_weights",
    "lr",
    "loss_scale",
    "skipped",
    "reference_loss",
    "reference_weights",
    "reference_eval",
    "trajectory",
    "final_weights",
    "eval",
    "local_loss",
    "local_grad",
    "local_update",
    "convergence",
    "throughput",
]


def test_every_check_a_compare_makes_is_declared_with_its_group_in_order(four):
    # dualtrain/parity/checks/declared.py: the report's order and docs/reference.md's table
    a, b, ra, rb = four
    order = [d.name for d in CHECKS]
    for cmp in (compare_dirs(a, b, (ra, rb)), compare_dirs(a, b), compare_dirs(ra, rb)):
        names = [c.name for c in cmp.checks]
        assert names == [n for n in order if n in names]
        assert [c.group for c in cmp.checks] == [declared(n).group for n in names]


def test_matching_runs_pass_every_check(four):
    a, b, ra, rb = four
    cmp = compare_dirs(a, b, (ra, rb))
    failed = [(c.name, c.detail) for c in cmp.checks if not c.passed]
    assert not failed, failed
    assert cmp.passed and cmp.diagnosis.passed and cmp.diagnosis.cause is None
    assert [c.name for c in cmp.checks] == NAMES
    assert {c.group for c in cmp.checks[:6]} == {C.RECORDS}
    assert {c.group for c in cmp.checks[6:9]} == {C.SEMANTICS}
    traj = cmp.check("trajectory")
    assert traj.unit == "x rounding" and "120 of 120 steps" in traj.detail
    ref = cmp.check("reference_loss")
    assert ref.ran and ref.value < 1e-14 and ref.tolerance == REFERENCE.loss_abs


def test_without_reference_the_semantic_checks_did_not_run(four):
    a, b, _, _ = four
    cmp = compare_dirs(a, b)
    assert cmp.passed and [c.name for c in cmp.checks] == NAMES
    for name in ("reference_loss", "reference_weights", "reference_eval"):
        c = cmp.check(name)
        assert not c.ran and c.informational and "semantics were not checked" in c.detail
    assert "fixed tolerance" in cmp.check("trajectory").detail


def test_reference_pair_disagreement_is_semantics(tmp_path):
    # The fp64 pair parts by 1e-9 from step 30: far above fp64 rounding, far below fp32's.
    a, b, ra, rb = quad(
        tmp_path, ref_b_loss=lambda s: noisy(1e-15, 12)(s) + (1e-9 if s >= 30 else 0)
    )
    cmp = compare_dirs(a, b, (ra, rb))
    ref = cmp.check("reference_loss")
    assert not ref.passed and ref.first_step == 30
    assert cmp.check("trajectory").passed  # fp32 cannot see it
    d = cmp.diagnosis
    assert d.cause == D.SEMANTICS and d.category == D.SEMANTICS and d.first_divergent_step == 30
    assert "reference pair disagrees" in d.causes[0].evidence


def test_reference_weights_and_eval(tmp_path):
    ra = make_run(tmp_path / "ra", spec=fp64_spec())
    same = make_run(tmp_path / "same", backend="tf", spec=fp64_spec(), final_noise=1e-15)
    far = make_run(tmp_path / "far", backend="tf", spec=fp64_spec(), final_noise=1e-9)
    acc = make_run(
        tmp_path / "acc",
        backend="tf",
        spec=fp64_spec(),
        accuracy=lambda s: 0.9 + (1e-3 if s == 80 else 0.0),
    )
    ref = lambda x: C.Reference(read_run(ra), read_run(x))  # noqa: E731
    assert C.check_reference_weights(ref(same)).passed
    w = C.check_reference_weights(ref(far))
    assert not w.passed and "over:" in w.detail
    e = C.check_reference_eval(ref(acc))
    assert not e.passed and e.first_step == 80 and "accuracy differs" in e.detail
    # fp32 weights are no reference: a float64 pair is required
    f32 = make_run(tmp_path / "f32", backend="tf")
    assert not C.check_reference_weights(C.Reference(read_run(f32), read_run(f32))).passed


def test_two_fp64_runs_are_their_own_reference(tmp_path):
    a = make_run(tmp_path / "a", spec=fp64_spec(), loss=noisy(1e-15, 1))
    b = make_run(tmp_path / "b", backend="tf", spec=fp64_spec(), loss=noisy(1e-15, 2))
    cmp = compare_dirs(a, b)
    assert cmp.passed and cmp.check("reference_loss").ran and cmp.tolerance.precision == "fp64"
    assert not cmp.check("trajectory").ran
    c = make_run(tmp_path / "c", backend="tf", spec=fp64_spec(), loss=noisy(1e-8, 2))
    bad = compare_dirs(a, c)
    assert not bad.passed and bad.diagnosis.category == D.SEMANTICS


def test_with_a_reference_eval_allows_each_backends_own_distance_to_fp64(tmp_path):
    # B's accuracy is 0.8 pp off A's from step 80, but so is B's from its own fp64 run (short,
    # chaotic runs do that): the fp64 pair agrees, so the difference is rounding, and the check
    # passes (as does convergence: within fp32's 1 pp of its fp64 run). The same pair without a
    # reference fails the fixed 0.3 pp and says semantics were not checked.
    def drop(s):
        return 0.9 - (0.008 if s >= 80 else 0.0)

    a, b, ra, rb = quad(tmp_path, accuracy=drop)
    cmp = compare_dirs(a, b, (ra, rb))
    ev = cmp.check("eval")
    assert cmp.passed and ev.value == pytest.approx(0.8) and ev.tolerance == pytest.approx(8.0)
    alone = compare_dirs(a, b)
    ev = alone.check("eval")
    assert not ev.passed and ev.first_step == 80 and ev.tolerance == TOLERANCES["fp32"].eval_pp
    d = alone.diagnosis
    assert d.cause == D.NUMERICS and d.category == D.NUMERICS and d.first_divergent_step == 80
    assert "FAIL, numerics" in __import__("dualtrain.parity.report", fromlist=["x"]).verdict_line(
        alone
    )


def test_reference_runs_must_be_the_compared_spec_in_fp64(tmp_path, four):
    from dualtrain.errors import UserError

    a, b, ra, _ = four
    other = make_run(tmp_path / "other", backend="tf", spec=fp64_spec(seed=3))
    with pytest.raises(UserError, match="differs in seed"):
        compare_dirs(a, b, (ra, other))


def test_numerics_without_reference_says_semantics_are_unchecked(tmp_path):
    a = make_run(tmp_path / "a")
    b = make_run(
        tmp_path / "b", backend="tf", loss=lambda s: base_loss(s) + (0.1 if s >= 80 else 0.0)
    )
    cmp = compare_dirs(a, b)
    traj = cmp.check("trajectory")
    assert not traj.passed and traj.first_step == 80
    assert (
        cmp.diagnosis.cause == D.NUMERICS
        and "no fp64 reference ran" in cmp.diagnosis.causes[0].evidence
    )


def test_nan_loss_fails(tmp_path):
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b", loss=lambda s: math.nan if s == 3 else base_loss(s))
    ra, rb = read_run(a), read_run(b)
    traj = C.check_trajectory(ra, rb)
    assert not traj.passed and traj.first_step == 3 and math.isinf(traj.value)


def test_trajectory_without_reference_uses_the_fixed_tolerance(tmp_path):
    a = make_run(tmp_path / "a")
    tol = TOLERANCES["fp32"].traj_fixed
    b = make_run(tmp_path / "b", loss=lambda s: base_loss(s) + (tol * 2 if s == 100 else tol / 2))
    c = C.check_trajectory(read_run(a), read_run(b))
    assert "no fp64 reference" in c.detail and c.tolerance == tol
    assert not c.passed and c.first_step == 100


def test_trajectory_bound_is_the_farther_backends_distance_to_fp64(tmp_path):
    # A sits on its fp64 run. B sits on its own fp64 run except at step 60 (1e-3 off), and B's pair
    # moves 5e-3 away from A's pair from step `start` on (a semantic difference the reference check
    # reports; here only the trajectory's arithmetic is under test). The bound is 10 x the running
    # max of the farther backend's distance to fp64: the 1e-6 floor before step 60, 1e-3 from it.
    tol = TOLERANCES["fp32"]
    ra = read_run(make_run(tmp_path / "ra", spec=fp64_spec()))
    a = read_run(make_run(tmp_path / "a"))

    def with_start(start):
        shift = lambda s: 5e-3 if s >= start else 0.0  # noqa: E731
        rb = make_run(
            tmp_path / f"rb{start}",
            backend="tf",
            spec=fp64_spec(),
            loss=lambda s: base_loss(s) + shift(s),
        )
        b = make_run(
            tmp_path / f"b{start}",
            backend="tf",
            loss=lambda s: base_loss(s) + shift(s) + (1e-3 if s == 60 else 0.0),
        )
        return read_run(b), C.Reference(ra, read_run(rb))

    b, ref = with_start(10**6)
    t = C.trajectory(a, b, ref, tol)
    assert np.all(np.diff(t.noise) >= 0)
    assert t.noise[59] == pytest.approx(1e-3) and t.noise[58] < 1e-6  # index = step - 1
    assert np.allclose(t.allowed[:59], tol.factor * tol.traj_abs_floor)
    ok = C.check_trajectory(a, *with_start(61), tol)
    assert ok.passed and ok.unit == "x rounding"
    early = C.check_trajectory(a, *with_start(50), tol)
    assert not early.passed and early.first_step == 50


def test_short_reference_checks_the_rest_against_the_fixed_tolerance(tmp_path, four):
    a, b, _, rb = four
    ra = make_run(tmp_path / "short", spec=fp64_spec(), steps=60)
    c = C.check_trajectory(read_run(a), read_run(b), C.Reference(read_run(ra), read_run(rb)))
    assert c.passed
    assert "60 of 120 steps" in c.detail and "steps 61-120 (no fp64 data)" in c.detail


def test_final_weights_against_the_reference_and_fixed(tmp_path, four):
    a, b, ra, rb = four
    ref = C.Reference(read_run(ra), read_run(rb))
    r_a, r_b = read_run(a), read_run(b)
    assert C.check_final_weights(r_a, r_b, ref).passed
    # B far from A but on its own fp64 run, which is far from A's: the weights check fails (and so
    # would the reference pair: by the triangle inequality it is the only way to exceed the bound).
    far = make_run(tmp_path / "far", final_noise=1e-3, noise_seed=7)
    far64 = make_run(tmp_path / "far64", spec=fp64_spec(), final_noise=1e-3, noise_seed=7)
    c = C.check_final_weights(r_a, read_run(far), C.Reference(ref.a, read_run(far64)))
    assert not c.passed and c.value > c.tolerance and "over:" in c.detail
    fixed = C.check_final_weights(r_a, read_run(far))
    assert fixed.unit == "rel" and "no fp64 reference" in fixed.detail
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
    b = make_run(
        tmp_path / "b",
        spec=base_spec(name="other", output_dir="elsewhere", **{"train.log_every": 7}),
    )
    c = C.check_spec(read_run(a), read_run(b))
    assert c.passed and "ignored" in c.detail and "name" in c.detail


def test_gradients_and_parameters_are_ranked(tmp_path):
    spec = from_dict(base_spec())
    w = init_weights(spec.model, 0)
    ga = {k: np.ones_like(v) for k, v in w.items()}
    gb = {k: (v * 1.5 if k == "3.weight" else v) for k, v in ga.items()}
    a = make_run(tmp_path / "a", grads={2: ga})
    b = make_run(
        tmp_path / "b",
        grads={2: gb},
        loss=lambda s: base_loss(s) + (1e-3 if s >= 2 else 0),
        final_noise=1e-2,
    )
    cmp = compare_dirs(a, b)
    d = cmp.diagnosis
    assert d.gradient_step == 2 and d.top_gradients[0]["name"] == "3.weight"
    assert d.top_gradients[0]["rel_diff"] == pytest.approx(0.5)
    rel = [p["rel_diff"] for p in d.top_parameters]
    assert rel == sorted(rel, reverse=True) and len(rel) == 4


def test_tolerance_for_picks_the_strictest():
    assert tolerance_for("bf16", "fp16").precision == "fp16"
    assert tolerance_for("fp32", "bf16").precision == "fp32"
    assert tolerance_for("fp64", "fp32").precision == "fp64"
    assert tolerance_for("bf16").precision == "bf16"
    order = [TOLERANCES[p].traj_abs_floor for p in ("fp64", "fp32", "fp16", "bf16")]
    assert order == sorted(order)

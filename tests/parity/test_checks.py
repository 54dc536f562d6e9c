"""Unit tests of every compare check and of the diagnosis, on synthetic run directories."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dualtrain.core.weights import init_weights
from dualtrain.parity import REFERENCE, TOLERANCES, compare_dirs, tolerance_for
from dualtrain.parity import checks as C
from dualtrain.parity import diagnose as D
from dualtrain.records.record import read_run
from dualtrain.spec import from_dict
from testkit.synth import (
    add_probes,
    base_loss,
    base_spec,
    fp64_spec,
    make_run,
    noisy,
    quad,
    set_kernels,
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


def one_ulp_moved(weights):
    out = {k: v.copy() for k, v in weights.items()}
    first = sorted(out)[0]
    flat = out[first].reshape(-1)
    flat[0] = np.nextafter(flat[0], np.float32(np.inf), dtype=np.float32)
    return out


@pytest.fixture
def four(tmp_path):
    """A and B agree to fp32 rounding; their fp64 reference pair agrees to fp64 rounding."""
    return quad(tmp_path)


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


def test_shifted_shards_name_sample_ids_at_the_right_step(tmp_path):
    shift = 37
    a = make_run(tmp_path / "a")
    b = make_run(
        tmp_path / "b",
        backend="tf",
        shard_salt=lambda s: "x" if s >= shift else "",
        loss=lambda s: base_loss(s) + (0.01 if s >= shift else 0.0),
    )
    cmp = compare_dirs(a, b)
    shard = cmp.check("sharding")
    assert not shard.passed and shard.first_step == shift
    assert shard.value == 2 * (120 - shift + 1)  # every replica of every step from the shift on
    assert cmp.diagnosis.first_divergent_step == shift
    assert cmp.diagnosis.cause == D.IDS and cmp.diagnosis.category == D.SEMANTICS


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
    b = make_run(
        tmp_path / "b",
        spec=base_spec(**{"optimizer.lr": 0.1}),
        lr=lambda s: 0.1,
        loss=lambda s: base_loss(s) + (0.02 if s >= 2 else 0.0),
    )
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
    b = make_run(
        tmp_path / "b",
        init=one_ulp_moved(init_weights(spec.model, 0)),
        loss=lambda s: base_loss(s) + 0.1,
    )
    cmp = compare_dirs(a, b)
    init = cmp.check("init_weights")
    assert not init.passed and init.first_step == 0 and init.value > 0
    assert "1 element(s) differ" in init.detail
    assert cmp.diagnosis.cause == D.INIT
    assert cmp.diagnosis.first_divergent_step == 1  # the trajectory fails at step 1


def test_identical_init_is_exactly_zero(tmp_path):
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    c = C.check_init_weights(read_run(a), read_run(b))
    assert c.passed and c.value == 0.0


def test_another_seed_names_initial_weights_and_sample_ids(tmp_path):
    a = make_run(tmp_path / "a")
    b = make_run(
        tmp_path / "b", spec=base_spec(seed=1), shard_salt=lambda s: "seed1", loss=noisy(1e-2, 9)
    )
    cmp = compare_dirs(a, b)
    d = cmp.diagnosis
    kinds = [c.name for c in d.causes]
    assert d.cause == D.INIT and D.IDS in kinds
    assert D.SPEC not in kinds  # the seed difference is explained by the ids and the init
    assert {"field": "seed", "a": 0, "b": 1, "cosmetic": False} in d.spec_differences
    assert d.first_divergent_step == 1


def test_fp16_vs_fp32_spec_is_a_precision_difference(tmp_path):
    a = make_run(tmp_path / "a")
    b = make_run(
        tmp_path / "b",
        spec=base_spec(precision={"dtype": "fp16"}),
        loss_scale=lambda s: 65536.0,
        loss=noisy(1e-3, 4),
    )
    cmp = compare_dirs(a, b)
    d = cmp.diagnosis
    assert d.cause == D.SPEC
    assert "precision.dtype" in next(c for c in d.causes if c.name == D.SPEC).evidence
    assert D.SCALE in [c.name for c in d.causes]
    assert cmp.tolerance.precision == "fp32"  # the strictest row of the two
    assert not cmp.check("loss_scale").passed and cmp.check("loss_scale").first_step == 1


def test_different_skip_decisions_are_loss_scale_decisions(tmp_path):
    spec = base_spec(precision={"dtype": "fp16"})
    a = make_run(
        tmp_path / "a",
        spec=spec,
        loss_scale=lambda s: 65536.0 if s < 10 else 32768.0,
        skipped=lambda s: s == 9,
    )
    b = make_run(
        tmp_path / "b",
        spec=spec,
        loss_scale=lambda s: 65536.0,
        loss=lambda s: base_loss(s) + (0.05 if s >= 10 else 0.0),
    )
    cmp = compare_dirs(a, b)
    assert cmp.check("skipped").first_step == 9
    assert cmp.check("loss_scale").first_step == 10
    assert cmp.diagnosis.cause == D.SCALE
    assert cmp.tolerance.precision == "fp16"


def _fp16_pair(tmp_path, *, other_at_9: float, skipper_at_9: float = math.inf):
    """A skips step 9 (its scale halves after it), B does not; B's largest gradient element at step
    9 stands at ``other_at_9`` of the fp16 maximum under A's scale; A's own is ``skipper_at_9``."""
    spec = base_spec(precision={"dtype": "fp16"})
    scale = 65536.0
    a = make_run(
        tmp_path / "a",
        spec=spec,
        loss_scale=lambda s: scale if s < 10 else scale / 2,
        skipped=lambda s: s == 9,
        grad_amax=lambda s: skipper_at_9 if s == 9 else 0.3 * 65504.0 / scale,
    )
    b = make_run(
        tmp_path / "b",
        backend="tf",
        spec=spec,
        loss_scale=lambda s: scale,
        grad_amax=lambda s: (other_at_9 if s == 9 else 0.3) * 65504.0 / scale,
    )
    return compare_dirs(a, b)


def test_fp16_skip_decisions_may_part_at_the_overflow_threshold(tmp_path):
    # Step 9: A overflowed and B's gradient stood at 0.8 of the fp16 maximum (within one growth
    # factor of overflowing): rounding at the threshold. After it each run's scale follows its own
    # decisions by GradScaler's rule.
    cmp = _fp16_pair(tmp_path, other_at_9=0.8)
    assert cmp.check("skipped").passed, cmp.check("skipped").detail
    assert "0.80 of the fp16 maximum" in cmp.check("skipped").detail
    assert cmp.check("loss_scale").passed, cmp.check("loss_scale").detail


def test_fp16_skip_decisions_that_part_away_from_the_threshold_fail(tmp_path):
    # B's gradient was at 0.2 of the fp16 maximum: no rounding explains A's skip.
    cmp = _fp16_pair(tmp_path, other_at_9=0.2)
    assert not cmp.check("skipped").passed and cmp.check("skipped").first_step == 9
    assert "not at the overflow threshold" in cmp.check("skipped").detail
    assert not cmp.check("loss_scale").passed
    # A skip without a non-finite gradient of its own (a spurious skip) fails even at the threshold.
    cmp = _fp16_pair(tmp_path / "spurious", other_at_9=0.9, skipper_at_9=1.0)
    assert not cmp.check("skipped").passed
    assert "own gradient was finite" in cmp.check("skipped").detail
    # ... and names the skipper's path: its skip rule, not rounding, decided
    assert cmp.check("skipped").culprits == ["torch fp16 path"]
    assert cmp.diagnosis.culprits == ["torch fp16 path"], cmp.diagnosis.summary()


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


# ---- the precision path: one-step probes and convergence -----------------------------------------


def test_local_checks_pass_on_rounding_sized_errors(four):
    a, b, ra, rb = four
    add_probes(ra, {a: {}, b: {}})
    cmp = compare_dirs(a, b, (ra, rb))
    for name in ("local_loss", "local_grad", "local_update", "convergence"):
        c = cmp.check(name)
        assert c.ran and c.passed and not c.culprits, (name, c.detail)
    assert cmp.check("local_grad").data["steps"] == [1, 40, 80]


def test_without_probes_the_local_checks_did_not_run(four):
    a, b, ra, rb = four
    cmp = compare_dirs(a, b, (ra, rb))
    for name in ("local_loss", "local_grad", "local_update"):
        c = cmp.check(name)
        assert not c.ran and "no one-step probes" in c.detail
    assert cmp.check("convergence").ran


@pytest.mark.parametrize("quantity", ["loss", "grad", "update"])
@pytest.mark.parametrize("culprit", ["a", "b"])
def test_a_path_defect_fails_naming_the_backend(four, quantity, culprit):
    # One backend's one-step error is 1e-3 (fp32 rounding is ~1e-7): the check fails and names that
    # backend's path; the other backend's bound comes from the other backend, so the defect cannot
    # widen it.
    a, b, ra, rb = four
    bad = a if culprit == "a" else b
    add_probes(ra, {a: {}, b: {}} | {bad: {quantity: 1e-3}})
    cmp = compare_dirs(a, b, (ra, rb))
    c = cmp.check(f"local_{quantity}")
    who = "torch" if culprit == "a" else "tf"
    assert not c.passed and c.culprits == [f"{who} fp32 path"], c.detail
    others = [n for n in ("local_loss", "local_grad", "local_update") if n != c.name]
    assert all(cmp.check(n).passed for n in others)
    assert cmp.diagnosis.category == D.NUMERICS and cmp.diagnosis.cause == D.PATH
    assert cmp.diagnosis.culprits == [f"{who} fp32 path"]
    from dualtrain.parity.report import verdict_line

    assert verdict_line(cmp).startswith(f"verdict: FAIL, numerics: {who} fp32 path (")


def test_the_cross_bound_does_not_grow_with_the_defect(four):
    a, b, ra, rb = four
    ratios = []
    for e in (1e-5, 1e-4, 1e-3):
        add_probes(ra, {a: {}, b: {"grad": e}})
        ratios.append(compare_dirs(a, b, (ra, rb)).check("local_grad").value)
    assert ratios[1] == pytest.approx(10 * ratios[0], rel=0.05)
    assert ratios[2] == pytest.approx(10 * ratios[1], rel=0.05)


def _bf16_quad(tmp_path):
    ra = make_run(tmp_path / "ra", spec=fp64_spec(), loss=noisy(1e-15, 11))
    rb = make_run(tmp_path / "rb", backend="tf", spec=fp64_spec(), loss=noisy(1e-15, 12))
    spec = base_spec(precision={"dtype": "bf16"})
    a = make_run(tmp_path / "a", spec=spec, loss=noisy(1e-3, 1))
    b = make_run(tmp_path / "b", backend="tf", spec=spec, loss=noisy(1e-3, 2))
    return a, b, ra, rb


U_BF16, S_MATMUL, TRUNCATES = 2.0**-8, 0.5, -0.73
COHERENT = TRUNCATES * U_BF16 * S_MATMUL  # what a truncating bf16 matmul does to this loss
RANDOM = {1: 1.0e-4, 40: -1.5e-4, 80: 0.6e-4}  # both backends' round-to-nearest share, per probe


@pytest.mark.parametrize("calibrated", [True, False])
def test_a_truncating_kernel_is_translated_not_blamed(tmp_path, calibrated):
    # tf's bf16 matmul truncates (its calibration: -0.73 u) and its loss error is what that does
    # to this loss (the directed error x the recorded sensitivity), 10x torch's: with both
    # calibrations the cross bound moves torch's errors onto tf's kernels and tf passes. The same
    # numbers from kernels that round alike would be a tf path 10x off torch's: FAIL.
    a, b, ra, rb = _bf16_quad(tmp_path)
    add_probes(
        ra,
        {a: {"loss": RANDOM.__getitem__}, b: {"loss": lambda s: RANDOM[s] * 0.8 + COHERENT}},
        sensitivity={"matmul": S_MATMUL, "conv": 0.0},
    )
    set_kernels(a, "bf16", {"matmul": 0.0, "conv": 0.0})
    set_kernels(b, "bf16", {"matmul": TRUNCATES if calibrated else 0.0, "conv": 0.0})
    c = compare_dirs(a, b, (ra, rb)).check("local_loss")
    assert c.passed is calibrated, c.detail
    assert c.culprits == ([] if calibrated else ["tf bf16 path"])
    if calibrated:
        assert "matmul torch +0.00 u, tf -0.73 u" in c.detail and c.data["translated"]


def test_the_other_backends_truncation_does_not_lend_a_defect_its_error(tmp_path):
    # torch's loss path is off by 1e-3 (a defect); tf is correct on a truncating kernel. Its raw
    # error (1.4e-3) would let torch's pass (4x); moved onto torch's kernels it is 1e-4: FAIL torch.
    a, b, ra, rb = _bf16_quad(tmp_path)
    add_probes(
        ra,
        {a: {"loss": lambda s: RANDOM[s] + 1e-3}, b: {"loss": lambda s: RANDOM[s] + COHERENT}},
        sensitivity={"matmul": S_MATMUL, "conv": 0.0},
    )
    set_kernels(a, "bf16", {"matmul": 0.0, "conv": 0.0})
    set_kernels(b, "bf16", {"matmul": TRUNCATES, "conv": 0.0})
    c = compare_dirs(a, b, (ra, rb)).check("local_loss")
    assert not c.passed and c.culprits == ["torch bf16 path"], c.detail
    set_kernels(b, "bf16", {"matmul": 0.0, "conv": 0.0})  # read as equal kernels: hidden
    assert compare_dirs(a, b, (ra, rb)).check("local_loss").passed


@pytest.mark.parametrize("culprit", ["a", "b"])
def test_a_loss_path_off_its_own_outputs_fails_whatever_the_forward(four, culprit):
    # The loss summed in bfloat16 (off its own outputs' exact loss by 2^-10, a rounding of the sum)
    # with a forward whose error is within every other bound: the loss path's own bound,
    # (8 + 4 sqrt(64)) u_fp32 = 2.4e-6, sees it 400x.
    a, b, ra, rb = four
    bad = a if culprit == "a" else b
    add_probes(ra, {a: {}, b: {}} | {bad: {"own": 2.0**-10}})
    c = compare_dirs(a, b, (ra, rb)).check("local_loss")
    who = "torch" if culprit == "a" else "tf"
    assert not c.passed and c.culprits == [f"{who} fp32 path"], c.detail
    assert c.value > 100 and "loss path on its own outputs" in c.detail


def test_a_semantic_difference_outranks_a_precision_path(tmp_path):
    # The fp64 pair disagrees too: that is the cause, whatever the probes say.
    a, b, ra, rb = quad(tmp_path, ref_b_loss=lambda s: base_loss(s) + (1e-6 if s > 30 else 0.0))
    add_probes(ra, {a: {}, b: {"grad": 1e-3}})
    cmp = compare_dirs(a, b, (ra, rb))
    assert not cmp.check("local_grad").passed
    assert cmp.diagnosis.category == D.SEMANTICS and not cmp.diagnosis.culprits


def test_convergence_fails_a_run_far_below_its_fp64_run(tmp_path):
    # tf ends at chance while its drift is whatever it is: convergence names it.
    a, b, ra, rb = quad(tmp_path, accuracy=lambda s: 0.1)
    c = compare_dirs(a, b, (ra, rb)).check("convergence")
    assert not c.passed and c.culprits == ["tf fp32 path"] and c.value == pytest.approx(80.0)


@pytest.mark.parametrize("tf_accuracy,passed", [(0.5, True), (0.1, False)])
def test_convergence_of_runs_that_skip_by_spec_is_judged_across_backends(
    tmp_path, tf_accuracy, passed
):
    # Both fp16 runs skip their first 30 of 120 steps (an initial loss scale that overflows, by
    # spec): they apply fewer updates than their fp64 runs and end at 50%, not 90%, which is not a
    # path defect; each is judged against the other backend's run, so one at chance still fails.
    spec = base_spec(precision={"dtype": "fp16"})
    ra = make_run(tmp_path / "ra", spec=fp64_spec(), accuracy=lambda s: 0.9)
    rb = make_run(tmp_path / "rb", backend="tf", spec=fp64_spec(), accuracy=lambda s: 0.9)
    a = make_run(tmp_path / "a", spec=spec, skipped=lambda s: s <= 30, accuracy=lambda s: 0.5)
    b = make_run(
        tmp_path / "b",
        backend="tf",
        spec=spec,
        skipped=lambda s: s <= 30,
        accuracy=lambda s: tf_accuracy,
    )
    c = compare_dirs(a, b, (ra, rb)).check("convergence")
    assert c.passed is passed, c.detail
    assert "both runs skipped 25% / 25% of their steps" in c.detail
    assert c.culprits == ([] if passed else ["tf fp16 path"])


def test_a_run_that_breaks_the_loss_scale_rule_is_named(tmp_path):
    # Both skip step 9 (the same decisions), but tf keeps its scale: GradScaler's rule, applied to
    # tf's own skip decisions, backs off to 32768. The rule is defined once, so tf's fp16 path is
    # off.
    spec = base_spec(precision={"dtype": "fp16"})
    a = make_run(
        tmp_path / "a",
        spec=spec,
        loss_scale=lambda s: 65536.0 if s < 10 else 32768.0,
        skipped=lambda s: s == 9,
    )
    b = make_run(
        tmp_path / "b",
        backend="tf",
        spec=spec,
        loss_scale=lambda s: 65536.0,
        skipped=lambda s: s == 9,
    )
    assert C.scale_rule_violation(read_run(a)) is None
    assert C.scale_rule_violation(read_run(b)) == "step 10: loss scale 65536, the rule gives 32768"
    cmp = compare_dirs(a, b)
    c = cmp.check("loss_scale")
    assert (
        not c.passed and c.culprits == ["tf fp16 path"] and "breaks the loss-scale rule" in c.detail
    )
    assert cmp.diagnosis.cause == D.PATH and cmp.diagnosis.culprits == ["tf fp16 path"]

"""The causes the diagnosis names when two runs part, on synthetic run directories: sample ids,
learning rate, initial weights, a seed, a precision difference, loss-scale decisions."""

from __future__ import annotations

import math

import pytest

from dualtrain.core.weights import init_weights
from dualtrain.parity import checks as C
from dualtrain.parity import compare_dirs
from dualtrain.parity import diagnose as D
from dualtrain.records.record import read_run
from dualtrain.spec import from_dict
from testkit.synth import (
    base_loss,
    base_spec,
    make_run,
    noisy,
    one_ulp_moved,
)


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


def test_a_model_pair_apart_only_by_a_library_float32_limit_is_limit_not_semantics():
    def diagnosis(*failed: str) -> D.Diagnosis:
        return D.Diagnosis(False, 1, list(failed), "semantics differ", "semantics differ")

    only_ref = diagnosis("reference_loss", "reference_weights")
    D.limited(only_ref, True)
    assert only_ref.category == "limit"
    # a check at the requested precision failed too, or the locator named a mistake: not a limit
    for d, at_limit in ((diagnosis("reference_loss", "trajectory"), True),
                        (diagnosis("reference_loss"), False)):  # fmt: skip
        D.limited(d, at_limit)
        assert d.category == "semantics differ"

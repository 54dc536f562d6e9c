"""The rounding twin (dualtrain.parity.twin): the fp64 pair's bounds grow to what the twin makes of
one rounding, and no further, on synthetic run directories."""

from __future__ import annotations

import numpy as np
import pytest

from dualtrain.errors import UserError
from dualtrain.parity import REFERENCE, compare_dirs
from dualtrain.parity.readings import load_final, rel_diff
from dualtrain.parity.twin import every_ulp_away
from dualtrain.records.record import read_run
from testkit.synth import fp64_spec, make_run, noisy


def test_every_element_moves_one_ulp_either_way_the_same_on_every_call():
    # float32, as the canonical initial weights are: moved in float64, the fp64 pair's own ulp
    w = {"b": np.zeros(1000, np.float32), "a": np.linspace(-3, 3, 1000, dtype=np.float32)}
    moved = every_ulp_away(w)
    for k, w32 in w.items():
        v = w32.astype(np.float64)
        assert moved[k].dtype == np.float64 and moved[k].shape == v.shape
        up = moved[k] > v
        # one ulp: the next float in the direction moved, never two
        assert np.array_equal(moved[k][up], np.nextafter(v[up], np.inf))
        assert np.array_equal(moved[k][~up], np.nextafter(v[~up], -np.inf))
        assert 0.4 < up.mean() < 0.6  # both directions
    again = every_ulp_away(w)
    assert all(np.array_equal(moved[k], again[k]) for k in w)


def _pair(tmp_path, loss_gap: float, weights_gap: float, twin_gap: float):
    """fp64 run A, B (tf) apart by ``loss_gap`` per step and ``weights_gap`` relative in the
    final weights, and A's twin apart from A by ``twin_gap`` in both."""
    a = make_run(tmp_path / "a", spec=fp64_spec(), loss=noisy(1e-15, 1))
    b = make_run(
        tmp_path / "b",
        backend="tf",
        spec=fp64_spec(),
        loss=noisy(loss_gap, 2),
        final_noise=weights_gap,
        noise_seed=2,
    )
    twin = make_run(
        tmp_path / "twin",
        spec=fp64_spec(),
        loss=noisy(twin_gap, 3),
        final_noise=twin_gap,
        noise_seed=3,
    )
    return a, b, twin


def test_a_pair_past_the_fixed_bounds_passes_within_its_twin(tmp_path):
    # training that carries one rounding to ~1e-9 (the twin) carries the pair's to 2e-10: rounding
    a, b, twin = _pair(tmp_path, 2e-10, 2e-11, 1e-9)
    plain = compare_dirs(a, b)
    assert not plain.check("reference_loss").passed
    assert plain.reference is not None and plain.reference.twin is None
    cmp = compare_dirs(a, b, twin=twin)
    for name in ("reference_loss", "reference_weights", "reference_eval"):
        check = cmp.check(name)
        assert check.passed, check.detail
        assert "rounding twin" in check.detail
    assert cmp.check("reference_loss").tolerance > REFERENCE.loss_abs


def test_a_porting_mistake_fails_however_far_the_twin_drifts(tmp_path):
    # the pair parts far beyond what the twin makes of one rounding (a semantic difference)
    a, b, twin = _pair(tmp_path, 1e-4, 1e-4, 1e-9)
    cmp = compare_dirs(a, b, twin=twin)
    loss, weights = cmp.check("reference_loss"), cmp.check("reference_weights")
    assert not loss.passed and loss.first_step is not None
    assert not weights.passed and "over:" in weights.detail
    assert weights.tolerance == REFERENCE.twin_factor * _twin_worst(a, twin, weights.detail)


def _twin_worst(a, twin, detail: str) -> float:
    name = detail.split("nearest its bound: ")[1].split(",")[0]
    return rel_diff(load_final(read_run(a)), load_final(read_run(twin)))[name]


def test_the_bound_never_drops_below_the_fixed_one(tmp_path):
    # a twin that barely moves (a model that forgets rounding) leaves the fixed bounds in force
    a, b, twin = _pair(tmp_path, 2e-10, 2e-10, 1e-16)
    cmp = compare_dirs(a, b, twin=twin)
    assert cmp.check("reference_weights").tolerance == REFERENCE.weights_rel
    assert not cmp.check("reference_loss").passed


def test_a_twin_on_the_other_backend_is_refused(tmp_path):
    a, b, _ = _pair(tmp_path, 1e-15, 0.0, 1e-15)
    with pytest.raises(UserError, match="rounding twin runs on its reference run's backend"):
        compare_dirs(a, b, twin=b)

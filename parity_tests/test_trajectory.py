"""Trajectory parity over a whole MNIST epoch (fp32, determinism on, same init, same plan).

Two questions, as ``dualtrain compare`` asks them (dualtrain.parity.checks, the same functions the
report uses):

* semantics: the same spec in float64 on both backends (the reference pair) agrees to rounding over
  the whole run: per-step loss, final weights and evaluation within the REFERENCE bounds (1e-10);
* numerics: the fp32 runs differ by no more than 10x the farther backend's distance to its own fp64
  run, at every step and per final tensor.
"""

import dataclasses

import numpy as np
import pytest

from dualtrain.parity.checks import (
    Reference,
    check_final_weights,
    check_reference_eval,
    check_reference_loss,
    check_reference_weights,
    check_trajectory,
)
from dualtrain.parity.readings import loss_diff
from dualtrain.parity.tolerances import TOLERANCES
from dualtrain.records.record import read_run


def first_epoch(record):
    return dataclasses.replace(record, train=[r for r in record.train if r["epoch"] == 1])


def assert_trajectory(runs, *overrides):
    """Run torch, tf and the fp64 pair; check the semantic and the numerics bounds."""
    a, b = read_run(runs("torch", *overrides)), read_run(runs("tf", *overrides))
    ref = runs.reference(*overrides)
    checks = [check_reference_loss(ref), check_reference_weights(ref), check_reference_eval(ref)]
    _, ref_diff = loss_diff(ref.a, ref.b)
    ea, eb = first_epoch(a), first_epoch(b)
    _, cross = loss_diff(ea, eb)
    _, dist_a = loss_diff(ea, first_epoch(ref.a))
    _, dist_b = loss_diff(eb, first_epoch(ref.b))
    print(
        f"{' '.join(overrides) or 'mnist_mlp'}: fp64 pair max |loss diff| {ref_diff.max():.2e} "
        f"({checks[1].detail}); fp32 epoch 1: {len(cross)} steps, cross max {cross.max():.3e} "
        f"(first 50: {cross[:50].max():.3e}); distance to fp64: torch {dist_a.max():.3e}, "
        f"tf {dist_b.max():.3e}"
    )
    for c in checks:
        assert c.passed, c.detail
    ref1 = Reference(first_epoch(ref.a), first_epoch(ref.b))
    traj = check_trajectory(ea, eb, ref1, TOLERANCES["fp32"])
    assert traj.passed, traj.detail
    weights = check_final_weights(a, b, ref, TOLERANCES["fp32"])
    assert weights.passed, weights.detail
    return cross, ref_diff


@pytest.mark.slow  # a whole-run drift bound (descriptive with a reference); the probes judge fp32
def test_mlp_sgd_momentum_epoch(runs):
    # The reference experiment (configs/mnist_mlp.yaml: world 2, SGD lr 0.1 cosine, momentum 0.9);
    # its first epoch, shared with the convergence test's 2-epoch runs.
    assert_trajectory(runs)


@pytest.mark.slow  # a known gap, tracked: four more full-epoch runs the default suite skips
@pytest.mark.sweep  # in the full sweep only (docs/testing.md)
@pytest.mark.xfail(
    strict=True,
    reason="known gap (docs/parity.md): with plain SGD the fp64 pair agrees "
    "to ~1e-15, but the fp32 runs drift to ~2e-3 apart from step ~80: their fp32 kernels "
    "round differently in most gradient elements",
)
def test_plain_sgd_is_near_bitwise(runs):
    # No momentum: the brief measured hand-written loops staying within 8e-7 for a whole epoch.
    cross, _ = assert_trajectory(runs, "optimizer.momentum=0.0", "train.epochs=1")
    assert np.max(cross) <= 1e-5

"""Trajectory parity over a whole MNIST epoch (fp32, determinism on, same init, same plan).

Training is chaotic, so the yardstick is a noise floor measured on the spot: a torch twin whose
initial weights differ by one ulp in one element. Pass: |loss diff| <= 1e-5 for the first 50 steps,
and the cross-backend |loss diff| within the tolerance table's factor of the noise floor at every
step (dualtrain.compare.checks.check_trajectory, the same function the report uses).
"""

import dataclasses

import numpy as np
import pytest

from dualtrain.compare.checks import check_loss_early, check_trajectory
from dualtrain.compare.tolerances import TOLERANCES
from dualtrain.record import read_run


def first_epoch(record):
    return dataclasses.replace(record, train=[r for r in record.train if r["epoch"] == 1])


def losses(record):
    return np.array([float(r["loss"]) for r in record.train])


def assert_trajectory(runs, *overrides):
    """Run torch, tf and the torch twin; check early agreement and the noise-floor bound."""
    torch_dir, tf_dir = runs("torch", *overrides), runs("tf", *overrides)
    twin_dir = runs.twin(torch_dir, "torch", *overrides)
    a, b, twin = (first_epoch(read_run(d)) for d in (torch_dir, tf_dir, twin_dir))
    cross = np.abs(losses(a) - losses(b))
    noise = np.abs(losses(a) - losses(twin))
    print(f"{' '.join(overrides) or 'mnist_mlp'}: {len(cross)} steps; cross-backend max |loss diff| "
          f"{cross.max():.3e} (first 50: {cross[:50].max():.3e}, last: {cross[-1]:.3e}); "
          f"noise floor max {noise.max():.3e} (last {noise[-1]:.3e})")
    early = check_loss_early(a, b, TOLERANCES["fp32"])
    assert early.passed, early.detail
    traj = check_trajectory(a, b, twin, TOLERANCES["fp32"])
    assert traj.passed, traj.detail
    return cross, noise


def test_mlp_sgd_momentum_epoch(runs):
    # The reference experiment (configs/mnist_mlp.yaml: world 2, SGD lr 0.1 cosine, momentum 0.9);
    # its first epoch, shared with the convergence test's 2-epoch runs.
    assert_trajectory(runs)


@pytest.mark.slow  # a known gap, tracked: two more full-epoch runs (~30 s) the default suite skips
@pytest.mark.xfail(strict=True, reason="known gap (docs/parity.md): with plain SGD the torch twin stays "
                   "within ~2e-7 of run A for the whole epoch, but torch and TF drift to ~2e-3 apart "
                   "from step ~80: their fp32 kernels round differently in most gradient elements")
def test_plain_sgd_is_near_bitwise(runs):
    # No momentum: the brief measured hand-written loops staying within 8e-7 for a whole epoch.
    cross, _ = assert_trajectory(runs, "optimizer.momentum=0.0", "train.epochs=1")
    assert cross.max() <= 1e-5

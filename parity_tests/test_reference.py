"""The fp64 reference pair: the same spec in float64 on torch and on tf agrees to rounding (the
bounds of dualtrain.parity.tolerances.REFERENCE, 1e-10) over every world size and strategy, with
uneven and empty replicas on the last step, for the MLP and the CNN, SGD with momentum and AdamW.

This is the semantic check ``dualtrain compare`` runs; what it must catch is measured in
parity_tests/test_mutants.py.
"""

import numpy as np
import pytest

from dualtrain.core.weights import load_weights
from dualtrain.parity.checks import (
    check_reference_eval,
    check_reference_loss,
    check_reference_weights,
    check_sharding,
)
from dualtrain.parity.readings import loss_diff
from testkit.cli import ROOT

CNN = str(ROOT / "configs" / "mnist_cnn.yaml")
# 1,000 samples in global batches of 64: 15 full steps and a 40-sample last step per epoch (uneven
# shards at world 3; at world 4, 10 each), 2 epochs.
SMALL = ("data.train_limit=1000", "data.batch_size=64", "data.test_limit=500", "train.epochs=2")
CASES = {
    "mlp-w1": ("distribution.world_size=1",),
    "mlp-w3-multi_worker-adamw": (
        "distribution.world_size=3",
        "tf.strategy=multi_worker",
        "optimizer.name=adamw",
        "optimizer.lr=0.001",
        "optimizer.weight_decay=0.01",
    ),
    "mlp-w4-mirrored-clip": ("distribution.world_size=4", "optimizer.clip_grad_norm=0.5"),
}


def assert_reference(ref):
    checks = [
        check_sharding(ref.a, ref.b),
        check_reference_loss(ref),
        check_reference_weights(ref),
        check_reference_eval(ref),
    ]
    _, diff = loss_diff(ref.a, ref.b)
    for run in (ref.a, ref.b):  # float64 end to end: the final weights are float64 arrays
        w = load_weights(run.path / "weights_final.npz")
        assert {a.dtype for a in w.values()} == {np.dtype(np.float64)}, run.path
        assert run.summary["precision"] == "fp64"
    print(
        f"{ref.a.path.name}: {diff.size} steps, max |loss diff| {diff.max():.2e}; "
        f"{checks[2].detail}"
    )
    for c in checks:
        assert c.passed, c.detail


@pytest.mark.parametrize(
    "case",
    [
        c
        if c not in ("mlp-w4-mirrored-clip", "mlp-w3-multi_worker-adamw")
        else pytest.param(c, marks=pytest.mark.slow)
        for c in CASES
    ],
)
def test_reference_pair_agrees(runs, case):
    assert_reference(runs.reference(*SMALL, *CASES[case]))


@pytest.mark.slow  # the CNN's fp64 pair also runs in test_new_layers_optimizers and test_batchnorm
def test_reference_pair_agrees_cnn_world_3(runs):
    # 642 samples in batches of 32: the last step has 2 samples over 3 replicas, so one is empty
    # (convolutions on an empty replica in float64).
    assert_reference(
        runs.reference(
            "data.train_limit=642",
            "data.batch_size=32",
            "data.test_limit=200",
            "train.epochs=1",
            "distribution.world_size=3",
            config=CNN,
        )
    )

"""Gradient averaging: one step from the same weights; both backends equal the single-process
full-batch gradient and each other, per tensor max|diff| / max|ref| <= 1e-6 (fp32)."""

import numpy as np
import pytest

from dualtrain.core.weights import load_weights
from dualtrain.records.record import read_run
from testkit.cli import ROOT
from testkit.parity_runs import MLP

BOUND = 1e-6
CNN = str(ROOT / "configs" / "mnist_cnn.yaml")


def rel_err(a, b):
    return {k: float(np.max(np.abs(a[k] - b[k])) / np.max(np.abs(b[k]))) for k in b}


# (train_limit, world, config): the first (and only) step has this many samples, split over the
# replicas. Uneven splits without an empty replica are covered per backend (tests/integration's
# test_tf_* and test_torch_* runs).
CASES = [
    (1, 2, MLP),  # [1, 0]: replica 1 gets nothing
    (2, 3, CNN),
]  # [1, 1, 0]: uneven and one empty; convolutions and the C,H,W flatten too


@pytest.mark.parametrize(
    "n,world,config",
    [CASES[0], pytest.param(*CASES[1], marks=pytest.mark.slow)],
    ids=["mlp-1-over-2", "cnn-2-over-3"],
)
def test_averaged_gradient_equals_full_batch(runs, n, world, config):
    base = (
        f"data.train_limit={n}",
        "data.test_limit=100",
        "train.max_steps=1",
        "debug.dump_grads=[1]",
    )
    grads, losses = {}, {}
    for backend in ("torch", "tf"):
        for w in (1, world):
            d = runs(backend, *base, f"distribution.world_size={w}", config=config)
            grads[backend, w] = load_weights(d / "grads_step1.npz")
            rec = read_run(d)
            losses[backend, w] = rec.train[0]["loss"]
            if w > 1:
                counts = [r["count"] for r in rec.shards if r["step"] == 1]
                assert sum(counts) == n and counts[-1] == 0, counts  # the last replica is empty
    ref = grads["torch", 1]
    pairs = {
        "torch W vs torch 1": (grads["torch", world], ref),
        "tf W vs tf 1": (grads["tf", world], grads["tf", 1]),
        "tf W vs torch 1": (grads["tf", world], ref),
        "tf W vs torch W": (grads["tf", world], grads["torch", world]),
    }
    report = {name: max(rel_err(a, b).values()) for name, (a, b) in pairs.items()}
    print(f"n={n} world={world}: " + ", ".join(f"{k} {v:.2e}" for k, v in report.items()))
    for name, (a, b) in pairs.items():
        errs = rel_err(a, b)
        assert max(errs.values()) <= BOUND, (name, errs)
    # The recorded loss is the global-batch mean too: summed over replicas, divided by N_global.
    for backend in ("torch", "tf"):
        assert losses[backend, world] == pytest.approx(losses[backend, 1], rel=BOUND), backend

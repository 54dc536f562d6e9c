"""Gradient averaging: one step from the same weights; both backends equal the single-process
full-batch gradient and each other, per tensor max|diff| / max|ref| <= 1e-6 (fp32)."""

import numpy as np
import pytest

from dualtrain.weights import load_weights

BOUND = 1e-6


def rel_err(a, b):
    return {k: float(np.max(np.abs(a[k] - b[k])) / np.max(np.abs(b[k]))) for k in b}


# (train_limit, world): the first (and only) step has this many samples, split over the replicas.
CASES = [(1, 2),     # replica 1 gets nothing
         (2, 3),     # [1, 1, 0]
         (100, 3)]   # uneven [34, 33, 33]; even splits are covered by tests/tf and tests/torch


@pytest.mark.parametrize("n,world", CASES)
def test_averaged_gradient_equals_full_batch(runs, n, world):
    base = (f"data.train_limit={n}", "data.test_limit=100", "train.max_steps=1", "debug.dump_grads=[1]")
    grads = {}
    for backend in ("torch", "tf"):
        for w in (1, world):
            d = runs(backend, *base, f"distribution.world_size={w}")
            grads[backend, w] = load_weights(d / "grads_step1.npz")
    ref = grads["torch", 1]
    pairs = {"torch W vs torch 1": (grads["torch", world], ref),
             "tf W vs tf 1": (grads["tf", world], grads["tf", 1]),
             "tf W vs torch 1": (grads["tf", world], ref),
             "tf W vs torch W": (grads["tf", world], grads["torch", world])}
    report = {name: max(rel_err(a, b).values()) for name, (a, b) in pairs.items()}
    print(f"n={n} world={world}: " + ", ".join(f"{k} {v:.2e}" for k, v in report.items()))
    for name, (a, b) in pairs.items():
        errs = rel_err(a, b)
        assert max(errs.values()) <= BOUND, (name, errs)

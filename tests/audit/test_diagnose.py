"""Diagnoses on records written in the test (what a recorder would read from an SGD with
momentum and a Keras SGD, an lr that changes): the conventions no example script plants."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dualtrain.audit.diagnose import diagnose
from dualtrain.audit.read import Recorded


def _run(framework: str, optimizer: dict, lrs: list[float]) -> Recorded:
    steps = [
        {
            "step": i + 1,
            "epoch": 1 + i // 2,
            "lr": lr,
            "loss": 1.0,
            "samples": 8,
            "grad_norm": 1.0,
            "loss_scale": None,
            "skipped": False,
        }
        for i, lr in enumerate(lrs)
    ]
    rows = {
        (s["step"], 0): {
            "step": s["step"],
            "epoch": s["epoch"],
            "replica": 0,
            "count": 8,
            "exact": [f"{s['step']:016x}"],
            "pattern": [f"{s['step']:016x}"],
        }
        for s in steps
    }
    w = {"w": np.zeros(2, np.float32)}
    return Recorded(Path(framework), framework, 1, {"optimizer": optimizer}, {}, steps, rows, w, w)


def test_sgd_momentum_under_a_changing_lr_is_named():
    lrs = [0.1, 0.1, 0.01, 0.01]
    a = _run("torch", {"type": "SGD", "lr": 0.1, "momentum": 0.9, "nesterov": False}, lrs)
    b = _run("tf", {"type": "SGD", "learning_rate": 0.1, "momentum": 0.9, "nesterov": False}, lrs)
    found = {f.name: f for f in diagnose(a, b)}
    conv = found["optimizer conventions (momentum, epsilon, weight decay)"]
    assert "momentum: torch's buffer holds gradients" in conv.evidence
    assert diagnose(a, _run("torch", a.config["optimizer"], lrs)) == []  # the same: nothing


def test_adam_epsilon_and_coupled_weight_decay_are_named():
    lrs = [1e-3] * 4
    a = _run(
        "torch",
        {"type": "Adam", "lr": 1e-3, "eps": 1e-8, "betas": [0.9, 0.999], "weight_decay": 0.01},
        lrs,
    )
    b = _run(
        "tf",
        {"type": "Adam", "learning_rate": 1e-3, "epsilon": 1e-7, "beta_1": 0.9, "beta_2": 0.999},
        lrs,
    )
    (conv,) = [f for f in diagnose(a, b) if f.name.startswith("optimizer conventions")]
    assert "epsilon: torch eps=1e-08, Keras epsilon=1e-07" in conv.evidence
    assert "an L2 term" in conv.evidence

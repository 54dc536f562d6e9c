"""The TF engine's own optimizer: torch.optim formulas, replayed in NumPy from the dumped gradients.

Each run dumps the all-reduced, unscaled, unclipped gradient of every step; starting from
weights_init.npz, NumPy applies clipping (torch's clip_grad_norm_ formula) and the torch.optim
update with the lr recorded for each step, and must land on weights_final.npz. The settings are
chosen so a Keras-style formula would fail: a changing lr (warmup + cosine) for SGD momentum, a
large Adam eps (placement matters), weight decay, and clipping that is active.
"""

from __future__ import annotations

import numpy as np
import pytest

from dualtrain.core.weights import load_weights
from testkit.tf_runs import small_spec, tf_run

STEPS = 6
F = np.float32


def replay(init, grads, lrs, opt):
    p = {k: v.astype(F).copy() for k, v in init.items()}
    buf, m, v = (
        {},
        {k: np.zeros_like(x) for k, x in p.items()},
        {k: np.zeros_like(x) for k, x in p.items()},
    )
    wd, name = F(opt.get("weight_decay", 0.0)), opt["name"]
    for t, (g, lr) in enumerate(zip(grads, lrs, strict=True), 1):
        g = {k: x.astype(F) for k, x in g.items()}
        norm = np.sqrt(
            np.sum(
                np.square(
                    [np.sqrt(np.sum(np.square(x, dtype=F), dtype=F)) for x in g.values()], dtype=F
                ),
                dtype=F,
            )
        )
        if opt.get("clip_grad_norm"):
            coef = min(F(1.0), F(opt["clip_grad_norm"]) / (norm + F(1e-6)))
            g = {k: x * F(coef) for k, x in g.items()}
        lr = F(lr)
        for k in p:
            grad = g[k]
            if name == "sgd":
                if wd:
                    grad = grad + wd * p[k]
                mom = F(opt["momentum"])
                buf[k] = grad.copy() if t == 1 else buf[k] * mom + grad
                d = grad + mom * buf[k] if opt.get("nesterov") else buf[k]
                p[k] = p[k] - lr * d
                continue
            if name == "adamw":
                p[k] = p[k] * (F(1.0) - lr * wd)
            elif wd:
                grad = grad + wd * p[k]
            b1, b2 = opt["betas"]
            m[k] = m[k] + F(1 - b1) * (grad - m[k])
            v[k] = v[k] * F(b2) + F(1 - b2) * grad * grad
            step_size = F(float(lr) / (1 - b1**t))
            denom = np.sqrt(v[k]) / F((1 - b2**t) ** 0.5) + F(opt["eps"])
            p[k] = p[k] - step_size * (m[k] / denom)
    return p


OPTS = {
    "sgd_nesterov": {
        "name": "sgd",
        "lr": 0.1,
        "momentum": 0.9,
        "nesterov": True,
        "weight_decay": 0.01,
        "clip_grad_norm": 0.5,
        "schedule": {"name": "cosine", "warmup_steps": 2, "min_lr": 0.001},
    },
    "adam": {
        "name": "adam",
        "lr": 0.01,
        "betas": [0.9, 0.99],
        "eps": 0.001,
        "weight_decay": 0.05,
        "clip_grad_norm": 1.0,
        "schedule": {"name": "step", "step_size": 2, "gamma": 0.5},
    },
    "adamw": {"name": "adamw", "lr": 0.01, "betas": [0.8, 0.9], "eps": 0.001, "weight_decay": 0.5},
}


@pytest.mark.parametrize("key", sorted(OPTS))
def test_updates_follow_torch_optim(tmp_path, key):
    opt = OPTS[key]
    spec = small_spec(
        data={"train_limit": 48, "batch_size": 8, "test_limit": 20},
        optimizer=opt,
        distribution={"world_size": 2},
        train={"epochs": 1, "log_every": 2},
        debug={"dump_grads": list(range(1, STEPS + 1))},
    )
    run = tf_run(tmp_path, spec)
    rec = run.record
    lrs = [r["lr"] for r in rec.train]
    assert len(lrs) == STEPS and len(set(lrs)) > (1 if key != "adamw" else 0)
    grads = [run.grads(s) for s in range(1, STEPS + 1)]
    if opt.get("clip_grad_norm"):  # clipping really happened on some step
        assert any(r["grad_norm"] > opt["clip_grad_norm"] for r in rec.train)
    init = load_weights(run.out / "weights_init.npz")
    final = load_weights(run.out / "weights_final.npz")
    ref = replay(init, grads, lrs, opt)
    for k in init:
        moved = np.max(np.abs(ref[k] - init[k]))
        err = np.max(np.abs(final[k] - ref[k]))
        assert err <= 1e-3 * moved + 1e-7, (k, err, moved)

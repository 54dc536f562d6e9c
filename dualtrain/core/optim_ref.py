"""torch.optim's update rules and clipping in float64 NumPy: the exact step a probe is judged against.

The one-step probes (dualtrain.runtime.probes) check the update a backend applied against this exact update
applied to *that backend's own gradient* from the same state, so the update check sees only the
update's arithmetic (a defect in the float32 branch of an update rule, optimizer state held in a low
precision) and not the gradient's rounding, which the gradient check judges. Formulas:
torch.optim's single-tensor paths (sgd, adam, adamw, adadelta, rmsprop), the same ones the TF
backend writes out (docs/parity.md §4); tests/torch/test_optim_ref.py compares them with torch.optim
in float64.
"""

from __future__ import annotations

import math

import numpy as np

from dualtrain.core.weights import Weights
from dualtrain.spec import OptimizerName, OptimizerSpec


def clip_coefficient(grads: Weights, max_norm: float | None) -> tuple[float, float]:
    """(global L2 norm, torch's clip_grad_norm_ coefficient min(1, max / (norm + 1e-6)))."""
    norm = math.sqrt(sum(float(np.sum(np.square(g, dtype=np.float64))) for g in grads.values()))
    if max_norm is None:
        return norm, 1.0
    return norm, min(1.0, max_norm / (norm + 1e-6))


def step(
    opt: OptimizerSpec, lr: float, weights: Weights, slots: Weights, applied: int, grads: Weights
) -> Weights:
    """The weights after one update of every parameter in ``grads`` (float64; clipping included).

    ``slots``: torch.optim's state under canonical names (``exp_avg/0.weight``), empty before the
    first applied update; ``applied``: updates applied before this one (Adam's bias correction)."""
    _, coef = clip_coefficient(grads, opt.clip_grad_norm)
    out: Weights = {}
    for name, g in grads.items():
        p = np.asarray(weights[name], np.float64)
        g = np.asarray(g, np.float64) * coef

        def slot(key: str) -> np.ndarray | None:
            v = slots.get(f"{key}/{name}")
            return None if v is None else np.asarray(v, np.float64)

        out[name] = _one(opt, lr, p, g, slot, applied)
    return out


def _one(
    opt: OptimizerSpec, lr: float, p: np.ndarray, g: np.ndarray, slot, applied: int
) -> np.ndarray:
    name, wd = opt.name, opt.weight_decay
    zeros = np.zeros_like(p)
    if name is OptimizerName.SGD:
        if wd:
            g = g + wd * p
        if opt.momentum:
            buf = slot("momentum_buffer")
            buf = g.copy() if buf is None or applied == 0 else buf * opt.momentum + g
            g = g + opt.momentum * buf if opt.nesterov else buf
        return p - lr * g
    if name in (OptimizerName.ADAM, OptimizerName.ADAMW):
        if name is OptimizerName.ADAMW and wd:
            p = p * (1.0 - lr * wd)
        elif wd:
            g = g + wd * p
        b1, b2 = opt.betas
        m = slot("exp_avg")
        v = slot("exp_avg_sq")
        m = zeros if m is None else m
        v = zeros if v is None else v
        m = m + (1.0 - b1) * (g - m)
        v = v * b2 + (1.0 - b2) * g * g
        t = applied + 1
        bc1, bc2 = 1.0 - b1**t, 1.0 - b2**t
        return p - (lr / bc1) * (m / (np.sqrt(v) / math.sqrt(bc2) + opt.eps))
    if wd:
        g = g + wd * p
    if name is OptimizerName.ADADELTA:
        sq = slot("square_avg")
        acc = slot("acc_delta")
        sq = (zeros if sq is None else sq) * opt.rho + (1.0 - opt.rho) * g * g
        acc = zeros if acc is None else acc
        delta = np.sqrt(acc + opt.eps) / np.sqrt(sq + opt.eps) * g
        return p - lr * delta
    # rmsprop
    sq = slot("square_avg")
    sq = (zeros if sq is None else sq) * opt.alpha + (1.0 - opt.alpha) * g * g
    if opt.centered:
        ga = slot("grad_avg")
        ga = zeros if ga is None else ga
        ga = ga + (1.0 - opt.alpha) * (g - ga)
        avg = np.sqrt(sq - ga * ga) + opt.eps
    else:
        avg = np.sqrt(sq) + opt.eps
    if opt.momentum:
        buf = slot("momentum_buffer")
        buf = (zeros if buf is None else buf) * opt.momentum + g / avg
        return p - lr * buf
    return p - lr * g / avg

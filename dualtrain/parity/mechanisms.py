"""The known mechanisms behind a first divergent operation (dualtrain.parity.replay): an update
checked against the spec's rule from the same state and gradient (dualtrain.core.optim_ref) and
against the variants ports are known to carry; a running statistic against the other momentum
convention and the biased batch variance. Framework-free, float64 NumPy."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from dualtrain.core import optim_ref
from dualtrain.core.weights import Weights
from dualtrain.spec import OPTIMIZERS, OptimizerName, OptimizerSpec


def rel(a: np.ndarray, b: np.ndarray, floor: float = 0.0) -> float:
    """||a - b|| / max(||a||, floor); ``floor``: a scale below which a tensor counts as zero (a
    bias before a batchnorm has a gradient of rounding noise, ~1e-17, on both sides)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return math.inf
    ref = max(float(np.linalg.norm(a)), floor)
    d = float(np.linalg.norm(a - b))
    value = d / ref if ref > 0 else d
    return math.inf if math.isnan(value) else value


def _eps(opt: OptimizerSpec) -> float:
    return OPTIMIZERS[opt.name].default_eps if opt.eps is None else opt.eps


Array = np.ndarray
#: (spec's optimizer, lr, parameter, gradient, slots before, parameter name, updates applied)
#: -> the parameter after the variant's update, float64
Variant = Callable[[OptimizerSpec, float, Array, Array, Weights, str, int], Array]


def _by_spec(changes: dict[str, Any]) -> Variant:
    """A variant the spec can say itself (another optimizer name, a toggled option)."""

    def apply(
        opt: OptimizerSpec, lr: float, p: Array, g: Array, slots: Weights, name: str, applied: int
    ) -> Array:
        other = dataclasses.replace(opt, **changes)
        return optim_ref.step(other, lr, {name: p}, slots, applied, {name: g})[name]

    return apply


def adam_amsgrad(
    opt: OptimizerSpec, lr: float, p: Array, g: Array, slots: Weights, name: str, applied: int
) -> Array:
    b1, b2 = opt.betas
    eps = _eps(opt)
    if opt.weight_decay and opt.name is OptimizerName.ADAMW:
        p = p * (1.0 - lr * opt.weight_decay)
    elif opt.weight_decay:
        g = g + opt.weight_decay * p
    m = slots.get(f"exp_avg/{name}", np.zeros_like(p)) * b1 + (1 - b1) * g
    v = slots.get(f"exp_avg_sq/{name}", np.zeros_like(p)) * b2 + (1 - b2) * g * g
    vmax = np.maximum(slots.get(f"max_exp_avg_sq/{name}", np.zeros_like(p)), v)
    t = applied + 1
    denom = np.sqrt(vmax) / math.sqrt(1 - b2**t) + eps
    return p - lr / (1 - b1**t) * m / denom


def _sgd_dampening(
    opt: OptimizerSpec, lr: float, p: Array, g: Array, slots: Weights, name: str, applied: int
) -> Array:
    if opt.weight_decay:
        g = g + opt.weight_decay * p
    buf = slots.get(f"momentum_buffer/{name}")
    buf = g if buf is None else opt.momentum * buf + (1 - opt.momentum) * g
    return p - lr * (g + opt.momentum * buf if opt.nesterov else buf)


def _rmsprop_eps_inside(
    opt: OptimizerSpec, lr: float, p: Array, g: Array, slots: Weights, name: str, applied: int
) -> Array:
    eps = _eps(opt)
    if opt.weight_decay:
        g = g + opt.weight_decay * p
    v = slots.get(f"square_avg/{name}", np.zeros_like(p)) * opt.alpha + (1 - opt.alpha) * g * g
    return p - lr * g / np.sqrt(v + eps)


def _variants(opt: OptimizerSpec) -> dict[str, Variant]:
    """The known ways a port's optimizer departs from the spec's, by what the finding says."""
    out: dict[str, Variant] = {}
    if opt.name in (OptimizerName.ADAM, OptimizerName.ADAMW):
        out["amsgrad: the max of the second moments"] = adam_amsgrad
        other = OptimizerName.ADAM if opt.name is OptimizerName.ADAMW else OptimizerName.ADAMW
        out[
            "AdamW ported as Adam plus L2"
            if opt.name is OptimizerName.ADAMW
            else "Adam with decoupled weight decay (AdamW)"
        ] = _by_spec({"name": other})
    if opt.name is OptimizerName.SGD:
        out["dampening = momentum"] = _sgd_dampening
        out["Nesterov momentum toggled"] = _by_spec({"nesterov": not opt.nesterov})
    if opt.name is OptimizerName.RMSPROP:
        out["eps inside the square root (TF's RMSprop)"] = _rmsprop_eps_inside
        out["centered toggled"] = _by_spec({"centered": not opt.centered})
    if opt.name is not OptimizerName.SGD:
        out["eps 1e-07, Keras's default"] = _by_spec({"eps": 1e-7})
    return out


def update_mechanism(
    labels: tuple[str, str],
    lr: float | None,
    opt: OptimizerSpec,
    name: str,
    before: tuple[Weights, Weights, int],
    grads: Weights,
    after: tuple[Weights, Weights],
) -> str:
    """Which side follows the spec's rule from the same state and gradient, and the known variant
    that reproduces the other, if any."""
    weights, slots, applied = before
    if lr is None:
        return ""
    # clipping couples every tensor: the coefficient from all of them, then one tensor's rule
    _, coef = optim_ref.clip_coefficient(grads, opt.clip_grad_norm)
    opt = dataclasses.replace(opt, clip_grad_norm=None)
    p, g = np.asarray(weights[name], np.float64), np.asarray(grads[name], np.float64) * coef
    f64 = {k: np.asarray(v, np.float64) for k, v in slots.items()}
    # compared as updates (new - old), which rounding moves by ~1e-15 of themselves
    want = optim_ref.step(opt, lr, {name: p}, f64, applied, {name: g})[name] - p
    moved = [np.asarray(side[name], np.float64) - p for side in after]
    follows = [rel(want, d) <= 1e-8 for side, d in zip(after, moved, strict=True)]
    if follows[0] == follows[1]:
        return "" if follows[0] else "neither side's update is the spec's rule"
    la, lb = labels
    off, label, other = (moved[1], lb, la) if follows[0] else (moved[0], la, lb)
    for what, variant in _variants(opt).items():
        moves = variant(opt, lr, p, g, f64, name, applied) - p
        if rel(moves, want) <= 1e-8:  # the spec's own rule from this state (SGD's dampening at
            continue  # the first step, whose buffer is the gradient): it explains no departure
        if rel(moves, off) <= 1e-6:
            return f"{label} departs from the spec's rule: {what}"
    scale = float(np.vdot(off, want) / max(float(np.vdot(want, want)), 1e-300))
    if rel(scale * want, off) <= 1e-6:  # the rule's direction, another length
        return (
            f"{label}'s update is the spec's rule x {scale:.9g} (another learning rate, or a "
            f"scaled gradient); {other}'s follows it"
        )
    return f"{label}'s update departs from the spec's rule, {other}'s follows it"


def running_mechanism(la: str, lb: str, old: Array | None, new_a: Array, new_b: Array) -> str:
    """The known conventions that relate the two running statistics, ``a`` read as torch's
    ``(1 - m) old + m batch`` for a momentum m: the momentum convention read the other way
    (``m old + (1 - m) batch``), the biased batch variance (``(n - 1) / n`` of the unbiased)."""
    if old is None:
        return ""
    old, new_a, new_b = (np.asarray(x, np.float64) for x in (old, new_a, new_b))
    for m in (0.1, 0.01, 0.001, 0.2, 0.5):
        batch = old + (new_a - old) / m
        if rel(m * old + (1 - m) * batch, new_b) <= 1e-8:
            return (
                f"momentum convention: {lb}'s running value = {m:g} x old + {1 - m:g} x batch, "
                f"{la}'s = {1 - m:g} x old + {m:g} x batch (torch's momentum {m:g} is Keras's "
                f"{1 - m:g})"
            )
        live = np.abs(batch) > 1e-12
        if not live.any():
            continue
        r = (new_b - (1 - m) * old)[live] / (m * batch[live])
        if 0.5 < float(r.min()) and float(r.max()) < 1.0 and np.ptp(r) <= 1e-8:
            n = 1.0 / (1.0 - float(np.median(r)))
            return (
                f"{lb}'s batch variance is {la}'s x {float(np.median(r)):.6g} = (n - 1) / n for "
                f"n = {n:.0f}: the biased variance (Keras's moving_variance) where {la} keeps "
                f"the unbiased one (torch's running_var)"
            )
    return ""

"""The first divergent operation: where the fp64 pair parts, which operation of which step.

compare replays the fp64 pair up to its first divergent step (dualtrain.driver.compare_replay):
both backends again, each writing after every step its all-reduced gradient (``grads_step{N}.npz``)
and its whole state (a checkpoint: the weights with the running statistics, the optimizer's slots
in canonical names). :func:`first_divergent_op` walks the steps in the order a step computes them:
the loss (the forward pass and the loss on the same weights and batch), each parameter's gradient,
each optimizer slot, each parameter after the update, each running statistic. The first that
differs beyond rounding is the finding. Where its mechanism is one of a known list it is named: an
update checked against the spec's rule (dualtrain.core.optim_ref) from the same state and gradient,
and against the variants ports are known to carry (amsgrad, Keras's eps, L2 for decoupled decay,
dampening, eps inside the square root, Nesterov, centered); a running statistic against the
other momentum convention and the biased batch variance.

Framework-free: it reads run folders only.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.core import optim_ref
from dualtrain.core.weights import Weights, load_weights
from dualtrain.parity import readings as R
from dualtrain.records.record import WEIGHTS_INIT, read_run
from dualtrain.runtime import checkpoint
from dualtrain.spec import OPTIMIZERS, OptimizerName, OptimizerSpec

#: compare's replay folder under OUT (torch/ and tf/ in it)
REPLAY = "replay"
#: The longest replay compare makes (a pair that parts later is described by its checks alone).
MAX_STEPS = 64
#: Relative difference that counts as parting: the first steps of a fp64 pair sit at 1e-16-1e-15.
TOL = 1e-10

LOSS, GRADIENT, SLOT, UPDATE, RUNNING, EVALUATION = (
    "loss",
    "gradient",
    "optimizer slot",
    "update",
    "running statistic",
    "evaluation",
)


@dataclass(frozen=True)
class OpFinding:
    """The first operation at which the replayed pair parts."""

    step: int
    stage: str
    """loss, gradient, optimizer slot, update or running statistic."""
    tensor: str | None
    rel: float
    what: str
    """The finding in the user's words."""
    mechanism: str = ""
    """The known mechanism that reproduces it, where one does."""

    def lead(self) -> str:
        return f"{self.what} ({self.mechanism})" if self.mechanism else self.what

    def to_json(self) -> dict[str, object]:
        return {**dataclasses.asdict(self), "lead": self.lead()}


def _rel(a: np.ndarray, b: np.ndarray, floor: float = 0.0) -> float:
    """||a - b|| / max(||a||, floor); ``floor``: a scale below which a tensor counts as zero (a
    bias before a batchnorm has a gradient of rounding noise, ~1e-17, on both sides)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return math.inf
    ref = max(float(np.linalg.norm(a)), floor)
    d = float(np.linalg.norm(a - b))
    value = d / ref if ref > 0 else d
    return math.inf if math.isnan(value) else value


#: A tensor whose norm is below this share of its kind's largest (gradients, slots) counts as zero.
ZERO_SHARE = 1e-3


def _floor(tensors: Weights) -> float:
    return ZERO_SHARE * max((float(np.linalg.norm(v)) for v in tensors.values()), default=0.0)


@dataclass
class _Side:
    """One replayed run: its label, losses and lrs per step, and its state after each step."""

    label: str
    path: Path
    loss: dict[int, float]
    lr: dict[int, float]

    def grads(self, step: int) -> Weights | None:
        p = self.path / f"grads_step{step}.npz"
        return load_weights(p) if p.is_file() else None

    def state(self, step: int) -> tuple[Weights, Weights, int] | None:
        """(weights, optimizer slots, updates applied) after ``step``; step 0: the initial
        weights, no slots."""
        if step == 0:
            return load_weights(self.path / WEIGHTS_INIT), {}, 0
        where = checkpoint.step_dir(self.path, step)
        if not (where / checkpoint.WEIGHTS).is_file():
            return None
        weights = load_weights(where / checkpoint.WEIGHTS)
        slots = load_weights(where / checkpoint.OPTIMIZER)
        applied = int(json.loads((where / checkpoint.STATE).read_text()).get("applied", step))
        return {k: v for k, v in weights.items() if not k.startswith("ema/")}, slots, applied


def _side(path: Path, fallback: str) -> _Side:
    rec = read_run(path, require_summary=False)
    return _Side(R.label(rec, fallback), path, R.step_map(rec, "loss"), R.step_map(rec, "lr"))


def first_divergent_op(a_dir: Path, b_dir: Path, opt: OptimizerSpec) -> OpFinding | None:
    """The first operation at which two replayed runs part (see the module's docstring), or None
    where they agree over every step both replayed."""
    a, b = _side(Path(a_dir), "A"), _side(Path(b_dir), "B")
    steps = sorted(set(a.loss) & set(b.loss))
    for s in steps:
        found = _step(a, b, s, opt)
        if found is not None:
            return found
    return _evaluation(a, b)


def _evaluation(a: _Side, b: _Side) -> OpFinding | None:
    """Every training step agrees: an evaluation that differs is the evaluation's own (the model in
    inference: dropout left on, batchnorm's running statistics, another split)."""
    ra, rb = (read_run(x.path, require_summary=False) for x in (a, b))
    for key, split in (("loss", "test"), ("val_loss", "validation")):
        ea = R.step_map(ra, key, "eval", present=True)
        eb = R.step_map(rb, key, "eval", present=True)
        for s in sorted(set(ea) & set(eb)):
            d = R.scaled_diff(ea[s], eb[s])
            if d > TOL:
                return OpFinding(
                    s,
                    EVALUATION,
                    None,
                    d,
                    f"the evaluation of the {split} split after step {s} differs ({a.label} loss "
                    f"{ea[s]:.17g}, {b.label} {eb[s]:.17g}) while every training step agrees: the "
                    f"model in inference (dropout left on, batchnorm's running statistics) or the "
                    f"evaluated samples",
                )
    return None


def _step(a: _Side, b: _Side, s: int, opt: OptimizerSpec) -> OpFinding | None:
    before_a, before_b = a.state(s - 1), b.state(s - 1)
    if R.scaled_diff(a.loss[s], b.loss[s]) > TOL:
        return OpFinding(
            s,
            LOSS,
            None,
            R.scaled_diff(a.loss[s], b.loss[s]),
            f"the loss of step {s} differs on the same weights and batch ({a.label} "
            f"{a.loss[s]:.17g}, {b.label} {b.loss[s]:.17g}): the forward pass or the loss",
        )
    ga, gb = a.grads(s), b.grads(s)
    if ga is None or gb is None:
        return None
    floor = _floor(ga)
    for name in ga:
        r = _rel(ga[name], gb.get(name, np.full(1, np.nan)), floor)
        if r > TOL:
            return OpFinding(
                s,
                GRADIENT,
                name,
                r,
                f"the gradient of {name!r} at step {s} differs ({r:.3g} relative); the loss "
                f"agrees: the backward pass, at the layer that holds {name!r}",
            )
    after_a, after_b = a.state(s), b.state(s)
    if after_a is None or after_b is None or before_a is None or before_b is None:
        return None
    (wa, _, _), (wb, _, _) = after_a, after_b
    found = _slots(a, b, s, opt, after_a[1], after_b[1])
    if found is not None and found.tensor is not None:
        name = found.tensor.partition("/")[2]
        if name in ga and not found.mechanism:  # a slot the update reads: which rule moved it
            mechanism = _update_mechanism(a, b, s, opt, name, before_a, ga, (wa, wb))
            found = dataclasses.replace(found, mechanism=mechanism)
    if found is not None:
        return found
    for name in wa:
        r = _rel(wa[name], wb.get(name, np.full(1, np.nan)))
        if r <= TOL:
            continue
        if name in ga:
            mechanism = _update_mechanism(a, b, s, opt, name, before_a, ga, (wa, wb))
            return OpFinding(
                s,
                UPDATE,
                name,
                r,
                f"{_opt_name(opt)}'s update of {name!r} at step {s} differs ({r:.3g} relative); "
                f"the gradients agree: the optimizer",
                mechanism,
            )
        old = before_a[0].get(name)
        return OpFinding(
            s,
            RUNNING,
            name,
            r,
            f"the running statistic {name!r} after step {s} differs ({r:.3g} relative); the "
            f"gradients agree: the layer's statistics update",
            running_mechanism(a.label, b.label, old, wa[name], wb[name]),
        )
    return None


def _slots(
    a: _Side, b: _Side, s: int, opt: OptimizerSpec, sa: Weights, sb: Weights
) -> OpFinding | None:
    only = sorted(set(sa) ^ set(sb))
    if only:
        side = a.label if only[0] in sa else b.label
        slot = only[0].split("/", 1)[0]
        hint = " (amsgrad)" if slot.startswith("max_exp_avg_sq") else ""
        return OpFinding(
            s,
            SLOT,
            only[0],
            math.inf,
            f"{_opt_name(opt)} on {side} keeps an optimizer slot the other does not: {slot}{hint}",
            f"{side}'s optimizer is another variant than the spec's",
        )
    floor = _floor(sa)
    for key in sa:
        r = _rel(sa[key], sb[key], floor)
        if r > TOL:
            slot, _, name = key.partition("/")
            return OpFinding(
                s,
                SLOT,
                key,
                r,
                f"{_opt_name(opt)}'s {slot} of {name!r} after step {s} differs ({r:.3g} "
                f"relative); the gradients agree: the optimizer",
            )
    return None


def _opt_name(opt: OptimizerSpec) -> str:
    return OPTIMIZERS[opt.name].torch_class


def _eps(opt: OptimizerSpec) -> float:
    return OPTIMIZERS[opt.name].default_eps if opt.eps is None else opt.eps


# ---- mechanisms ------------------------------------------------------------------------------


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


def _update_mechanism(
    a: _Side,
    b: _Side,
    s: int,
    opt: OptimizerSpec,
    name: str,
    before: tuple[Weights, Weights, int],
    grads: Weights,
    after: tuple[Weights, Weights],
) -> str:
    """Which side follows the spec's rule from the same state and gradient, and the known variant
    that reproduces the other, if any."""
    weights, slots, applied = before
    lr = a.lr.get(s)
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
    follows = [_rel(want, d) <= 1e-8 for side, d in zip(after, moved, strict=True)]
    if follows[0] == follows[1]:
        return "" if follows[0] else "neither side's update is the spec's rule"
    off, label, other = (moved[1], b.label, a.label) if follows[0] else (moved[0], a.label, b.label)
    for what, variant in _variants(opt).items():
        if _rel(variant(opt, lr, p, g, f64, name, applied) - p, off) <= 1e-6:
            return f"{label} departs from the spec's rule: {what}"
    scale = float(np.vdot(off, want) / max(float(np.vdot(want, want)), 1e-300))
    if _rel(scale * want, off) <= 1e-6:  # the rule's direction, another length
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
        if _rel(m * old + (1 - m) * batch, new_b) <= 1e-8:
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

"""torch.optim's update rules, GradScaler's dynamic loss scale and the global gradient norm, written
once.

Every caller hands in a tiny array namespace (dualtrain.core.ops.Ops): a fused multiply-add
with torch's rounding, a square root, ``where``, ``minimum``, comparisons, casts of a scalar to a
dtype, a float64 power, and an L2 norm; ``+ - * /`` on the caller's arrays do the rest. The TF
backend applies these functions to its variables inside its step (dualtrain/backends/tf/ops.py),
the float64 NumPy namespace (dualtrain.core.ops.NUMPY) is the exact update the one-step probes
judge against (dualtrain/core/optim_ref.py), and the torch backend, which keeps torch.optim and
GradScaler as the reference, takes the gradient norm from here (dualtrain/backends/torch/ops.py).

The rules are pure: they return the new parameter and the new slot values, and the caller assigns
them. They write out torch.optim's single-tensor paths (``_single_tensor_sgd``, ``_adam``,
``_adamax``, ``_adadelta``, ``_rmsprop``) op for op, under torch's slot names (``momentum_buffer``,
``exp_avg``, ...). Scalars (lr, betas, eps, ...) are Python floats or, for lr, a float64 scalar of
the namespace: a Python number meets an array in the array's dtype (TF's and NumPy's rule), as
torch's scalar arguments do; where torch computes a factor in double and rounds it once,
``Ops.cast`` does that rounding. tests/backends/torch/test_update_rules_torch.py compares them, on
the NumPy namespace, with torch.optim, torch.amp.GradScaler and clip_grad_norm_, and lists where
torch's kernels round differently (a few eps; float32 SGD is bit for bit).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dualtrain.core.ops import NormOps, Ops
from dualtrain.spec import OPTIMIZERS, LossScaleSpec, OptimizerName, OptimizerSpec

# ---- update rules --------------------------------------------------------------------------------


def sgd(
    ops: Ops,
    p: Any,
    g: Any,
    buf: Any,
    *,
    lr: Any,
    momentum: float,
    nesterov: bool,
    weight_decay: float,
    applied: Any,
) -> tuple[Any, Any]:
    """torch.optim.SGD (dampening 0): (new parameter, new momentum buffer; None without momentum).

    ``applied``: updates applied before this one. torch creates the buffer as a copy of the gradient
    at the first update (its ``buf is None``), here the first applied update (``applied == 0``)."""
    if weight_decay:
        g = ops.fma(g, weight_decay, p)  # torch: grad.add(param, alpha=wd)
    new_buf = None
    if momentum:
        # torch: buf = grad.clone() at the first update, else buf.mul_(momentum).add_(grad)
        new_buf = ops.where(ops.equal(applied, 0), g, buf * momentum + g)
        g = ops.fma(g, momentum, new_buf) if nesterov else new_buf  # grad.add(buf, alpha=momentum)
    return ops.fma(p, -lr, g), new_buf  # torch: param.add_(grad, alpha=-lr)


def adam(
    ops: Ops,
    p: Any,
    g: Any,
    exp_avg: Any,
    exp_avg_sq: Any,
    *,
    lr: Any,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    decoupled: bool,
    applied: Any,
) -> tuple[Any, Any, Any]:
    """torch.optim.Adam (``decoupled``: AdamW): (new parameter, new exp_avg, new exp_avg_sq).

    ``applied``: updates applied before this one (the bias corrections use t = applied + 1)."""
    if decoupled and weight_decay:
        # torch: param.mul_(1 - lr * wd), the factor computed in double, then rounded
        p = p * ops.cast(1.0 - lr * weight_decay, p)
    elif weight_decay:
        g = ops.fma(g, weight_decay, p)  # torch: grad.add(param, alpha=wd)
    b1, b2 = betas
    # torch: exp_avg.lerp_(grad, 1 - beta1). torch's lerp takes this form for a weight < 0.5 (beta1
    # > 0.5) and ``grad - (grad - exp_avg) * beta1`` otherwise; this one form is what the TF
    # backend has always computed (rmsprop below writes out both forms).
    m = exp_avg + (1.0 - b1) * (g - exp_avg)
    v = exp_avg_sq * b2 + (1.0 - b2) * g * g  # exp_avg_sq.mul_(b2).addcmul_(g, g, value=1 - b2)
    t = ops.float64(applied + 1)
    bc1 = 1.0 - ops.power(ops.float64(b1), t)
    bc2_sqrt = ops.sqrt(1.0 - ops.power(ops.float64(b2), t))
    step_size = ops.cast(lr / bc1, p)  # torch: lr / bias_correction1 in double
    denom = ops.sqrt(v) / ops.cast(bc2_sqrt, p) + eps  # (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)
    return p - step_size * (m / denom), m, v  # param.addcdiv_(exp_avg, denom, value=-step_size)


def adamax(
    ops: Ops,
    p: Any,
    g: Any,
    exp_avg: Any,
    exp_inf: Any,
    *,
    lr: Any,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    applied: Any,
) -> tuple[Any, Any, Any]:
    """torch.optim.Adamax (_single_tensor_adamax), op for op: (new parameter, new exp_avg, new
    exp_inf). ``applied``: updates applied before this one (the bias correction uses t = applied +
    1)."""
    if weight_decay:
        g = ops.fma(g, weight_decay, p)  # torch: grad.add(param, alpha=wd)
    b1, b2 = betas
    w = 1.0 - b1  # exp_avg.lerp_(grad, 1 - beta1): torch's two lerp forms, by weight
    m = exp_avg + w * (g - exp_avg) if w < 0.5 else g - (g - exp_avg) * (1.0 - w)
    # torch.maximum(exp_inf.mul_(beta2), grad.abs().add_(eps))
    u = ops.maximum(exp_inf * b2, abs(g) + eps)
    bc1 = 1.0 - ops.power(ops.float64(b1), ops.float64(applied + 1))  # 1 - beta1 ** step, double
    clr = ops.cast(lr / bc1, p)  # lr / bias_correction in double, rounded for addcdiv
    return p - clr * (m / u), m, u  # param.addcdiv_(exp_avg, exp_inf, value=-clr)


def _adamax_rule(
    ops: Ops,
    opt: OptimizerSpec,
    p: Any,
    g: Any,
    slots: Mapping[str, Any],
    lr: Any,
    applied: Any,
) -> tuple[Any, dict[str, Any]]:
    assert opt.eps is not None  # OptimizerSpec fills in torch's default for a null eps
    p, m, u = adamax(
        ops,
        p,
        g,
        slots["exp_avg"],
        slots["exp_inf"],
        lr=lr,
        betas=opt.betas,
        eps=opt.eps,
        weight_decay=opt.weight_decay,
        applied=applied,
    )
    return p, {"exp_avg": m, "exp_inf": u}


def adadelta(
    ops: Ops,
    p: Any,
    g: Any,
    square_avg: Any,
    acc_delta: Any,
    *,
    lr: Any,
    rho: float,
    eps: float,
    weight_decay: float,
) -> tuple[Any, Any, Any]:
    """torch.optim.Adadelta (_single_tensor_adadelta), op for op: (new parameter, new square_avg,
    new acc_delta)."""
    if weight_decay:
        g = ops.fma(g, weight_decay, p)  # grad.add(param, alpha=wd)
    sq = square_avg * rho + (1.0 - rho) * g * g  # square_avg.mul_(rho).addcmul_(g, g, 1-rho)
    std = ops.sqrt(sq + eps)  # square_avg.add(eps).sqrt_()
    delta = ops.sqrt(acc_delta + eps) / std * g  # acc_delta.add(eps).sqrt_().div_(std).mul_(grad)
    acc = acc_delta * rho + (1.0 - rho) * delta * delta
    return ops.fma(p, -lr, delta), sq, acc  # param.add_(delta, alpha=-lr)


def rmsprop(
    ops: Ops,
    p: Any,
    g: Any,
    square_avg: Any,
    grad_avg: Any,
    buf: Any,
    *,
    lr: Any,
    alpha: float,
    eps: float,
    weight_decay: float,
    momentum: float,
    centered: bool,
) -> tuple[Any, Any, Any, Any]:
    """torch.optim.RMSprop (_single_tensor_rmsprop), op for op: (new parameter, new square_avg,
    new grad_avg (None unless centered), new momentum buffer (None without momentum))."""
    if weight_decay:
        g = ops.fma(g, weight_decay, p)
    sq = square_avg * alpha + (1.0 - alpha) * g * g  # mul_(alpha).addcmul_(g, g, 1-alpha)
    ga = None
    if centered:
        w = 1.0 - alpha  # grad_avg.lerp_(grad, w): torch's two lerp forms, by weight
        ga = grad_avg + w * (g - grad_avg) if w < 0.5 else g - (g - grad_avg) * (1.0 - w)
        avg = ops.sqrt(sq - ga * ga)  # square_avg.addcmul(ga, ga, value=-1).sqrt_()
    else:
        avg = ops.sqrt(sq)
    avg = avg + eps
    if momentum:
        new_buf = buf * momentum + g / avg  # buf.mul_(momentum).addcdiv_(grad, avg)
        return ops.fma(p, -lr, new_buf), sq, ga, new_buf  # param.add_(buf, alpha=-lr)
    return ops.fma(p, -lr, g / avg), sq, ga, None  # param.addcdiv_(grad, avg, value=-lr)


def slot_names(opt: OptimizerSpec) -> tuple[str, ...]:
    """The per-parameter state ``opt`` keeps, under torch.optim's names (dualtrain.spec.optimizers
    declares them)."""
    return OPTIMIZERS[opt.name].slot_names(opt.momentum, opt.centered)


#: One optimizer's rule on one parameter: (ops, its spec, p, clipped g, current slots by name, lr,
#: applied updates before this one) -> (new parameter, new slots by name).
Rule = Callable[
    [Ops, OptimizerSpec, Any, Any, Mapping[str, Any], Any, Any], tuple[Any, dict[str, Any]]
]


def _sgd_rule(
    ops: Ops, opt: OptimizerSpec, p: Any, g: Any, slots: Mapping[str, Any], lr: Any, applied: Any
) -> tuple[Any, dict[str, Any]]:
    p, buf = sgd(
        ops,
        p,
        g,
        slots.get("momentum_buffer"),
        lr=lr,
        momentum=opt.momentum,
        nesterov=opt.nesterov,
        weight_decay=opt.weight_decay,
        applied=applied,
    )
    return p, {} if buf is None else {"momentum_buffer": buf}


def _adam_rule(
    ops: Ops, opt: OptimizerSpec, p: Any, g: Any, slots: Mapping[str, Any], lr: Any, applied: Any
) -> tuple[Any, dict[str, Any]]:
    assert opt.eps is not None  # OptimizerSpec fills in torch's default for a null eps
    p, m, v = adam(
        ops,
        p,
        g,
        slots["exp_avg"],
        slots["exp_avg_sq"],
        lr=lr,
        betas=opt.betas,
        eps=opt.eps,
        weight_decay=opt.weight_decay,
        decoupled=opt.name is OptimizerName.ADAMW,
        applied=applied,
    )
    return p, {"exp_avg": m, "exp_avg_sq": v}


def _adadelta_rule(
    ops: Ops, opt: OptimizerSpec, p: Any, g: Any, slots: Mapping[str, Any], lr: Any, applied: Any
) -> tuple[Any, dict[str, Any]]:
    assert opt.eps is not None
    p, sq, acc = adadelta(
        ops,
        p,
        g,
        slots["square_avg"],
        slots["acc_delta"],
        lr=lr,
        rho=opt.rho,
        eps=opt.eps,
        weight_decay=opt.weight_decay,
    )
    return p, {"square_avg": sq, "acc_delta": acc}


def _rmsprop_rule(
    ops: Ops, opt: OptimizerSpec, p: Any, g: Any, slots: Mapping[str, Any], lr: Any, applied: Any
) -> tuple[Any, dict[str, Any]]:
    assert opt.eps is not None
    p, sq, ga, buf = rmsprop(
        ops,
        p,
        g,
        slots["square_avg"],
        slots.get("grad_avg"),
        slots.get("momentum_buffer"),
        lr=lr,
        alpha=opt.alpha,
        eps=opt.eps,
        weight_decay=opt.weight_decay,
        momentum=opt.momentum,
        centered=opt.centered,
    )
    new = {"square_avg": sq, "grad_avg": ga, "momentum_buffer": buf}
    return p, {k: v for k, v in new.items() if v is not None}


#: The rule of each optimizer dualtrain.spec.optimizers declares (the same names; a test holds it).
RULES: dict[OptimizerName, Rule] = {
    OptimizerName.SGD: _sgd_rule,
    OptimizerName.ADAM: _adam_rule,
    OptimizerName.ADAMW: _adam_rule,
    OptimizerName.ADAMAX: _adamax_rule,
    OptimizerName.ADADELTA: _adadelta_rule,
    OptimizerName.RMSPROP: _rmsprop_rule,
}


def update(
    ops: Ops, opt: OptimizerSpec, p: Any, g: Any, slots: Mapping[str, Any], *, lr: Any, applied: Any
) -> tuple[Any, dict[str, Any]]:
    """One update of one parameter by ``opt``'s rule: (new parameter, new slots by name).

    ``slots``: the current value of each of :func:`slot_names` (zeros before the first applied
    update); ``g``: the gradient, clipped; ``applied``: updates applied before this one."""
    return RULES[opt.name](ops, opt, p, g, slots, lr, applied)


# ---- loss scale, norm, clipping ------------------------------------------------------------------


def loss_scale_update(
    ops: Ops, scale: Any, good_steps: Any, finite: Any, ls: LossScaleSpec
) -> tuple[Any, Any]:
    """GradScaler's dynamic loss-scale rule (``torch._amp_update_scale_``): (new scale, new count of
    consecutive finite steps). A step whose all-reduced gradient is not ``finite`` is skipped (its
    update is not applied) and multiplies the scale by backoff_factor; growth_interval finite steps
    in a row multiply it by growth_factor. ``scale``: float32, ``good_steps``: an integer.

    torch multiplies the float32 scale by the double factor and rounds once, and keeps the scale
    when growing it would overflow to inf; this rule multiplies by the factor rounded to float32:
    the same for factors float32 holds exactly (the defaults 2 and 0.5) and scales below 2**128."""
    inc = good_steps + 1
    good = ops.where(finite, inc, ops.zeros_like(inc))
    grow = ops.logical_and(finite, ops.equal(good, ls.growth_interval))
    new_scale = ops.where(
        finite, ops.where(grow, scale * ls.growth_factor, scale), scale * ls.backoff_factor
    )
    return new_scale, ops.where(grow, ops.zeros_like(good), good)


def global_norm(ops: NormOps, grads: Sequence[Any]) -> Any:
    """The L2 norm over all gradients as torch.nn.utils.clip_grad_norm_ computes it: the L2 norm of
    the per-tensor L2 norms, in the gradients' dtype."""
    return ops.norm(ops.stack([ops.norm(g) for g in grads]))


def clip_coefficient(ops: Ops, norm: Any, max_norm: float) -> Any:
    """torch's clip_grad_norm_ coefficient ``min(1, max_norm / (norm + 1e-6))``, in norm's dtype
    (torch computes the quotient as ``reciprocal(norm + 1e-6) * max_norm``, which can be one ulp
    off this single division, the TF backend's)."""
    return ops.minimum(ops.cast(max_norm, norm) / (norm + 1e-6), 1.0)


def clip(ops: Ops, grads: Sequence[Any], norm: Any, max_norm: float | None) -> list[Any]:
    """The gradients times :func:`clip_coefficient` (unchanged when ``max_norm`` is None)."""
    if max_norm is None:
        return list(grads)
    coef = clip_coefficient(ops, norm, max_norm)
    return [g * coef for g in grads]

"""dualtrain.core.update_rules on its NumPy namespace against closed forms (framework-free; the
comparison with torch.optim and GradScaler themselves is
tests/backends/torch/test_update_rules_torch.py)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from dualtrain.core import optim_ref, update_rules
from dualtrain.core.ops import NUMPY
from dualtrain.spec import LossScaleSpec, OptimizerName, OptimizerSpec

F64, F32 = np.float64, np.float32


def _arrays(seed: int, dtype=F64, n: int = 3, shape=(7, 5)):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=shape).astype(dtype) for _ in range(n)]


def test_sgd_plain_is_p_minus_lr_g():
    p, g = _arrays(0, n=2)
    new, buf = update_rules.sgd(
        NUMPY, p, g, None, lr=0.1, momentum=0.0, nesterov=False, weight_decay=0.0, applied=5
    )
    assert buf is None
    np.testing.assert_array_equal(new, p - 0.1 * g)


def test_sgd_momentum_buffer_is_the_gradient_at_the_first_update_then_accumulates():
    p, g, old = _arrays(1)
    kw = {"lr": 0.1, "momentum": 0.9, "nesterov": False, "weight_decay": 0.0}
    new, buf = update_rules.sgd(NUMPY, p, g, old, applied=0, **kw)
    np.testing.assert_array_equal(buf, g)  # torch: a copy of the gradient, whatever the buffer held
    np.testing.assert_array_equal(new, p - 0.1 * g)
    new, buf = update_rules.sgd(NUMPY, p, g, old, applied=3, **kw)
    np.testing.assert_array_equal(buf, old * 0.9 + g)
    np.testing.assert_array_equal(new, p - 0.1 * (old * 0.9 + g))


def test_sgd_nesterov_and_coupled_weight_decay():
    p, g, old = _arrays(2)
    new, buf = update_rules.sgd(
        NUMPY, p, g, old, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01, applied=2
    )
    d = g + 0.01 * p
    np.testing.assert_array_equal(buf, old * 0.9 + d)
    np.testing.assert_array_equal(new, p - 0.05 * (d + 0.9 * (old * 0.9 + d)))


@pytest.mark.parametrize("decoupled", [False, True])
def test_adam_first_step_moves_each_weight_by_about_lr(decoupled):
    """At t = 1 the bias-corrected moments are g and g**2: the step is lr * g / (|g| + eps)."""
    p, g = _arrays(3, n=2)
    zeros = np.zeros_like(p)
    lr, wd, eps = 1e-3, 0.1, 1e-8
    new, m, v = update_rules.adam(
        NUMPY,
        p,
        g,
        zeros,
        zeros,
        lr=lr,
        betas=(0.9, 0.999),
        eps=eps,
        weight_decay=wd,
        decoupled=decoupled,
        applied=0,
    )
    d = g if decoupled else g + wd * p
    np.testing.assert_allclose(m, (1 - 0.9) * d, rtol=1e-15)
    np.testing.assert_allclose(v, (1 - 0.999) * d * d, rtol=1e-15)
    start = p * (1 - lr * wd) if decoupled else p
    np.testing.assert_allclose(new, start - lr * d / (np.abs(d) + eps), rtol=1e-15, atol=1e-18)


def test_adam_bias_correction_uses_the_applied_count():
    p, g, m0 = _arrays(4)
    v0 = np.abs(m0)
    lr, (b1, b2), eps, t = 0.01, (0.8, 0.99), 1e-6, 4
    new, m, v = update_rules.adam(
        NUMPY,
        p,
        g,
        m0,
        v0,
        lr=lr,
        betas=(b1, b2),
        eps=eps,
        weight_decay=0.0,
        decoupled=False,
        applied=t - 1,
    )
    np.testing.assert_allclose(m, b1 * m0 + (1 - b1) * g, rtol=1e-14)
    np.testing.assert_allclose(v, b2 * v0 + (1 - b2) * g * g, rtol=1e-14)
    m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
    np.testing.assert_allclose(new, p - lr * m_hat / (np.sqrt(v_hat) + eps), rtol=1e-14)


def test_adadelta_first_step():
    p, g = _arrays(5, n=2)
    zeros = np.zeros_like(p)
    rho, eps, lr = 0.9, 1e-6, 1.0
    new, sq, acc = update_rules.adadelta(
        NUMPY, p, g, zeros, zeros, lr=lr, rho=rho, eps=eps, weight_decay=0.0
    )
    np.testing.assert_allclose(sq, (1 - rho) * g * g, rtol=1e-15)
    delta = np.sqrt(eps) / np.sqrt((1 - rho) * g * g + eps) * g
    np.testing.assert_allclose(acc, (1 - rho) * delta * delta, rtol=1e-14)
    np.testing.assert_allclose(new, p - lr * delta, rtol=1e-15)


@pytest.mark.parametrize("alpha", [0.99, 0.3])  # 0.3: lerp's weight 0.7 takes torch's second form
@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("centered", [False, True])
def test_rmsprop_against_its_definition(alpha, momentum, centered):
    p, g, sq0, ga0, buf0 = _arrays(6, n=5)
    sq0, ga0 = np.abs(sq0) + 1.0, ga0 * 0.1  # keeps the centered second moment positive
    lr, eps = 0.01, 1e-8
    new, sq, ga, buf = update_rules.rmsprop(
        NUMPY,
        p,
        g,
        sq0,
        ga0,
        buf0,
        lr=lr,
        alpha=alpha,
        eps=eps,
        weight_decay=0.0,
        momentum=momentum,
        centered=centered,
    )
    np.testing.assert_allclose(sq, alpha * sq0 + (1 - alpha) * g * g, rtol=1e-15)
    avg = np.sqrt(sq)
    if centered:
        np.testing.assert_allclose(ga, alpha * ga0 + (1 - alpha) * g, rtol=1e-14, atol=1e-16)
        avg = np.sqrt(sq - ga * ga)
    else:
        assert ga is None
    step = g / (avg + eps)
    if momentum:
        np.testing.assert_allclose(buf, momentum * buf0 + step, rtol=1e-14)
        step = buf
    else:
        assert buf is None
    np.testing.assert_allclose(new, p - lr * step, rtol=1e-14)


def test_rmsprop_lerp_forms_are_torchs():
    """torch's lerp: ``a + w (b - a)`` for w < 0.5, ``b - (b - a)(1 - w)`` otherwise, exactly."""
    p, g, sq0, ga0 = _arrays(7, n=4)
    for alpha in (0.9, 0.3):
        _, _, ga, _ = update_rules.rmsprop(
            NUMPY,
            p,
            g,
            np.abs(sq0) + 10,
            ga0,
            None,
            lr=0.1,
            alpha=alpha,
            eps=1e-8,
            weight_decay=0.0,
            momentum=0.0,
            centered=True,
        )
        w = 1.0 - alpha
        want = ga0 + w * (g - ga0) if w < 0.5 else g - (g - ga0) * (1.0 - w)
        np.testing.assert_array_equal(ga, want)


CASES = [
    OptimizerSpec(name=OptimizerName.SGD),
    OptimizerSpec(name=OptimizerName.SGD, momentum=0.9, nesterov=True, weight_decay=0.01),
    OptimizerSpec(name=OptimizerName.ADAM, weight_decay=0.01),
    OptimizerSpec(name=OptimizerName.ADAMW, weight_decay=0.05),
    OptimizerSpec(name=OptimizerName.ADAMAX, weight_decay=0.01),
    OptimizerSpec(name=OptimizerName.ADADELTA, lr=1.0, weight_decay=0.01),
    OptimizerSpec(name=OptimizerName.RMSPROP),
    OptimizerSpec(name=OptimizerName.RMSPROP, momentum=0.9, centered=True, weight_decay=0.01),
]
SLOTS = {
    OptimizerName.SGD: {"momentum_buffer"},
    OptimizerName.ADAM: {"exp_avg", "exp_avg_sq"},
    OptimizerName.ADAMW: {"exp_avg", "exp_avg_sq"},
    OptimizerName.ADAMAX: {"exp_avg", "exp_inf"},
    OptimizerName.ADADELTA: {"square_avg", "acc_delta"},
    OptimizerName.RMSPROP: {"square_avg", "grad_avg", "momentum_buffer"},
}


@pytest.mark.parametrize("opt", CASES, ids=lambda o: f"{o.name.value}-{o.momentum}-{o.centered}")
@pytest.mark.parametrize("dtype", [F64, F32])
def test_update_returns_every_slot_it_keeps_in_the_parameter_dtype(opt, dtype):
    names = update_rules.slot_names(opt)
    assert set(names) <= SLOTS[opt.name]
    p, g = _arrays(8, dtype, n=2)
    slots = {k: np.zeros_like(p) for k in names}
    new, new_slots = update_rules.update(NUMPY, opt, p, g, slots, lr=opt.lr, applied=0)
    assert set(new_slots) == set(names)
    assert new.dtype == dtype and new.shape == p.shape
    assert all(v.dtype == dtype and v.shape == p.shape for v in new_slots.values())
    assert np.all(np.isfinite(new)) and not np.array_equal(new, p)


def _round_to_f32(x: Fraction) -> np.float32:
    """x rounded once to the nearest float32 (ties to even), from its exact value."""
    f = np.float32(float(x))  # within one float32 ulp of the answer
    best = min(
        (np.nextafter(f, F32(-np.inf)), f, np.nextafter(f, F32(np.inf))),
        key=lambda c: (abs(Fraction(float(c)) - x), int(c.view(np.int32)) & 1),
    )
    return F32(best)


def test_float32_fma_rounds_once_like_torchs_fused_add():
    rng = np.random.default_rng(9)
    n = 2000
    a = (rng.normal(size=n) * 2.0 ** rng.integers(-8, 8, n)).astype(F32)
    b = (rng.normal(size=n) * 2.0 ** rng.integers(-8, 8, n)).astype(F32)
    alpha = -0.1  # rounded to float32 first, as torch rounds a Python alpha for a float32 tensor
    got = NUMPY.fma(a, alpha, b)
    assert got.dtype == F32
    al = Fraction(float(F32(alpha)))
    want = np.array(
        [
            _round_to_f32(Fraction(float(x)) + al * Fraction(float(y)))
            for x, y in zip(a, b, strict=True)
        ],
        F32,
    )
    np.testing.assert_array_equal(got, want)
    twice = a + F32(alpha) * b  # two float32 roundings differ from one on some elements
    assert np.count_nonzero(twice != want) > 0


def _scaler_reference(scale: float, finite: list[bool], ls: LossScaleSpec):
    """torch._amp_update_scale_ (aten AmpKernels.cpp, CPU), transcribed: scales and growth
    trackers after each step."""
    tracker, out = 0, []
    scale = F32(scale)
    for ok in finite:
        if not ok:
            scale, tracker = F32(float(scale) * ls.backoff_factor), 0
        elif tracker + 1 == ls.growth_interval:
            grown = F32(float(scale) * ls.growth_factor)
            scale, tracker = (grown if np.isfinite(grown) else scale), 0
        else:
            tracker += 1
        out.append((float(scale), tracker))
    return out


@pytest.mark.parametrize(
    "ls",
    [
        LossScaleSpec(),
        LossScaleSpec(init=8.0, growth_interval=1),
        LossScaleSpec(init=2.0**20, growth_factor=4.0, backoff_factor=0.25, growth_interval=3),
    ],
)
def test_loss_scale_follows_gradscalers_rule(ls):
    rng = np.random.default_rng(10)
    finite = [bool(x) for x in rng.random(60) > 0.15] + [True] * (2 * ls.growth_interval)
    scale, good, got = F32(ls.init), 0, []
    for ok in finite:
        scale, good = update_rules.loss_scale_update(NUMPY, scale, good, ok, ls)
        assert np.asarray(scale).dtype == F32
        got.append((float(scale), int(good)))
    assert got == _scaler_reference(ls.init, finite, ls)


def test_loss_scale_grows_after_growth_interval_and_backs_off_on_overflow():
    ls = LossScaleSpec(init=1024.0, growth_interval=2)
    seq, scale, good = [], F32(ls.init), 0
    for ok in (True, True, True, False, True, True):
        scale, good = update_rules.loss_scale_update(NUMPY, scale, good, ok, ls)
        seq.append((float(scale), int(good)))
    assert seq == [(1024, 1), (2048, 0), (2048, 1), (1024, 0), (1024, 1), (2048, 0)]


def test_global_norm_is_the_norm_of_the_per_tensor_norms():
    grads = _arrays(11, n=4) + [np.array([3.0, 4.0])]
    norm = update_rules.global_norm(NUMPY, grads)
    flat = np.concatenate([g.reshape(-1) for g in grads])
    np.testing.assert_allclose(norm, np.sqrt(np.sum(flat * flat)), rtol=4e-16)
    assert update_rules.global_norm(NUMPY, [np.array([3.0, 4.0])]) == 5.0
    pair = [np.array([3.0], F32), np.array([4.0], F32)]
    assert update_rules.global_norm(NUMPY, pair).dtype == F32


def test_clip_coefficient_and_clip():
    grads = [np.array([3.0, 4.0])]
    norm = update_rules.global_norm(NUMPY, grads)
    assert update_rules.clip_coefficient(NUMPY, norm, 1.0) == 1.0 / (5.0 + 1e-6)
    assert update_rules.clip_coefficient(NUMPY, norm, 100.0) == 1.0  # never scales up
    np.testing.assert_array_equal(
        update_rules.clip(NUMPY, grads, norm, 1.0)[0], grads[0] * (1.0 / (5.0 + 1e-6))
    )
    assert update_rules.clip(NUMPY, grads, norm, None)[0] is grads[0]
    assert optim_ref.clip_coefficient({"w": grads[0]}, 1.0) == (5.0, 1.0 / (5.0 + 1e-6))
    assert optim_ref.clip_coefficient({"w": grads[0]}, None) == (5.0, 1.0)


def test_optim_ref_step_is_the_core_rule_with_clipping():
    opt = OptimizerSpec(name=OptimizerName.SGD, momentum=0.9, clip_grad_norm=0.5)
    p, g, buf = _arrays(12)
    ref = optim_ref.step(opt, 0.1, {"w": p}, {"momentum_buffer/w": buf}, 3, {"w": g})
    coef = min(1.0, 0.5 / (np.sqrt(np.sum(g * g)) + 1e-6))
    want, _ = update_rules.sgd(
        NUMPY, p, g * coef, buf, lr=0.1, momentum=0.9, nesterov=False, weight_decay=0.0, applied=3
    )
    np.testing.assert_allclose(ref["w"], want, rtol=1e-15)
    # no state yet: the buffer starts as the gradient
    first = optim_ref.step(opt, 0.1, {"w": p}, {}, 0, {"w": g})
    np.testing.assert_allclose(first["w"], p - 0.1 * g * coef, rtol=1e-15)


def test_each_optimizer_is_declared_once_and_has_one_rule():
    """dualtrain.spec.optimizers declares every optimizer the spec names; the core has a rule for
    each and nothing else; a declaration names only OptimizerSpec fields and known slots."""
    import dataclasses

    from dualtrain.spec import OPTIMIZERS, SLOT_ORDER, OptimizerName, OptimizerSpec

    assert set(OPTIMIZERS) == set(OptimizerName) == set(update_rules.RULES)
    fields = {f.name for f in dataclasses.fields(OptimizerSpec)}
    for name, declared in OPTIMIZERS.items():
        assert declared.name is name
        assert set(declared.options) <= fields, name
        assert {slot for slot, _ in declared.slots} <= set(SLOT_ORDER), name
        assert OptimizerSpec(name=name).eps == declared.default_eps
        # its Keras names (the audit's): each torch option named is one the class takes
        torch_options = {opt.partition(".")[0] for opt, _, _ in declared.keras.options}
        assert torch_options <= set(declared.options) | {"amsgrad"}, name

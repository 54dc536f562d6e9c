"""The known mechanisms the first divergent operation names (dualtrain.parity.replay), on
synthetic numbers: a running statistic read with the other momentum convention or the biased
variance, an update that is amsgrad's, or the spec's rule times a constant."""

from __future__ import annotations

import numpy as np

from dualtrain.core import optim_ref
from dualtrain.parity.mechanisms import adam_amsgrad, running_mechanism, update_mechanism
from dualtrain.spec import OptimizerName, OptimizerSpec

RNG = np.random.default_rng(0)
OLD, BATCH = np.ones(8), 1.0 + RNG.random(8)


def test_the_other_momentum_convention_is_named():
    torch = 0.9 * OLD + 0.1 * BATCH
    keras = 0.1 * OLD + 0.9 * BATCH
    said = running_mechanism("torch", "tf", OLD, torch, keras)
    assert said.startswith("momentum convention: tf's running value = 0.1 x old + 0.9 x batch")


def test_the_biased_variance_is_named_with_its_count():
    n = 64
    torch = 0.9 * OLD + 0.1 * BATCH
    keras = 0.9 * OLD + 0.1 * BATCH * (n - 1) / n
    said = running_mechanism("torch", "tf", OLD, torch, keras)
    assert "the biased variance" in said and "n = 64" in said


def test_an_unrelated_difference_names_no_mechanism():
    torch = 0.9 * OLD + 0.1 * BATCH
    assert running_mechanism("torch", "tf", OLD, torch, torch + RNG.random(8) * 1e-3) == ""


def test_amsgrad_is_adam_until_the_second_moment_falls():
    opt = OptimizerSpec(name=OptimizerName.ADAM, lr=1e-3)
    p, g = RNG.standard_normal(16), RNG.standard_normal(16)
    # from no state, amsgrad's first step is Adam's
    adam = optim_ref.step(opt, 1e-3, {"w": p}, {}, 0, {"w": g})["w"]
    assert np.allclose(adam_amsgrad(opt, 1e-3, p, g, {}, "w", 0), adam, rtol=1e-14)
    # with a larger remembered maximum, it takes a smaller step than Adam
    slots = {
        "exp_avg/w": 0.1 * g,
        "exp_avg_sq/w": 0.01 * g * g,
        "max_exp_avg_sq/w": 10.0 * g * g,
    }
    adam = optim_ref.step(opt, 1e-3, {"w": p}, slots, 1, {"w": g})["w"]
    ams = adam_amsgrad(opt, 1e-3, p, g, slots, "w", 1)
    assert np.all(np.abs(ams - p) < np.abs(adam - p))


def test_a_variant_that_is_the_spec_rule_here_explains_nothing():
    # SGD with momentum, first step: dampening = momentum gives the spec's update (the buffer is
    # the gradient), so an lr x (1 + 1e-6) on one side is the scaled rule, never that variant,
    # however the two updates' one rounding falls (it fell within 1e-6 on an AMD EPYC)
    opt = OptimizerSpec(name=OptimizerName.SGD, lr=0.1, momentum=0.9)
    p, g = RNG.standard_normal(16), RNG.standard_normal(16)
    want = optim_ref.step(opt, 0.1, {"w": p}, {}, 0, {"w": g})["w"]
    for scale in (1 + 1e-6, 1 + 0.999e-6):
        off = p + (want - p) * scale
        said = update_mechanism(
            ("torch", "tf"), 0.1, opt, "w", ({"w": p}, {}, 0), {"w": g}, ({"w": want}, {"w": off})
        )
        assert said.startswith(f"tf's update is the spec's rule x {scale:.9g}"), said

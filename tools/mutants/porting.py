"""Porting mutants (:data:`PORTING_MUTANTS`, [BACKEND/]NAME): the conventions a port between the two
frameworks gets wrong, planted in one backend, each with the words the first divergent operation
(dualtrain.parity.replay) must name it by (parity_tests/test_first_divergent_op.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dualtrain.core import batchnorm, update_rules
from dualtrain.spec import OptimizerName


@dataclass(frozen=True)
class PortingMutant:
    name: str
    backend: str
    what: str
    spec: str
    """The spec of tools.mutants.specs.SPECS it is planted on."""
    stage: str
    """The stage of the first divergent operation (dualtrain.parity.replay)."""
    words: tuple[str, ...]
    """What the finding must say (the operation and the mechanism)."""


PORTING_MUTANTS = {
    m.name: m
    for m in [
        PortingMutant(
            "amsgrad",
            "torch",
            "Adam with amsgrad=True on the torch side",
            "adam",
            "optimizer slot",
            ("torch keeps an optimizer slot the other does not: max_exp_avg_sq (amsgrad)",),
        ),
        PortingMutant(
            "sgd_dampening",
            "torch",
            "SGD with dampening = momentum on the torch side (torch's dampening argument)",
            "sgd",
            "optimizer slot",
            (
                "SGD's momentum_buffer of",
                "torch departs from the spec's rule: dampening = momentum",
            ),
        ),
        PortingMutant(
            "rmsprop_eps_inside",
            "tf",
            "RMSprop's eps inside the square root (TF's tf.keras RMSprop) on the tf side",
            "rmsprop",
            "update",
            ("RMSprop's update of", "tf departs from the spec's rule: eps inside the square root"),
        ),
        PortingMutant(
            "adamw_as_adam_l2",
            "tf",
            "AdamW ported as Adam plus L2 (weight decay added to the gradient) on the tf side",
            "adamw",
            "optimizer slot",
            ("AdamW's exp_avg of", "tf departs from the spec's rule: AdamW ported as Adam plus L2"),
        ),
        PortingMutant(
            "bn_momentum_convention",
            "tf",
            "batchnorm running statistics with Keras's momentum convention read as torch's "
            "(0.1 x old + 0.9 x batch) on the tf side",
            "bn",
            "running statistic",
            ("running", "momentum convention: tf's running value = 0.1 x old + 0.9 x batch"),
        ),
        PortingMutant(
            "bn_eps_keras",
            "tf",
            "batchnorm eps 1e-3 (Keras's default) where the spec says torch's 1e-5, on the tf side",
            "bn",
            "layer",
            (
                "the output of layer '1' (batchnorm) at step 1 differs in training",
                "tf departs from the spec's rule: eps 0.001 (Keras's default)",
            ),
        ),
        PortingMutant(
            "dropout_by_position",
            "tf",
            "dropout masks drawn by the sample's position in the local batch, not by its id, on "
            "the tf side",
            "dropout",
            "layer",
            (
                "the output of layer '3' (dropout) at step 1 differs in training",
                "tf departs from the spec's rule: masks drawn by the sample's position",
            ),
        ),
        PortingMutant(
            "dropout_in_eval",
            "tf",
            "dropout left on in evaluation on the tf side",
            "dropout",
            "layer",
            (
                "the output of layer '3' (dropout) at step 2 differs in inference",
                "tf departs from the spec's rule: dropout left on in inference",
            ),
        ),
    ]
}


def torch_amsgrad() -> None:
    import torch  # lazy: framework

    base = torch.optim.Adam

    class Amsgrad(base):  # type: ignore[misc, valid-type]
        def __init__(self, params: Any, **kw: Any) -> None:
            super().__init__(params, **{**kw, "amsgrad": True})

    torch.optim.Adam = Amsgrad  # type: ignore[misc]


def torch_sgd_dampening() -> None:
    import torch  # lazy: framework

    base = torch.optim.SGD

    class Dampened(base):  # type: ignore[misc, valid-type]
        def __init__(self, params: Any, **kw: Any) -> None:
            super().__init__(params, **{**kw, "dampening": kw.get("momentum", 0.0)})

    torch.optim.SGD = Dampened  # type: ignore[misc]


def tf_rmsprop_eps_inside() -> None:
    rmsprop = update_rules.RULES[OptimizerName.RMSPROP]

    def rule(ops: Any, opt: Any, p: Any, g: Any, slots: Any, lr: Any, applied: Any) -> Any:
        _, new = rmsprop(ops, opt, p, g, slots, lr, applied)  # the same slots (no momentum)
        if opt.weight_decay:
            g = ops.fma(g, opt.weight_decay, p)
        return p - lr * g / ops.sqrt(new["square_avg"] + opt.eps), new

    update_rules.RULES[OptimizerName.RMSPROP] = rule


def tf_adamw_as_adam_l2() -> None:
    adam = update_rules.RULES[OptimizerName.ADAM]

    def rule(ops: Any, opt: Any, p: Any, g: Any, slots: Any, lr: Any, applied: Any) -> Any:
        return adam(
            ops, dataclasses.replace(opt, name=OptimizerName.ADAM), p, g, slots, lr, applied
        )

    update_rules.RULES[OptimizerName.ADAMW] = rule


def tf_bn_momentum_convention() -> None:
    batchnorm.update_running = lambda running, batch, m: running * m + batch * (1.0 - m)


def tf_dropout_by_position() -> None:
    import tensorflow as tf  # lazy: framework

    from dualtrain.backends.tf.layers import HashDropout  # lazy: framework

    call = HashDropout.call

    def by_position(self: Any, inputs: Any, training: Any = None) -> Any:
        x, ids, steps = inputs
        return call(self, [x, tf.range(tf.shape(ids)[0], dtype=tf.int64), steps], training)

    HashDropout.call = by_position  # type: ignore[method-assign]


def tf_dropout_in_eval() -> None:
    from dualtrain.backends.tf.layers import HashDropout  # lazy: framework

    call = HashDropout.call

    def always(self: Any, inputs: Any, training: Any = None) -> Any:
        return call(self, inputs, True)

    HashDropout.call = always  # type: ignore[method-assign]


def tf_bn_eps_keras() -> None:
    normalize = batchnorm.normalize

    def keras_eps(ops: Any, x: Any, mean: Any, var: Any, w: Any, b: Any, eps: float) -> Any:
        return normalize(ops, x, mean, var, w, b, 1e-3)

    batchnorm.normalize = keras_eps

"""torch.optim's update rules and clipping in float64 NumPy: the exact step a probe is judged
against.

The one-step probes (dualtrain.runtime.probes) check the update a backend applied against this exact
update applied to *that backend's own gradient* from the same state, so the update check sees only
the update's arithmetic (a defect in the float32 branch of an update rule, optimizer state held in a
low precision) and not the gradient's rounding, which the gradient check judges. The formulas are
dualtrain.core.update_rules (torch.optim's single-tensor paths: sgd, adam, adamw, adamax, adadelta,
rmsprop; the same functions the TF backend computes with, docs/parity.md §4) on its float64 NumPy
namespace; tests/backends/torch/test_optim_ref.py compares this step with torch.optim in float64.
"""

from __future__ import annotations

import numpy as np

from dualtrain.core import update_rules
from dualtrain.core.ops import NUMPY
from dualtrain.core.weights import Weights
from dualtrain.spec import OptimizerSpec


def clip_coefficient(grads: Weights, max_norm: float | None) -> tuple[float, float]:
    """(global L2 norm, torch's clip_grad_norm_ coefficient min(1, max / (norm + 1e-6)))."""
    norm = update_rules.global_norm(NUMPY, [np.asarray(g, np.float64) for g in grads.values()])
    if max_norm is None:
        return float(norm), 1.0
    return float(norm), float(update_rules.clip_coefficient(NUMPY, norm, max_norm))


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
        state = {key: slots.get(f"{key}/{name}") for key in update_rules.slot_names(opt)}
        # A slot torch.optim has not created yet starts from zeros; a missing sgd momentum buffer
        # starts as a copy of the gradient, as at the first applied update.
        no_buf = "momentum_buffer" in state and state["momentum_buffer"] is None
        current = {
            key: np.zeros_like(p) if v is None else np.asarray(v, np.float64)
            for key, v in state.items()
        }
        out[name], _ = update_rules.update(
            NUMPY, opt, p, g, current, lr=lr, applied=0 if no_buf else applied
        )
    return out

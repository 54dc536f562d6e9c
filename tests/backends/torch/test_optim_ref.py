"""dualtrain.core.optim_ref (the exact update the one-step probes judge against) is torch.optim, in
float64.

torch.optim stays the reference: every optimizer and option the spec offers, from no state (the
first applied update) and from a state three updates in, with and without clipping."""

from __future__ import annotations

import numpy as np
import pytest

from dualtrain.core import optim_ref
from dualtrain.spec import SLOT_ORDER, OptimizerName, OptimizerSpec

torch = pytest.importorskip("torch")

CASES = [
    dict(name=OptimizerName.SGD),
    dict(name=OptimizerName.SGD, momentum=0.9),
    dict(name=OptimizerName.SGD, momentum=0.9, nesterov=True, weight_decay=0.01),
    dict(name=OptimizerName.SGD, momentum=0.5, clip_grad_norm=0.1),
    dict(name=OptimizerName.ADAM),
    dict(name=OptimizerName.ADAM, weight_decay=0.01, betas=(0.8, 0.99), eps=1e-6),
    dict(name=OptimizerName.ADAMW, weight_decay=0.05),
    dict(name=OptimizerName.ADAMAX, weight_decay=0.01),
    dict(name=OptimizerName.ADADELTA, weight_decay=0.01),
    dict(name=OptimizerName.RMSPROP),
    dict(name=OptimizerName.RMSPROP, momentum=0.9, centered=True, weight_decay=0.01),
]


def _torch_opt(spec: OptimizerSpec, params):
    """The torch backend's own optimizer for ``spec`` (make_optimizer reads only spec.optimizer)."""
    from types import SimpleNamespace

    from dualtrain.backends.torch.optimizer import make_optimizer

    return make_optimizer(SimpleNamespace(optimizer=spec), params)


SLOT_KEYS = SLOT_ORDER  # every slot any optimizer keeps (dualtrain.spec.optimizers)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("warm", [0, 3])
def test_optim_ref_is_torch_optim(case, warm):
    spec = OptimizerSpec(lr=0.05 if case["name"] is not OptimizerName.ADADELTA else 1.0, **case)
    rng = np.random.default_rng(0)
    shapes = {"0.weight": (5, 4), "0.bias": (5,)}
    params = {
        k: torch.tensor(rng.normal(size=s), dtype=torch.float64, requires_grad=True)
        for k, s in shapes.items()
    }
    opt = _torch_opt(spec, list(params.values()))

    def set_grads():
        grads = {k: rng.normal(size=s) * 0.3 for k, s in shapes.items()}
        for k, p in params.items():
            p.grad = torch.tensor(grads[k], dtype=torch.float64)
        return grads

    for _ in range(warm):  # build some optimizer state
        set_grads()
        opt.step()
    weights = {k: p.detach().numpy().copy() for k, p in params.items()}
    slots = {
        f"{key}/{k}": v.detach().numpy().copy()
        for k, p in params.items()
        for key, v in opt.state.get(p, {}).items()
        if key in SLOT_KEYS
    }
    grads = set_grads()
    if spec.clip_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(list(params.values()), spec.clip_grad_norm)
    opt.step()
    ours = optim_ref.step(spec, spec.lr, weights, slots, warm, grads)
    for k, p in params.items():
        np.testing.assert_allclose(ours[k], p.detach().numpy(), rtol=1e-13, atol=1e-15, err_msg=k)

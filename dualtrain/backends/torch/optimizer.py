"""torch.optim and GradScaler for a spec, and their state in canonical names and layouts for
checkpoints (``exp_avg/0.weight``; the applied-update count; the loss scale and growth tracker).
torch.optim is the reference the core's update rules are held to (dualtrain.core.update_rules)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch.optim.optimizer import _get_scalar_dtype

from dualtrain.errors import UserError
from dualtrain.runtime.checkpoint import OptimizerState
from dualtrain.spec import OPTIMIZERS, Experiment


def make_optimizer(spec: Experiment, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The torch.optim class dualtrain.spec.optimizers declares, with the options it declares."""
    o = spec.optimizer
    declared = OPTIMIZERS[o.name]
    cls = getattr(torch.optim, declared.torch_class)
    options = {k: getattr(o, k) for k in declared.options}
    if "betas" in options:  # two numbers (OptimizerSpec checks)
        options["betas"] = tuple(options["betas"])
    optimizer: torch.optim.Optimizer = cls(params, lr=o.lr, **options)
    return optimizer


def optimizer_state(
    opt: torch.optim.Optimizer,
    names: Sequence[str],
    params: Sequence[torch.nn.Parameter],
    applied: int,
    scaler: torch.amp.GradScaler | None,
) -> OptimizerState:
    """torch.optim's per-parameter state under canonical names ("exp_avg/0.weight"); its ``step``
    is the applied count; GradScaler's scale and growth tracker."""
    slots = {
        f"{key}/{name}": value.detach().to("cpu").numpy().copy()
        for name, p in zip(names, params, strict=True)
        for key, value in opt.state.get(p, {}).items()
        if key != "step" and torch.is_tensor(value)
    }
    scale, good = 1.0, 0
    if scaler is not None:
        sd = scaler.state_dict()
        scale, good = float(sd["scale"]), int(sd["_growth_tracker"])
    return OptimizerState(slots=slots, applied=applied, loss_scale=scale, good_steps=good)


def load_optimizer_state(
    opt: torch.optim.Optimizer,
    names: Sequence[str],
    params: Sequence[torch.nn.Parameter],
    scaler: torch.amp.GradScaler | None,
    state: OptimizerState,
    *,
    counted: bool,
    device: torch.device,
    dtype: torch.dtype,
) -> None:
    """Put ``state`` into ``opt`` and ``scaler``. ``counted``: the optimizer keeps a ``step``
    (every torch.optim rule but SGD's)."""
    opt.state.clear()  # slots the state does not name start from nothing
    by_param: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state.slots.items():
        slot, _, name = key.partition("/")
        by_param.setdefault(name, {})[slot] = torch.from_numpy(np.ascontiguousarray(value)).to(
            device, dtype
        )
    unknown = sorted(set(by_param) - set(names))
    if unknown:
        raise UserError(
            f"the checkpoint's optimizer state names parameters this model does not "
            f"have. Received: {', '.join(unknown)}"
        )
    for name, p in zip(names, params, strict=True):
        slots = by_param.get(name, {})
        if counted and state.applied:
            slots["step"] = torch.tensor(float(state.applied), dtype=_get_scalar_dtype())
        if slots:
            opt.state[p] = slots
    if scaler is not None:
        sd = scaler.state_dict()
        scaler.load_state_dict(
            {**sd, "scale": state.loss_scale, "_growth_tracker": state.good_steps}
        )

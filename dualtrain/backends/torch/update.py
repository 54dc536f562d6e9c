"""The update on the torch backend once the gradients are summed: GradScaler's unscale and skip,
the global norm and clipping, torch.optim's update, the loss scale's next value. The same code for
an all-reduce step (on every replica) and a parameter server's (on the server, from the replicas'
summed gradient; a replica sends its gradient there and takes the server's parameters back:
dualtrain.backends.torch.ps). A part of :class:`~dualtrain.backends.torch.engine.TorchEngine`."""

from __future__ import annotations

from typing import cast

import torch

from dualtrain.backends.torch import ps
from dualtrain.backends.torch.ops import NORM_OPS
from dualtrain.backends.torch.state import TorchState
from dualtrain.core import update_rules
from dualtrain.core.weights import Weights


class GradientUpdate:
    """The update once the gradients are summed, on a replica or on the parameter server."""

    def __init__(self, state: TorchState):
        self.state = state

    def update(
        self, capture_grads: bool
    ) -> tuple[float, float | None, Weights | None, float, bool]:
        """The step after the gradients are summed: GradScaler's unscale and skip, the global norm,
        clipping, torch.optim's update, the loss scale's next value. The same code for an
        all-reduce step (on every replica) and a parameter server's (on the server). Returns (grad
        norm, grad amax (fp16), the gradient by name if asked, the scale used, skipped)."""
        scaler = self.state.scaler
        for p in self.state.params:  # a parameter the forward does not use (a pair's unused
            if p.grad is None:  # pooler): its gradient is 0, as Keras's (UnconnectedGradients.ZERO)
                p.grad = torch.zeros_like(p)
        if scaler is not None:
            self.unscale()
        # every parameter has a gradient now (DDP: every parameter takes part)
        grads = cast(list[torch.Tensor], [p.grad for p in self.state.params])
        norm = update_rules.global_norm(NORM_OPS, grads)
        amax = (
            torch.stack(torch._foreach_norm(grads, float("inf"))).max().item()
            if scaler is not None
            else None
        )
        captured = None
        if capture_grads:
            captured = {
                n: g.detach().to("cpu").numpy().copy()
                for n, g in zip(self.state.names, grads, strict=True)
            }
        if self.state.clip is not None:
            torch.nn.utils.clip_grads_with_norm_(self.state.params, self.state.clip, norm)
        if scaler is not None:
            scale = scaler.get_scale()
            scaler.step(self.state.opt)
            scaler.update()
            skipped = scaler.get_scale() < scale  # backoff < 1 happens only on a found inf
        else:
            self.state.opt.step()
            scale, skipped = 1.0, False
        self.state.applied += not skipped
        self.state.opt.zero_grad(set_to_none=True)
        return norm.item(), amax, captured, scale, skipped

    def through_server(
        self, lr: float, poison: bool, capture_grads: bool
    ) -> tuple[float, float | None, Weights | None, float, bool]:
        """A replica of a parameter-server run: its gradient (flattened) to the server, the
        server's parameters and outcome back (dualtrain.backends.torch.ps)."""
        flat = torch.cat(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to("cpu")
                for p in self.state.params
            ]
        )
        if poison:  # fault injection: this replica's gradient only, as in the all-reduce hook
            flat.fill_(float("inf"))
        out = ps.step(self.state.rank, flat, lr, capture_grads)
        with torch.no_grad():
            offset = 0
            for p in self.state.params:
                p.copy_(out.params[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        self.state.opt.zero_grad(set_to_none=True)
        if self.state.scaler is not None:
            self.state.scaler.update(out.next_scale)
        self.state.applied += not out.skipped
        return out.grad_norm, out.grad_amax, out.grads, out.loss_scale, out.skipped

    @torch.no_grad()
    def server_update(self, total: torch.Tensor, lr: float, capture_grads: bool) -> ps.Outcome:
        """The parameter server's update from the replicas' summed gradient (flattened)."""
        offset = 0
        for p in self.state.params:
            p.grad = total[offset : offset + p.numel()].view_as(p).to(p.device).clone()
            offset += p.numel()
        for group in self.state.opt.param_groups:
            group["lr"] = lr
        norm, amax, captured, scale, skipped = self.update(capture_grads)
        return ps.Outcome(
            params=torch.cat([p.detach().reshape(-1).to("cpu") for p in self.state.params]),
            grad_norm=norm,
            grad_amax=amax,
            loss_scale=scale,
            next_scale=self.state.scaler.get_scale() if self.state.scaler is not None else 1.0,
            skipped=skipped,
            grads=captured,
        )

    def unscale(self) -> None:
        """fp16: the all-reduced gradients divided by the loss scale (GradScaler.unscale_, which
        also records whether any is not finite)."""
        assert self.state.scaler is not None  # fp16 only, which has a scaler
        self.state.scaler.unscale_(self.state.opt)

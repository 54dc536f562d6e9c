"""dualtrain's own layers in torch: BatchNorm (dualtrain.core.batchnorm on torch tensors, sync over
a process group), HashDropout (dualtrain.core.dropout's masks), GlobalAvgPool and Residual. The
model builder (model.py) places them. PairDropout: a model pair's dropout modules in training
(dualtrain.core.pair.dropout; pair.py places it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dualtrain.core import batchnorm, dropout
from dualtrain.core.dropout import IntOps, canonical_elements
from dualtrain.core.pair import dropout as pair_dropout


class GlobalAvgPool(nn.Module):
    """(N, C, H, W) -> (N, C): the mean over H and W (Keras's GlobalAveragePooling2D)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


INT_OPS = IntOps(xor=torch.bitwise_xor, shr=torch.bitwise_right_shift, and_=torch.bitwise_and)


class HashDropout(nn.Module):
    """Inverted dropout whose mask is dualtrain.core.dropout.keep (a hash of seed, step, sample id,
    layer and element, bit-identical to the TF backend's). The engine sets ``step`` and ``ids`` (the
    ids this replica feeds) before each training forward; in eval mode it is the identity."""

    def __init__(self, rate: float, layer: int, in_shape: tuple[int, ...], seed: int):
        super().__init__()
        self.rate, self.layer, self.in_shape, self.seed = rate, layer, tuple(in_shape), seed
        self.register_buffer(
            "elements", torch.from_numpy(canonical_elements(in_shape)), persistent=False
        )
        self.step: torch.Tensor | None = None
        self.ids: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.rate == 0.0:
            return x
        if self.step is None or self.ids is None:
            raise RuntimeError("HashDropout needs step and ids before a training forward")
        keep = dropout.keep(
            INT_OPS, self.seed, self.step, self.ids, self.layer, self.elements, self.rate
        )
        keep = keep.reshape(x.shape)  # canonical (C, H, W) order is torch's own layout
        return torch.where(
            keep, x * (1.0 / (1.0 - self.rate)), torch.zeros((), dtype=x.dtype, device=x.device)
        )


class PairDropout(nn.Module):
    """A model pair's dropout module in training, in place of the user's ``nn.Dropout`` (or
    ``Dropout1d/2d/3d``: whole channels) with its rate: inside a training forward the engine opens
    (dualtrain.core.pair.dropout.training_forward) the pair's hash mask of its call, bit-identical
    to the Keras side's; the identity otherwise (evaluation, the locator)."""

    def __init__(self, path: str, p: float, kind: str, cls: str):
        super().__init__()
        self.path, self.p, self.kind, self.cls = path, p, kind, cls

    def extra_repr(self) -> str:
        return f"{self.cls}(p={self.p}) at {self.path!r}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = pair_dropout.mask_for("torch", self.path, self.p) if self.training else None
        if mask is None:
            return x
        e = mask.entry
        elements = torch.arange(e.elements, dtype=torch.int64, device=x.device)
        keep = dropout.keep(INT_OPS, mask.seed, mask.step, mask.ids, mask.layer, elements, e.rate)
        # canonical order is torch's own layout; a channel's mask covers its whole feature map
        keep = keep.reshape(
            (x.shape[0], -1, *(1,) * (x.dim() - 2)) if e.kind == pair_dropout.CHANNEL else x.shape
        )
        return torch.where(
            keep, x * (1.0 / (1.0 - e.rate)), torch.zeros((), dtype=x.dtype, device=x.device)
        )


class _AllReduceSum(torch.autograd.Function):
    """SUM all-reduce whose gradient is the SUM all-reduce of the gradient (every replica's loss
    depends on every replica's inputs through synchronised BatchNorm statistics)."""

    @staticmethod
    def forward(ctx: Any, group: Any, t: torch.Tensor) -> torch.Tensor:  # noqa: D102
        ctx.group = group
        t = t.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(t, group=group)
        return t

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:  # noqa: D102
        return None, _AllReduceSum.apply(ctx.group, grad)


class BatchNorm(nn.Module):
    """dualtrain.core.batchnorm on torch tensors: torch BatchNorm1d/2d semantics, optionally
    synchronised over ``group`` (set by the engine for sync: true at world > 1; None: this replica's
    batch only). State dict: weight, bias, running_mean, running_var (nn.BatchNorm's names, without
    num_batches_tracked, which only momentum=None would use)."""

    running_mean: torch.Tensor  # buffers (register_buffer): declared for the type checker
    running_var: torch.Tensor

    def __init__(self, channels: int, momentum: float, eps: float, sync: bool):
        super().__init__()
        self.momentum, self.eps, self.sync = momentum, eps, sync
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))
        self.group: dist.ProcessGroup | None = None

    def _ops(self, x: torch.Tensor) -> batchnorm.Ops:
        dims, view = ((0, 2, 3), (1, -1, 1, 1)) if x.dim() == 4 else ((0,), (1, -1))
        group = self.group

        # one collective for the list
        def all_reduce(ts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
            flat = _AllReduceSum.apply(group, torch.cat([t.reshape(-1) for t in ts]))
            return [
                f.reshape(t.shape)
                for f, t in zip(flat.split([t.numel() for t in ts]), ts, strict=True)
            ]

        return batchnorm.Ops(
            channel_sum=lambda t: t.sum(dim=dims),
            count=lambda t: t.new_full(
                (), float(t.numel() // t.shape[1])
            ),  # no host-to-device copy
            expand=lambda v: v.view(view),
            all_reduce=all_reduce,
            sqrt=torch.sqrt,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        x = x.to(self.weight.dtype)  # the stats dtype, also under fp16/bf16 autocast
        ops = self._ops(x)
        if self.training:
            mean, var, unbiased = batchnorm.batch_stats(
                ops, x, self.sync and self.group is not None
            )
            with torch.no_grad():
                self.running_mean.copy_(
                    batchnorm.update_running(self.running_mean, mean, self.momentum)
                )
                self.running_var.copy_(
                    batchnorm.update_running(self.running_var, unbiased, self.momentum)
                )
        else:
            mean, var = self.running_mean, self.running_var
        return batchnorm.normalize(ops, x, mean, var, self.weight, self.bias, self.eps).to(in_dtype)


class Residual(nn.Module):
    """``body(x) + shortcut(x)``; an empty shortcut is the identity."""

    def __init__(self, body: list[nn.Module], shortcut: list[nn.Module]):
        super().__init__()
        self.body = nn.Sequential(*body)
        self.shortcut = nn.Sequential(*shortcut)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + self.shortcut(x)


class Concat(nn.Module):
    """The concat layer's place in the trunk: it holds nothing (the branches are the model's)."""

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return torch.cat(xs, dim=1)


class MultiInput(nn.Module):
    """A model with several inputs: one ``nn.Sequential`` branch per input, registered under the
    input's name, then the trunk's layers under their indices (``"0"`` is the concat), so the state
    dict's names are the canonical ones (``image.0.weight``, ``1.weight``). ``forward`` takes the
    inputs in model.inputs order."""

    def __init__(self, branches: dict[str, list[nn.Module]], trunk: list[nn.Module]):
        super().__init__()
        self.names = list(branches)
        for name, layers in branches.items():
            self.add_module(name, nn.Sequential(*layers))
        for i, m in enumerate(trunk):
            self.add_module(str(i), m)
        self.trunk = len(trunk)

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        mods = dict(self.named_children())
        h = mods["0"](*(mods[n](x) for n, x in zip(self.names, xs, strict=True)))
        for i in range(1, self.trunk):
            h = mods[str(i)](h)
        return h

"""Build the torch model from the framework-free layer list; canonical weights in and out.

The canonical layout (dualtrain.core.model) *is* this ``nn.Sequential``'s state dict, so loading and
exporting are plain copies: module ``i`` is layer ``i`` of ``dualtrain.core.model.resolve``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from dualtrain.core import batchnorm, dropout
from dualtrain.core.dropout import IntOps, canonical_elements
from dualtrain.core.model import ResolvedLayer, param_shapes, resolve
from dualtrain.core.weights import Weights
from dualtrain.spec import LayerType, ModelSpec, Padding


class GlobalAvgPool(nn.Module):
    """(N, C, H, W) -> (N, C): the mean over H and W (Keras's GlobalAveragePooling2D)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


_OPS = IntOps(xor=torch.bitwise_xor, shr=torch.bitwise_right_shift, and_=torch.bitwise_and)


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
            _OPS, self.seed, self.step, self.ids, self.layer, self.elements, self.rate
        )
        keep = keep.reshape(x.shape)  # canonical (C, H, W) order is torch's own layout
        return torch.where(
            keep, x * (1.0 / (1.0 - self.rate)), torch.zeros((), dtype=x.dtype, device=x.device)
        )


class _AllReduceSum(torch.autograd.Function):
    """SUM all-reduce whose gradient is the SUM all-reduce of the gradient (every replica's loss
    depends on every replica's inputs through synchronised BatchNorm statistics)."""

    @staticmethod
    def forward(ctx, group, t):  # noqa: D102
        ctx.group = group
        t = t.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(t, group=group)
        return t

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
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

        def all_reduce(ts):  # one collective for the list
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


@dataclass(frozen=True)
class TorchLayer:
    """One layer type in torch, in one place: the module dualtrain trains (``train``) and the same
    layer as plain torch source for the exported inference model (``source``: torch's own Dropout
    and BatchNorm there, backends/torch/export.py). A new layer type adds one entry here."""

    # Any: a resolved layer whose per-type fields (units, filters, ...) its type guarantees set
    train: Callable[[Any, int], nn.Module]
    source: Callable[[Any, str], str]


def _padding(s: Any) -> int | str:
    return "same" if s.padding is Padding.SAME else (s.padding if isinstance(s.padding, int) else 0)


def _conv(r: Any, seed: int) -> nn.Module:
    s = r.spec
    return nn.Conv2d(
        r.in_shape[0],
        s.filters,
        s.kernel_size,
        stride=s.stride or 1,
        padding=_padding(s),
        bias=s.bias,
    )


def _conv_source(r: Any, indent: str) -> str:
    s = r.spec
    return (
        f"nn.Conv2d({r.in_shape[0]}, {s.filters}, {s.kernel_size}, stride={s.stride or 1}, "
        f"padding={_padding(s)!r}, bias={s.bias})"
    ).replace("'", '"')


def _batchnorm_source(r: ResolvedLayer, indent: str) -> str:
    kind = "1d" if len(r.in_shape) == 1 else "2d"
    return f"nn.BatchNorm{kind}({r.in_shape[0]}, eps={r.spec.eps}, momentum={r.spec.momentum})"


def _residual_source(r: ResolvedLayer, indent: str) -> str:
    inner = indent + "    "

    def block(layers: tuple[ResolvedLayer, ...]) -> str:
        return "".join(f"\n{inner}    {layer_source(x, inner + '    ')}," for x in layers)

    return (
        f"Residual(\n{inner}[{block(r.body)}\n{inner}],\n{inner}[{block(r.shortcut)}\n{inner}],"
        f"\n{indent})"
    )


def _activation(module: type[nn.Module]) -> TorchLayer:
    return TorchLayer(lambda r, seed: module(), lambda r, indent: f"nn.{module.__name__}()")


#: gelu is the exact erf form (nn.GELU's default, approximate="none"), as Keras's gelu by default.
LAYERS: dict[LayerType, TorchLayer] = {
    LayerType.FLATTEN: TorchLayer(lambda r, seed: nn.Flatten(), lambda r, indent: "nn.Flatten()"),
    LayerType.DENSE: TorchLayer(
        lambda r, seed: nn.Linear(r.in_shape[0], r.spec.units, bias=r.spec.bias),
        lambda r, indent: f"nn.Linear({r.in_shape[0]}, {r.spec.units}, bias={r.spec.bias})",
    ),
    LayerType.CONV2D: TorchLayer(_conv, _conv_source),
    LayerType.MAXPOOL2D: TorchLayer(
        lambda r, seed: nn.MaxPool2d(r.spec.pool_size, stride=r.spec.stride or r.spec.pool_size),
        lambda r, indent: (
            f"nn.MaxPool2d({r.spec.pool_size}, stride={r.spec.stride or r.spec.pool_size})"
        ),
    ),
    LayerType.AVGPOOL2D: TorchLayer(
        lambda r, seed: nn.AvgPool2d(r.spec.pool_size, stride=r.spec.stride or r.spec.pool_size),
        lambda r, indent: (
            f"nn.AvgPool2d({r.spec.pool_size}, stride={r.spec.stride or r.spec.pool_size})"
        ),
    ),
    LayerType.GLOBAL_AVGPOOL: TorchLayer(
        lambda r, seed: GlobalAvgPool(), lambda r, indent: "GlobalAvgPool()"
    ),
    LayerType.RELU: _activation(nn.ReLU),
    LayerType.TANH: _activation(nn.Tanh),
    LayerType.SIGMOID: _activation(nn.Sigmoid),
    LayerType.GELU: _activation(nn.GELU),
    LayerType.DROPOUT: TorchLayer(
        lambda r, seed: HashDropout(r.spec.rate, r.uid, r.in_shape, seed),
        lambda r, indent: f"nn.Dropout({r.spec.rate})",
    ),
    LayerType.BATCHNORM: TorchLayer(
        lambda r, seed: BatchNorm(r.in_shape[0], r.spec.momentum, r.spec.eps, r.spec.sync),
        _batchnorm_source,
    ),
    LayerType.RESIDUAL: TorchLayer(
        lambda r, seed: Residual(_build(r.body, seed), _build(r.shortcut, seed)), _residual_source
    ),
}


def _build(layers: list[ResolvedLayer] | tuple[ResolvedLayer, ...], seed: int) -> list[nn.Module]:
    return [LAYERS[r.spec.type].train(r, seed) for r in layers]


def layer_source(r: ResolvedLayer, indent: str) -> str:
    """Layer ``r`` of the exported model, as torch source."""
    return LAYERS[r.spec.type].source(r, indent)


def build_model(spec: ModelSpec, seed: int = 0) -> nn.Sequential:
    model = nn.Sequential(*_build(resolve(spec), seed))
    expected = param_shapes(spec)
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if got != expected:  # programming error: the builder and dualtrain.core.model disagree
        raise RuntimeError(f"torch model layout {got} != canonical layout {expected}")
    return model


def load_canonical(model: nn.Module, weights: Weights) -> None:
    """Copy canonical arrays into ``model`` (strict: names and shapes must match), converted to the
    model's parameter dtype (float32, or float64 for an fp64 model)."""
    dtype = next(model.parameters()).dtype
    state = {k: torch.from_numpy(np.ascontiguousarray(v)).to(dtype) for k, v in weights.items()}
    model.load_state_dict(state, strict=True)


def export_canonical(model: nn.Module) -> Weights:
    """The state dict as NumPy arrays in the parameters' own dtype (float32; float64 for fp64)."""
    return {k: v.detach().to("cpu").numpy().copy() for k, v in model.state_dict().items()}

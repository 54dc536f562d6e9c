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
from torch import nn

from dualtrain.backends.torch.layers import (
    BatchNorm,
    Concat,
    GlobalAvgPool,
    HashDropout,
    MultiInput,
    Residual,
)
from dualtrain.backends.torch.tokens import (
    Embedding,
    Patches,
    Position,
    SelfAttention,
    TokenPool,
)
from dualtrain.core.model import ResolvedLayer, param_shapes, resolve
from dualtrain.core.weights import Weights
from dualtrain.spec import LayerType, ModelSpec, Padding
from dualtrain.spec import TokenPool as Pool


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
        lambda r, seed: nn.Linear(r.in_shape[-1], r.spec.units, bias=r.spec.bias),
        lambda r, indent: f"nn.Linear({r.in_shape[-1]}, {r.spec.units}, bias={r.spec.bias})",
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
    LayerType.SILU: _activation(nn.SiLU),
    LayerType.GELU: TorchLayer(
        lambda r, seed: nn.GELU(approximate=r.spec.approximate.value),
        lambda r, indent: f'nn.GELU(approximate="{r.spec.approximate.value}")',
    ),
    LayerType.DROPOUT: TorchLayer(
        lambda r, seed: HashDropout(r.spec.rate, r.uid, r.in_shape, seed),
        lambda r, indent: f"nn.Dropout({r.spec.rate})",
    ),
    LayerType.BATCHNORM: TorchLayer(
        lambda r, seed: BatchNorm(r.in_shape[0], r.spec.momentum, r.spec.eps, r.spec.sync),
        _batchnorm_source,
    ),
    LayerType.LAYERNORM: TorchLayer(
        lambda r, seed: nn.LayerNorm(r.in_shape[-1], eps=r.spec.eps),
        lambda r, indent: f"nn.LayerNorm({r.in_shape[-1]}, eps={r.spec.eps})",
    ),
    LayerType.PATCHES: TorchLayer(
        lambda r, seed: Patches(r.in_shape[0], r.spec.dim, r.spec.size, r.spec.bias),
        lambda r, indent: f"Patches({r.in_shape[0]}, {r.spec.dim}, {r.spec.size}, {r.spec.bias})",
    ),
    LayerType.POSITION: TorchLayer(
        lambda r, seed: Position(*r.in_shape), lambda r, indent: f"Position{r.in_shape}"
    ),
    LayerType.ATTENTION: TorchLayer(
        lambda r, seed: SelfAttention(r.in_shape[1], r.spec.heads, r.spec.causal, r.spec.bias),
        lambda r, indent: (
            f"SelfAttentionExport({r.in_shape[1]}, {r.spec.heads}, causal={r.spec.causal}, "
            f"bias={r.spec.bias})"
        ),
    ),
    LayerType.TOKEN_POOL: TorchLayer(
        lambda r, seed: TokenPool(r.spec.pool is Pool.FIRST),
        lambda r, indent: f"TokenPool({r.spec.pool is Pool.FIRST})",
    ),
    LayerType.EMBEDDING: TorchLayer(
        lambda r, seed: Embedding(r.spec.vocab, r.spec.dim),
        lambda r, indent: f"Embedding({r.spec.vocab}, {r.spec.dim})",
    ),
    LayerType.RESIDUAL: TorchLayer(
        lambda r, seed: Residual(_build(r.body, seed), _build(r.shortcut, seed)), _residual_source
    ),
    LayerType.CONCAT: TorchLayer(lambda r, seed: Concat(), lambda r, indent: "Concat()"),
}


def _build(layers: list[ResolvedLayer] | tuple[ResolvedLayer, ...], seed: int) -> list[nn.Module]:
    return [LAYERS[r.spec.type].train(r, seed) for r in layers]


def layer_source(r: ResolvedLayer, indent: str) -> str:
    """Layer ``r`` of the exported model, as torch source."""
    return LAYERS[r.spec.type].source(r, indent)


def build_model(spec: ModelSpec, seed: int = 0) -> nn.Module:
    """``nn.Sequential`` of the layers (one input), or :class:`MultiInput` (several): either way
    ``model(*inputs)`` and a state dict in the canonical layout."""
    layers = resolve(spec)
    model: nn.Module
    if len(spec.inputs) == 1:
        model = nn.Sequential(*_build(layers, seed))
    else:
        branches = {
            i.name: _build(b, seed) for i, b in zip(spec.inputs, layers[0].branches, strict=True)
        }
        model = MultiInput(branches, _build(layers, seed))
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

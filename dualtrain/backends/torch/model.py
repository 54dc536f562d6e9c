"""Build the torch model from the framework-free layer list; canonical weights in and out.

The canonical layout (dualtrain.model) *is* this ``nn.Sequential``'s state dict, so loading and
exporting are plain copies: module ``i`` is layer ``i`` of ``dualtrain.model.resolve``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from dualtrain import dropout
from dualtrain.dropout import IntOps, canonical_elements
from dualtrain.model import resolve
from dualtrain.spec import LayerType, ModelSpec, Padding
from dualtrain.weights import Weights


class GlobalAvgPool(nn.Module):
    """(N, C, H, W) -> (N, C): the mean over H and W (Keras's GlobalAveragePooling2D)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


#: gelu is the exact erf form (nn.GELU's default, approximate="none"), as Keras's gelu by default.
ACTIVATIONS = {LayerType.RELU: nn.ReLU, LayerType.TANH: nn.Tanh, LayerType.SIGMOID: nn.Sigmoid,
               LayerType.GELU: nn.GELU}


_OPS = IntOps(xor=torch.bitwise_xor, shr=torch.bitwise_right_shift, and_=torch.bitwise_and)


class HashDropout(nn.Module):
    """Inverted dropout whose mask is dualtrain.dropout.keep (a hash of seed, step, sample id, layer
    and element, bit-identical to the TF backend's). The engine sets ``step`` and ``ids`` (the ids this
    replica feeds) before each training forward; in eval mode it is the identity."""

    def __init__(self, rate: float, layer: int, in_shape: tuple[int, ...], seed: int):
        super().__init__()
        self.rate, self.layer, self.in_shape, self.seed = rate, layer, tuple(in_shape), seed
        self.register_buffer("elements", torch.from_numpy(canonical_elements(in_shape)), persistent=False)
        self.step: torch.Tensor | None = None
        self.ids: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.rate == 0.0:
            return x
        if self.step is None or self.ids is None:
            raise RuntimeError("HashDropout needs step and ids before a training forward")
        keep = dropout.keep(_OPS, self.seed, self.step, self.ids, self.layer, self.elements, self.rate)
        keep = keep.reshape(x.shape)  # canonical (C, H, W) order is torch's own layout
        return torch.where(keep, x * (1.0 / (1.0 - self.rate)), torch.zeros((), dtype=x.dtype,
                                                                          device=x.device))


def build_model(spec: ModelSpec, seed: int = 0) -> nn.Sequential:
    layers: list[nn.Module] = []
    for r in resolve(spec):
        t, s = r.spec.type, r.spec
        if t is LayerType.FLATTEN:
            layers.append(nn.Flatten())
        elif t is LayerType.DENSE:
            layers.append(nn.Linear(r.in_shape[0], s.units))
        elif t is LayerType.CONV2D:
            padding = "same" if s.padding is Padding.SAME else (
                s.padding if isinstance(s.padding, int) else 0)
            layers.append(nn.Conv2d(r.in_shape[0], s.filters, s.kernel_size, stride=s.stride or 1,
                                    padding=padding))
        elif t is LayerType.MAXPOOL2D:
            layers.append(nn.MaxPool2d(s.pool_size, stride=s.stride or s.pool_size))
        elif t is LayerType.AVGPOOL2D:
            layers.append(nn.AvgPool2d(s.pool_size, stride=s.stride or s.pool_size))
        elif t is LayerType.GLOBAL_AVGPOOL:
            layers.append(GlobalAvgPool())
        elif t in ACTIVATIONS:
            layers.append(ACTIVATIONS[t]())
        elif t is LayerType.DROPOUT:
            layers.append(HashDropout(s.rate, r.index, r.in_shape, seed))
        else:  # pragma: no cover - the spec enum is closed
            raise ValueError(f"unsupported layer type {t!r}")
    model = nn.Sequential(*layers)
    expected = {name: shape for r in resolve(spec) for name, shape in r.params}
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if got != expected:  # programming error: the builder and dualtrain.model disagree
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

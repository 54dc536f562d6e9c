"""Framework-free model description: layer shapes and parameter names in the canonical layout.

The canonical layout is PyTorch's ``nn.Sequential`` state dict over the resolved layer list:
parameter ``"{i}.weight"`` / ``"{i}.bias"`` for layer ``i``; dense weights are (out, in), conv2d
weights are OIHW, and ``flatten`` after a convolution uses C,H,W order. The TF backend converts to
Keras layouts (kernel transposed, HWIO, H,W,C flatten) when it loads the arrays; see docs/weights.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from dualtrain.errors import UserError
from dualtrain.spec import LayerSpec, LayerType, ModelSpec, Padding

INPUT_SHAPE = (1, 28, 28)  # C, H, W
NUM_CLASSES = 10


@dataclass(frozen=True)
class ResolvedLayer:
    index: int
    spec: LayerSpec
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    params: tuple[tuple[str, tuple[int, ...]], ...]
    """(canonical name, shape) of this layer's parameters, weight first."""
    fan_in: int = 0


def resolve(model: ModelSpec) -> list[ResolvedLayer]:
    """Walk the layer list, check shapes, and name every parameter."""
    shape: tuple[int, ...] = INPUT_SHAPE
    out: list[ResolvedLayer] = []
    for i, layer in enumerate(model.resolved_layers()):
        where = f"model.layers[{i}] ({layer.type.value})"
        params: tuple[tuple[str, tuple[int, ...]], ...] = ()
        fan_in = 0
        t = layer.type
        if t is LayerType.DENSE:
            if len(shape) != 1:
                raise UserError(f"{where} needs a flat input; add a flatten layer before it. "
                                f"Received: input shape {shape}")
            fan_in = shape[0]
            params = ((f"{i}.weight", (layer.units, fan_in)), (f"{i}.bias", (layer.units,)))
            new = (layer.units,)
        elif t is LayerType.CONV2D:
            if len(shape) != 3:
                raise UserError(f"{where} needs a C,H,W input. Received: input shape {shape}")
            c, h, w = shape
            k, s = layer.kernel_size, layer.stride or 1
            if layer.padding is Padding.SAME:
                oh, ow = h, w
            else:
                pad = layer.padding if isinstance(layer.padding, int) else 0
                oh, ow = (h + 2 * pad - k) // s + 1, (w + 2 * pad - k) // s + 1
            if oh < 1 or ow < 1:
                raise UserError(f"{where}: kernel {k} does not fit the input. Received: input shape {shape}")
            fan_in = c * k * k
            params = ((f"{i}.weight", (layer.filters, c, k, k)), (f"{i}.bias", (layer.filters,)))
            new = (layer.filters, oh, ow)
        elif t in (LayerType.MAXPOOL2D, LayerType.AVGPOOL2D):
            if len(shape) != 3:
                raise UserError(f"{where} needs a C,H,W input. Received: input shape {shape}")
            c, h, w = shape
            p, s = layer.pool_size, layer.stride or layer.pool_size
            oh, ow = (h - p) // s + 1, (w - p) // s + 1
            if oh < 1 or ow < 1:
                raise UserError(f"{where}: pool {p} does not fit the input. Received: input shape {shape}")
            new = (c, oh, ow)
        elif t is LayerType.GLOBAL_AVGPOOL:
            if len(shape) != 3:
                raise UserError(f"{where} needs a C,H,W input. Received: input shape {shape}")
            new = (shape[0],)
        elif t is LayerType.FLATTEN:
            n = 1
            for d in shape:
                n *= d
            new = (n,)
        else:  # element-wise activations
            new = shape
        out.append(ResolvedLayer(i, layer, shape, new, params, fan_in))
        shape = new
    if shape != (NUM_CLASSES,):
        raise UserError(f"model: the last layer must output {NUM_CLASSES} logits (a dense layer with "
                        f"units: {NUM_CLASSES}). Received: output shape {shape}")
    if not any(r.params for r in out):
        raise UserError("model: needs at least one dense or conv2d layer. Received: none")
    return out


def param_shapes(model: ModelSpec) -> dict[str, tuple[int, ...]]:
    return {name: shp for layer in resolve(model) for name, shp in layer.params}


def conv_flatten_shape(model: ModelSpec) -> dict[int, tuple[int, int, int]]:
    """For each flatten layer that receives a C,H,W tensor: its input shape (C, H, W).

    The TF backend needs it to reorder the next dense kernel's rows (H,W,C vs C,H,W flatten order).
    """
    return {r.index: r.in_shape for r in resolve(model)
            if r.spec.type is LayerType.FLATTEN and len(r.in_shape) == 3 and r.in_shape[0] > 1}

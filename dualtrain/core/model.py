"""Framework-free model description: layer shapes and parameter names in the canonical layout.

The canonical layout is PyTorch's ``nn.Sequential`` state dict over the resolved layer list:
parameter ``"{i}.weight"`` / ``"{i}.bias"`` for layer ``i``; dense weights are (out, in), conv2d
weights are OIHW, and ``flatten`` after a convolution uses C,H,W order. The TF backend converts to
Keras layouts (kernel transposed, HWIO, H,W,C flatten) when it loads the arrays; see
docs/weights.md.
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
    """Position in its own list (the top-level list, or a residual block's body or shortcut)."""
    spec: LayerSpec
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    params: tuple[tuple[str, tuple[int, ...]], ...]
    """(canonical name, shape) of this layer's trainable parameters, weight first."""
    fan_in: int = 0
    prefix: str = ""
    """Canonical name prefix: ``"3"`` for top-level layer 3, ``"3.body.1"`` / ``"3.shortcut.0"``
    inside residual block 3 (torch's module path)."""
    uid: int = 0
    """A number unique to this layer in the model (dropout masks hash it): the index for a top-level
    layer; ``(block + 1) * 1000 + j`` for body layer j of residual block ``block``, ``+ 500 + j``
    for shortcut layer j."""
    buffers: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """(canonical name, shape) of state that is not trained (batchnorm: running_mean,
    running_var)."""
    body: tuple[ResolvedLayer, ...] = ()
    shortcut: tuple[ResolvedLayer, ...] = ()

    @property
    def arrays(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """Everything this layer (not its block's inner layers) stores in a weights file."""
        return self.params + self.buffers


def resolve(model: ModelSpec) -> list[ResolvedLayer]:
    """Walk the layer list, check shapes, and name every parameter (top-level layers; a residual
    block holds its resolved inner layers, :func:`walk` visits every layer)."""
    out, shape = _resolve_list(model.resolved_layers(), INPUT_SHAPE, "model.layers", "", None)
    if shape != (NUM_CLASSES,):
        raise UserError(
            f"model: the last layer must output {NUM_CLASSES} logits (a dense layer with "
            f"units: {NUM_CLASSES}). Received: output shape {shape}"
        )
    if not any(r.params for r in walk(out)):
        raise UserError("model: needs at least one dense or conv2d layer. Received: none")
    return out


def walk(layers: list[ResolvedLayer] | tuple[ResolvedLayer, ...]):
    """Every resolved layer in canonical order: a residual block, then its body, then its
    shortcut."""
    for r in layers:
        yield r
        yield from walk(r.body)
        yield from walk(r.shortcut)


def _resolve_list(
    specs, shape, where_base: str, prefix_base: str, block: tuple[int, int] | None
) -> tuple[list[ResolvedLayer], tuple[int, ...]]:
    out: list[ResolvedLayer] = []
    for i, layer in enumerate(specs):
        r = _resolve_one(
            i,
            layer,
            shape,
            f"{where_base}[{i}]",
            f"{prefix_base}{i}",
            i if block is None else (block[0] + 1) * 1000 + block[1] + i,
        )
        out.append(r)
        shape = r.out_shape
    return out, shape


def _resolve_one(
    i: int, layer: LayerSpec, shape: tuple[int, ...], where_list: str, prefix: str, uid: int
) -> ResolvedLayer:
    where = f"{where_list} ({layer.type.value})"
    params: tuple[tuple[str, tuple[int, ...]], ...] = ()
    buffers: tuple[tuple[str, tuple[int, ...]], ...] = ()
    body: list[ResolvedLayer] = []
    shortcut: list[ResolvedLayer] = []
    fan_in = 0
    new: tuple[int, ...]
    t = layer.type
    if t is LayerType.DENSE:
        if len(shape) != 1:
            raise UserError(
                f"{where} needs a flat input; add a flatten layer before it. "
                f"Received: input shape {shape}"
            )
        assert layer.units is not None  # LayerSpec requires units on a dense layer
        fan_in = shape[0]
        params = (
            (f"{prefix}.weight", (layer.units, fan_in)),
            *(((f"{prefix}.bias", (layer.units,)),) if layer.bias else ()),
        )
        new = (layer.units,)
    elif t is LayerType.CONV2D:
        if len(shape) != 3:
            raise UserError(f"{where} needs a C,H,W input. Received: input shape {shape}")
        c, h, w = shape
        assert layer.filters is not None and layer.kernel_size is not None  # required (LayerSpec)
        k, s = layer.kernel_size, layer.stride or 1
        if layer.padding is Padding.SAME:
            oh, ow = h, w
        else:
            pad = layer.padding if isinstance(layer.padding, int) else 0
            oh, ow = (h + 2 * pad - k) // s + 1, (w + 2 * pad - k) // s + 1
        if oh < 1 or ow < 1:
            raise UserError(
                f"{where}: kernel {k} does not fit the input. Received: input shape {shape}"
            )
        fan_in = c * k * k
        params = (
            (f"{prefix}.weight", (layer.filters, c, k, k)),
            *(((f"{prefix}.bias", (layer.filters,)),) if layer.bias else ()),
        )
        new = (layer.filters, oh, ow)
    elif t in (LayerType.MAXPOOL2D, LayerType.AVGPOOL2D):
        if len(shape) != 3:
            raise UserError(f"{where} needs a C,H,W input. Received: input shape {shape}")
        c, h, w = shape
        assert layer.pool_size is not None  # LayerSpec requires pool_size on a pooling layer
        p, s = layer.pool_size, layer.stride or layer.pool_size
        oh, ow = (h - p) // s + 1, (w - p) // s + 1
        if oh < 1 or ow < 1:
            raise UserError(
                f"{where}: pool {p} does not fit the input. Received: input shape {shape}"
            )
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
    elif t is LayerType.BATCHNORM:
        if prefix == "0":
            raise UserError(
                f"{where} normalises the output of the layer before it; put it after a "
                f"dense or conv2d layer. Received: batchnorm as the first layer"
            )
        c = shape[0]  # (F,) after dense: F features; (C, H, W) after conv: C channels
        params = ((f"{prefix}.weight", (c,)), (f"{prefix}.bias", (c,)))
        buffers = ((f"{prefix}.running_mean", (c,)), (f"{prefix}.running_var", (c,)))
        new = shape
    elif t is LayerType.RESIDUAL:
        body, out_body = _resolve_list(
            layer.body, shape, f"{where_list}.body", f"{prefix}.body.", (uid, 0)
        )
        shortcut, out_short = _resolve_list(
            layer.shortcut, shape, f"{where_list}.shortcut", f"{prefix}.shortcut.", (uid, 500)
        )
        if out_body != out_short:
            skip = "the shortcut" if layer.shortcut else "the block input (identity shortcut)"
            raise UserError(
                f"{where}: the body outputs {out_body} but {skip} is {out_short}; the add "
                f"needs equal shapes (give a shortcut such as a 1x1 conv2d with the body's "
                f"stride and filters). Received: body {out_body}, shortcut {out_short}"
            )
        new = out_body
    else:  # element-wise activations, dropout
        new = shape
    return ResolvedLayer(
        i, layer, shape, new, params, fan_in, prefix, uid, buffers, tuple(body), tuple(shortcut)
    )


def param_shapes(model: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every array of a weights file: trainable parameters and batchnorm running statistics."""
    return {name: shp for layer in walk(resolve(model)) for name, shp in layer.arrays}


def where(prefix: str) -> str:
    """The spec path of a layer from its canonical prefix: "3.body.1" ->
    "model.layers[3].body[1]"."""
    parts = prefix.split(".")
    return "model.layers" + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in parts)


def batchnorm_layers(model: ModelSpec) -> list[tuple[ResolvedLayer, int]]:
    """Every batchnorm layer with the number of values per channel one sample gives it (H*W after a
    convolution, 1 after a dense layer)."""
    out = []
    for r in walk(resolve(model)):
        if r.spec.type is LayerType.BATCHNORM:
            per_sample = 1
            for d in r.in_shape[1:]:
                per_sample *= d
            out.append((r, per_sample))
    return out


def cancelled_biases(model: ModelSpec) -> list[tuple[ResolvedLayer, ResolvedLayer]]:
    """(dense or conv2d with a bias, the batchnorm right after it) pairs: the batchnorm's mean
    subtraction cancels that bias, so its exact gradient is zero."""
    out = []

    def scan(layers):
        for prev, nxt in zip(layers, layers[1:], strict=False):  # consecutive pairs
            if (
                prev.spec.type in (LayerType.DENSE, LayerType.CONV2D)
                and prev.spec.bias
                and nxt.spec.type is LayerType.BATCHNORM
            ):
                out.append((prev, nxt))
        for r in layers:
            scan(list(r.body))
            scan(list(r.shortcut))

    scan(resolve(model))
    return out


def has_layer(model: ModelSpec, kind: LayerType) -> bool:
    return any(r.spec.type is kind for r in walk(resolve(model)))


def conv_flatten_shape(model: ModelSpec) -> dict[int, tuple[int, int, int]]:
    """For each flatten layer that receives a C,H,W tensor: its input shape (C, H, W).

    The TF backend needs it to reorder the next dense kernel's rows (H,W,C vs C,H,W flatten order).
    """
    return {
        r.index: r.in_shape
        for r in resolve(model)
        if r.spec.type is LayerType.FLATTEN and len(r.in_shape) == 3 and r.in_shape[0] > 1
    }

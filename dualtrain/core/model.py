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

#: uid base of input k's branch layers: (k + 1) * BRANCH_UID + j for layer j
BRANCH_UID = 100_000


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
    branches: tuple[tuple[ResolvedLayer, ...], ...] = ()
    """concat: each model input's resolved branch, in model.inputs order (canonical names
    ``"{input}.{j}.weight"``)."""

    @property
    def arrays(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """Everything this layer (not its block's inner layers) stores in a weights file."""
        return self.params + self.buffers


def resolve(model: ModelSpec) -> list[ResolvedLayer]:
    """Walk the layer list from the model's input shape(s), check shapes, and name every parameter
    (top-level layers; a residual block holds its resolved inner layers and a concat layer the
    inputs' branches: :func:`walk` visits every layer)."""
    layers = model.resolved_layers()
    if len(model.inputs) == 1:
        out, shape = _resolve_list(layers, model.inputs[0].shape, "model.layers", "", None)
    else:
        branches = []
        for k, inp in enumerate(model.inputs):
            where_b = f"model.inputs[{inp.name}].layers"
            branch, b_out = _resolve_list(
                inp.layers, inp.shape, where_b, f"{inp.name}.", None, uid_base=(k + 1) * BRANCH_UID
            )
            if len(b_out) != 1:
                raise UserError(
                    f"{where_b}: a branch must end flat (add a flatten or global_avgpool layer) "
                    f"before the concat. Received: output shape {b_out}"
                )
            branches.append((tuple(branch), b_out[0]))
        width = sum(w for _, w in branches)
        concat = ResolvedLayer(
            0,
            layers[0],
            (width,),
            (width,),
            (),
            prefix="0",
            uid=0,
            branches=tuple(b for b, _ in branches),
        )
        rest, shape = _resolve_list(layers[1:], (width,), "model.layers", "", None, start=1)
        out = [concat, *rest]
    if len(shape) != 1:
        raise UserError(
            f"model: the last layer must output a flat vector (one value per class or target: a "
            f"dense layer). Received: output shape {shape}"
        )
    if not any(r.params for r in walk(out)):
        raise UserError("model: needs at least one dense or conv2d layer. Received: none")
    return out


def output_width(model: ModelSpec) -> int:
    """The model's outputs per sample (logits per class, or one per target column)."""
    return resolve(model)[-1].out_shape[0]


def walk(layers: list[ResolvedLayer] | tuple[ResolvedLayer, ...]):
    """Every resolved layer in canonical order: a residual block, then its body, then its
    shortcut."""
    for r in layers:
        yield r
        for b in r.branches:
            yield from walk(b)
        yield from walk(r.body)
        yield from walk(r.shortcut)


def _resolve_list(
    specs,
    shape,
    where_base: str,
    prefix_base: str,
    block: tuple[int, int] | None,
    *,
    start: int = 0,
    uid_base: int = 0,
) -> tuple[list[ResolvedLayer], tuple[int, ...]]:
    out: list[ResolvedLayer] = []
    for j, layer in enumerate(specs):
        i = start + j
        r = _resolve_one(
            i,
            layer,
            shape,
            f"{where_base}[{i}]",
            f"{prefix_base}{i}",
            uid_base + (i if block is None else (block[0] + 1) * 1000 + block[1] + i),
            first=i == 0 and block is None,
        )
        out.append(r)
        shape = r.out_shape
    return out, shape


def _resolve_one(
    i: int,
    layer: LayerSpec,
    shape: tuple[int, ...],
    where_list: str,
    prefix: str,
    uid: int,
    *,
    first: bool = False,
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
        params, fan_in, new = _dense(layer, shape, where, prefix)
    elif t is LayerType.CONV2D:
        params, fan_in, new = _conv2d(layer, shape, where, prefix)
    elif t in (LayerType.MAXPOOL2D, LayerType.AVGPOOL2D):
        new = _pool2d(layer, shape, where)
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
        if first:
            raise UserError(
                f"{where} normalises the output of the layer before it; put it after a "
                f"dense or conv2d layer. Received: batchnorm as the first layer"
            )
        c = shape[0]  # (F,) after dense: F features; (C, H, W) after conv: C channels
        params = ((f"{prefix}.weight", (c,)), (f"{prefix}.bias", (c,)))
        buffers = ((f"{prefix}.running_mean", (c,)), (f"{prefix}.running_var", (c,)))
        new = shape
    elif t is LayerType.LAYERNORM:  # over the features: elementwise weight and bias
        if len(shape) != 1:
            raise UserError(
                f"{where} normalises a vector of features (after a dense layer or a flatten). "
                f"Received: input shape {list(shape)}"
            )
        params = ((f"{prefix}.weight", shape), (f"{prefix}.bias", shape))
        new = shape
    elif t is LayerType.RESIDUAL:
        body, shortcut, new = _residual(layer, shape, where, where_list, prefix, uid)
    elif t is LayerType.CONCAT:  # only model.layers[0] of a model with several inputs
        raise UserError(
            f"{where}: a concat layer merges the branches of several model.inputs and must be "
            f"model.layers[0]. Received: concat here"
        )
    else:  # element-wise activations, dropout
        new = shape
    return ResolvedLayer(
        i, layer, shape, new, params, fan_in, prefix, uid, buffers, tuple(body), tuple(shortcut)
    )


def _dense(
    layer: LayerSpec, shape: tuple[int, ...], where: str, prefix: str
) -> tuple[tuple[tuple[str, tuple[int, ...]], ...], int, tuple[int, ...]]:
    """A dense layer's (parameters, fan_in, output shape)."""
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
    return params, fan_in, new


def _conv2d(
    layer: LayerSpec, shape: tuple[int, ...], where: str, prefix: str
) -> tuple[tuple[tuple[str, tuple[int, ...]], ...], int, tuple[int, ...]]:
    """A conv2d layer's (parameters, fan_in, output shape)."""
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
    return params, fan_in, new


def _pool2d(layer: LayerSpec, shape: tuple[int, ...], where: str) -> tuple[int, ...]:
    """A maxpool2d or avgpool2d layer's output shape."""
    if len(shape) != 3:
        raise UserError(f"{where} needs a C,H,W input. Received: input shape {shape}")
    c, h, w = shape
    assert layer.pool_size is not None  # LayerSpec requires pool_size on a pooling layer
    p, s = layer.pool_size, layer.stride or layer.pool_size
    oh, ow = (h - p) // s + 1, (w - p) // s + 1
    if oh < 1 or ow < 1:
        raise UserError(f"{where}: pool {p} does not fit the input. Received: input shape {shape}")
    new = (c, oh, ow)
    return new


def _residual(
    layer: LayerSpec, shape: tuple[int, ...], where: str, where_list: str, prefix: str, uid: int
) -> tuple[list[ResolvedLayer], list[ResolvedLayer], tuple[int, ...]]:
    """A residual block's resolved (body, shortcut) and its output shape."""
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
    return body, shortcut, new


def param_shapes(model: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Every array of a weights file: trainable parameters and batchnorm running statistics."""
    return {name: shp for layer in walk(resolve(model)) for name, shp in layer.arrays}


def where(prefix: str) -> str:
    """The spec path of a layer from its canonical prefix: "3.body.1" ->
    "model.layers[3].body[1]"."""
    parts = prefix.split(".")
    head = "model.layers"
    if not parts[0].isdigit():  # a branch: "image.1" -> model.inputs[image].layers[1]
        head, parts = f"model.inputs[{parts[0]}].layers", parts[1:]
    return head + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in parts)


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
            for b in r.branches:
                scan(list(b))
            scan(list(r.body))
            scan(list(r.shortcut))

    scan(resolve(model))
    return out


def has_layer(model: ModelSpec, kind: LayerType) -> bool:
    return any(r.spec.type is kind for r in walk(resolve(model)))


def conv_flatten_shape(model: ModelSpec) -> dict[str, tuple[int, int, int]]:
    """For each flatten layer that receives a C,H,W tensor with C > 1, by canonical prefix: its
    input shape (C, H, W).

    The TF backend flattens those in torch's C,H,W order (a Permute first)."""
    return {
        r.prefix: r.in_shape
        for r in walk(resolve(model))
        if r.spec.type is LayerType.FLATTEN and len(r.in_shape) == 3 and r.in_shape[0] > 1
    }

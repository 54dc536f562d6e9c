"""Framework-free model description: layer shapes and parameter names in the canonical layout.

The canonical layout is PyTorch's ``nn.Sequential`` state dict over the resolved layer list:
parameter ``"{i}.weight"`` / ``"{i}.bias"`` for layer ``i``; dense weights are (out, in), conv2d
weights are OIHW, and ``flatten`` after a convolution uses C,H,W order. The TF backend converts to
Keras layouts (kernel transposed, HWIO, H,W,C flatten) when it loads the arrays; see
docs/weights.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dualtrain.errors import UserError
from dualtrain.spec import LayerSpec, LayerType, ModelSpec
from dualtrain.spec.layers import KINDS, Array

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
    declared: tuple[Array, ...] = ()
    """This layer's arrays as its type declares them (dualtrain.spec.layers), named in full
    (``"3.weight"``): their init and Keras layout."""

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
        hint = " after a token_pool (or flatten) of the tokens" if len(shape) == 2 else ""
        raise UserError(
            f"model: the last layer must output a flat vector (one value per class or target: a "
            f"dense layer{hint}). Received: output shape {shape}"
        )
    if not any(r.params for r in walk(out)):
        raise UserError(
            "model: needs at least one layer with weights (dense, conv2d). Received: none"
        )
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


def forward_order(layers: list[ResolvedLayer] | tuple[ResolvedLayer, ...]):
    """Every resolved layer in the order a forward pass finishes them: a concat's branches and a
    residual block's body and shortcut before the layer that joins them (debug.dump_layers: the
    first layer that differs is the first in this order)."""
    for r in layers:
        for b in r.branches:
            yield from forward_order(b)
        yield from forward_order(r.body)
        yield from forward_order(r.shortcut)
        yield r


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
    body: list[ResolvedLayer] = []
    shortcut: list[ResolvedLayer] = []
    declared: tuple[Array, ...] = ()
    new: tuple[int, ...]
    t = layer.type
    rule = KINDS[t].rule
    if t is LayerType.RESIDUAL:
        body, shortcut, new = _residual(layer, shape, where, where_list, prefix, uid)
    elif rule is None:  # concat: only model.layers[0] of a model with several inputs
        raise UserError(
            f"{where}: a concat layer merges the branches of several model.inputs and must be "
            f"model.layers[0]. Received: concat here"
        )
    else:
        shaped = rule(layer, shape, where, first)
        new = shaped.out
        declared = tuple(replace(a, name=f"{prefix}.{a.name}") for a in shaped.arrays)
    params = tuple((a.name, a.shape) for a in declared if a.trainable)
    buffers = tuple((a.name, a.shape) for a in declared if not a.trainable)
    return ResolvedLayer(
        i,
        layer,
        shape,
        new,
        params,
        prefix,
        uid,
        buffers,
        tuple(body),
        tuple(shortcut),
        declared=declared,
    )


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


def keras_layouts(model: ModelSpec) -> dict[str, str]:
    """Every array's Keras layout by canonical name (identity, transpose, oihw_hwio), as its
    layer type declares it."""
    return {a.name: a.keras for r in walk(resolve(model)) for a in r.declared}


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

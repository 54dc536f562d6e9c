"""Every layer type of ``model.layers``, declared once (:data:`KINDS`): its fields with their
defaults, its shape rule, and the arrays it stores under canonical names with their initialisation
and their Keras layout.

Everything else reads these declarations: the spec's field checks (``LayerSpec``), the resolved
layer list (dualtrain.core.model), the initial weights (dualtrain.core.weights) and the TF
backend's layout conversion. Each backend adds one entry per type (``LAYERS`` in
backends/torch/model.py and backends/tf/model.py: how to build it, how to export it); the core
math lives in core/ only for a type with math of its own (batchnorm, dropout). A new layer type:
a :class:`Kind` here, a member of ``LayerType`` (spec/vocab.py) with its words in a ``#:`` comment
(docs/reference.md shows them), its fields on ``LayerSpec`` if new, one entry per backend, and
docs/spec.md.

Shapes are one sample's: ``(F,)`` features, ``(C, H, W)`` an image (channels first, the canonical
layout), ``(T, D)`` tokens (a dense, layernorm, dropout or activation on tokens acts on the last
axis, as torch's do).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dualtrain.errors import UserError
from dualtrain.spec.vocab import Approximate, LayerType, Padding, TokenPool

#: a dualtrain.spec.model.LayerSpec (which imports this module): its per-type fields
LayerSpec = Any
Shape = tuple[int, ...]

#: a field a layer type must be given (no default)
REQUIRED = "required"

#: How an array starts (drawn in layer order, array order, from the weight stream of
#: dualtrain.core.weights): ("uniform", b) U(-b, b); ("normal", s) N(0, s^2); ("const", c).
Init = tuple[str, float]


@dataclass(frozen=True)
class Array:
    """One array a layer stores: its canonical name (after the layer's prefix), shape, how it
    starts, its Keras layout (``identity``, ``transpose``: a dense weight (out, in) -> kernel
    (in, out), ``oihw_hwio``: a convolution's weight), and whether it is trained (batchnorm's
    running statistics are not)."""

    name: str
    shape: Shape
    init: Init
    keras: str = "identity"
    trainable: bool = True


@dataclass(frozen=True)
class Shaped:
    """What a layer makes of its input shape: its output shape and its arrays."""

    out: Shape
    arrays: tuple[Array, ...] = ()


@dataclass(frozen=True)
class Kind:
    """One layer type: ``fields`` maps each field it takes to its default (:data:`REQUIRED`: none;
    None: unset and the backends apply the documented default); ``rule`` checks the input shape
    (``where`` names the layer in errors; ``first``: the model's first layer) and gives
    :class:`Shaped` (None: a structural type core/model.py resolves itself, residual and concat);
    ``check`` is any check across the layer's own fields."""

    fields: Mapping[str, Any]
    rule: Callable[[Any, Shape, str, bool], Shaped] | None
    check: Callable[[Any], None] | None = None


def uniform(fan_in: int) -> Init:
    """torch's default for Linear and Conv2d: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    return ("uniform", 1.0 / math.sqrt(fan_in))


ONES: Init = ("const", 1.0)
ZEROS: Init = ("const", 0.0)


def _n(shape: Shape) -> int:
    return math.prod(shape)


def _same(s: LayerSpec, shape: Shape, where: str, first: bool) -> Shaped:
    return Shaped(shape)


def _tokens_or_flat(s: LayerSpec, shape: Shape, where: str, what: str) -> int:
    """The width of the last axis of a (F,) or (T, D) input."""
    if len(shape) not in (1, 2):
        raise UserError(
            f"{where} {what} a flat (F,) or tokens (T, D) input; add a flatten layer before it "
            f"(or patches for tokens). Received: input shape {shape}"
        )
    return shape[-1]


def _dense(s: LayerSpec, shape: Shape, where: str, first: bool) -> Shaped:
    fan_in = _tokens_or_flat(s, shape, where, "needs")
    assert s.units is not None  # REQUIRED
    init = uniform(fan_in)
    weight = Array("weight", (s.units, fan_in), init, "transpose")
    bias = (Array("bias", (s.units,), init),) if s.bias else ()
    return Shaped((*shape[:-1], s.units), (weight, *bias))


def _image(shape: Shape, where: str) -> tuple[int, int, int]:
    if len(shape) != 3:
        raise UserError(f"{where} needs a C,H,W input. Received: input shape {shape}")
    return shape[0], shape[1], shape[2]


def _conv2d(s: LayerSpec, shape: Shape, where: str, first: bool) -> Shaped:
    c, h, w = _image(shape, where)
    assert s.filters is not None and s.kernel_size is not None  # REQUIRED
    k, st = s.kernel_size, s.stride or 1
    if s.padding is Padding.SAME:
        oh, ow = h, w
    else:
        pad = s.padding if isinstance(s.padding, int) else 0
        oh, ow = (h + 2 * pad - k) // st + 1, (w + 2 * pad - k) // st + 1
    if oh < 1 or ow < 1:
        raise UserError(
            f"{where}: kernel {k} does not fit the input. Received: input shape {shape}"
        )
    init = uniform(c * k * k)
    weight = Array("weight", (s.filters, c, k, k), init, "oihw_hwio")
    bias = (Array("bias", (s.filters,), init),) if s.bias else ()
    return Shaped((s.filters, oh, ow), (weight, *bias))


def _pool2d(s: LayerSpec, shape: Shape, where: str, first: bool) -> Shaped:
    c, h, w = _image(shape, where)
    assert s.pool_size is not None  # REQUIRED
    p, st = s.pool_size, s.stride or s.pool_size
    oh, ow = (h - p) // st + 1, (w - p) // st + 1
    if oh < 1 or ow < 1:
        raise UserError(f"{where}: pool {p} does not fit the input. Received: input shape {shape}")
    return Shaped((c, oh, ow))


def _global_avgpool(s: LayerSpec, shape: Shape, where: str, first: bool) -> Shaped:
    return Shaped((_image(shape, where)[0],))


def _flatten(s: LayerSpec, shape: Shape, where: str, first: bool) -> Shaped:
    return Shaped((_n(shape),))


def _batchnorm(s: LayerSpec, shape: Shape, where: str, first: bool) -> Shaped:
    if first:
        raise UserError(
            f"{where} normalises the output of the layer before it; put it after a "
            f"dense or conv2d layer. Received: batchnorm as the first layer"
        )
    if len(shape) not in (1, 3):
        raise UserError(
            f"{where} normalises features (F,) or channels (C, H, W); for tokens (T, D) use "
            f"layernorm. Received: input shape {shape}"
        )
    c = (shape[0],)  # (F,) after dense: F features; (C, H, W) after conv: C channels
    return Shaped(
        shape,
        (
            Array("weight", c, ONES),
            Array("bias", c, ZEROS),
            Array("running_mean", c, ZEROS, trainable=False),
            Array("running_var", c, ONES, trainable=False),
        ),
    )


def _layernorm(s: LayerSpec, shape: Shape, where: str, first: bool) -> Shaped:
    d = _tokens_or_flat(s, shape, where, "normalises the last axis of")
    return Shaped(shape, (Array("weight", (d,), ONES), Array("bias", (d,), ZEROS)))


def _patches(s: LayerSpec, shape: Shape, where: str, first: bool) -> Shaped:
    """A ViT patch embedding: a convolution with stride = kernel = size, its (D, H/size, W/size)
    output read as H/size * W/size tokens of width D, row by row (torch's
    ``conv(x).flatten(2).transpose(1, 2)``)."""
    c, h, w = _image(shape, where)
    assert s.size is not None and s.dim is not None  # REQUIRED
    if h % s.size or w % s.size:
        raise UserError(
            f"{where}: patches of {s.size}x{s.size} must tile the {h}x{w} image exactly (a "
            f"size that divides both). Received: size={s.size}"
        )
    init = uniform(c * s.size * s.size)
    weight = Array("weight", (s.dim, c, s.size, s.size), init, "oihw_hwio")
    bias = (Array("bias", (s.dim,), init),) if s.bias else ()
    return Shaped(((h // s.size) * (w // s.size), s.dim), (weight, *bias))


def _tokens(shape: Shape, where: str) -> tuple[int, int]:
    if len(shape) != 2:
        raise UserError(
            f"{where} needs tokens (T, D) (after patches or embedding). Received: input shape "
            f"{shape}"
        )
    return shape[0], shape[1]


def _position(s: LayerSpec, shape: Shape, where: str, first: bool) -> Shaped:
    """A learned position embedding (T, D) added to the tokens; it starts N(0, 0.02^2), as ViT's
    and BERT's do."""
    return Shaped(shape, (Array("weight", _tokens(shape, where), ("normal", 0.02)),))


def _token_pool(s: LayerSpec, shape: Shape, where: str, first: bool) -> Shaped:
    return Shaped((_tokens(shape, where)[1],))


def _attention(s: LayerSpec, shape: Shape, where: str, first: bool) -> Shaped:
    """Multi-head self-attention with torch's nn.MultiheadAttention parameters: the packed q/k/v
    projection ``in_proj_weight`` (3D, D) (rows: q, then k, then v; each head's head_dim rows
    consecutive) and ``in_proj_bias``, the output projection ``out_proj``; initialised as torch
    does (xavier-uniform packed projection, zero biases, the output weight as a Linear's)."""
    _, d = _tokens(shape, where)
    assert s.heads is not None  # REQUIRED
    if d % s.heads:
        raise UserError(
            f"{where}: heads must divide the token width {d} (each head gets width / heads). "
            f"Received: heads={s.heads}"
        )
    xavier: Init = ("uniform", math.sqrt(6.0 / (d + 3 * d)))
    arrays = [Array("in_proj_weight", (3 * d, d), xavier)]
    arrays += [Array("in_proj_bias", (3 * d,), ZEROS)] if s.bias else []
    arrays += [Array("out_proj.weight", (d, d), uniform(d), "transpose")]
    arrays += [Array("out_proj.bias", (d,), ZEROS)] if s.bias else []
    return Shaped(shape, tuple(arrays))


def _embedding(s: LayerSpec, shape: Shape, where: str, first: bool) -> Shaped:
    """Integer ids (T,) -> tokens (T, D) (torch's nn.Embedding, N(0, 1) at the start); the ids
    arrive as the input's values (whole numbers in [0, vocab))."""
    if not first or len(shape) != 1:
        raise UserError(
            f"{where} looks up integer ids: it must be the first layer, on an input of shape "
            f"[T] (T ids per sample). Received: input shape {shape}"
        )
    assert s.vocab is not None and s.dim is not None  # REQUIRED
    return Shaped((shape[0], s.dim), (Array("weight", (s.vocab, s.dim), ("normal", 1.0)),))


def _check_conv2d(s: LayerSpec) -> None:
    if s.padding is Padding.SAME and (s.stride or 1) != 1:
        raise UserError(
            f"conv2d padding 'same' needs stride 1 (torch and Keras pad strided convs "
            f"differently; an integer padding such as 1 pads every side equally on both). "
            f"Received: stride={s.stride}"
        )


def _check_residual(s: LayerSpec) -> None:
    """A residual block holds at least one layer, and no block, flatten or concat."""
    if not s.body:
        raise UserError("layer residual.body must list at least one layer. Received: []")
    for part in ("body", "shortcut"):
        for j, inner in enumerate(getattr(s, part)):
            if inner.type in (LayerType.RESIDUAL, LayerType.FLATTEN, LayerType.CONCAT):
                raise UserError(
                    f"layer residual.{part}[{j}]: a residual block cannot hold a "
                    f"{inner.type.value} layer (blocks do not nest; flatten changes "
                    f"the shape the add needs). Received: {inner.type.value}"
                )


_POOL = {"pool_size": REQUIRED, "stride": None}

KINDS: dict[LayerType, Kind] = {
    LayerType.DENSE: Kind({"units": REQUIRED, "bias": True}, _dense),
    LayerType.CONV2D: Kind(
        {"filters": REQUIRED, "kernel_size": REQUIRED, "stride": None, "padding": Padding.VALID}
        | {"bias": True},
        _conv2d,
        _check_conv2d,
    ),
    LayerType.MAXPOOL2D: Kind(_POOL, _pool2d),
    LayerType.AVGPOOL2D: Kind(_POOL, _pool2d),
    LayerType.GLOBAL_AVGPOOL: Kind({}, _global_avgpool),
    LayerType.FLATTEN: Kind({}, _flatten),
    LayerType.RELU: Kind({}, _same),
    LayerType.TANH: Kind({}, _same),
    LayerType.SIGMOID: Kind({}, _same),
    LayerType.SILU: Kind({}, _same),
    LayerType.GELU: Kind({"approximate": Approximate.NONE}, _same),
    LayerType.DROPOUT: Kind({"rate": REQUIRED}, _same),
    LayerType.BATCHNORM: Kind({"momentum": 0.1, "eps": 1e-5, "sync": False}, _batchnorm),
    LayerType.LAYERNORM: Kind({"eps": 1e-5}, _layernorm),
    LayerType.PATCHES: Kind({"size": REQUIRED, "dim": REQUIRED, "bias": True}, _patches),
    LayerType.POSITION: Kind({}, _position),
    LayerType.ATTENTION: Kind({"heads": REQUIRED, "causal": False, "bias": True}, _attention),
    LayerType.TOKEN_POOL: Kind({"pool": TokenPool.MEAN}, _token_pool),
    LayerType.EMBEDDING: Kind({"vocab": REQUIRED, "dim": REQUIRED}, _embedding),
    LayerType.RESIDUAL: Kind({"body": (), "shortcut": ()}, None, _check_residual),
    LayerType.CONCAT: Kind({}, None),
}

#: Range checks by field, whatever the type: (holds, requirement).
RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    **{
        name: (lambda v: v >= 1, "must be >= 1")
        for name in ("units", "filters", "kernel_size", "pool_size", "stride")
    },
    **{name: (lambda v: v >= 1, "must be >= 1") for name in ("heads", "size", "dim", "vocab")},
    "rate": (lambda v: 0.0 <= v < 1.0, "must be in [0, 1)"),
    "momentum": (lambda v: 0.0 <= v <= 1.0, "must be in [0, 1]"),
    "eps": (lambda v: v > 0.0, "must be > 0"),
    "padding": (lambda v: not isinstance(v, int) or v >= 0, "must be >= 0, valid or same"),
}

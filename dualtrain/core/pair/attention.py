"""Attention in a model pair's automatic map: torch's ``nn.MultiheadAttention`` (inside
``nn.TransformerEncoderLayer`` too) against Keras's ``MultiHeadAttention``.

torch packs the query, key and value projections into one ``in_proj_weight`` (3E, E) and
``in_proj_bias`` (3E,) (or, with kdim/vdim, keeps ``q/k/v_proj_weight`` (E, ...) and the packed
bias), and its ``out_proj`` is a Linear (E, E); Keras keeps an EinsumDense per projection, kernels
(E, heads, head_dim) and biases (heads, head_dim), and the output kernel (heads, head_dim, E). Each
packed array maps onto the three Keras variables by one split entry (``qkv_heads``), each separate
one by ``heads_in``, out_proj's weight by ``heads_out`` (:mod:`.transforms`); shapes that differ
are one line naming the setting that makes them (``key_dim`` given the width, ``num_heads``).
"""

from __future__ import annotations

from typing import Any

from dualtrain.core.pair.record import KerasVar, MapEntry, TorchArray
from dualtrain.core.pair.transforms import keras_shapes
from dualtrain.errors import UserError

#: a Keras MultiHeadAttention's projections, by their sublayers' names
QKV = ("query", "key", "value")
OUTPUT = "attention_output"
#: nn.MultiheadAttention's separate projections (kdim or vdim set) and their Keras sublayers
SEPARATE = {"q_proj_weight": "query", "k_proj_weight": "key", "v_proj_weight": "value"}


def projection(v: KerasVar) -> str:
    """query, key, value or attention_output: a MultiHeadAttention variable's sublayer."""
    return v.layer.rsplit("/", 1)[-1]


def attention_layer(v: KerasVar) -> str:
    """The MultiHeadAttention layer a projection variable belongs to."""
    return v.layer.rsplit("/", 1)[0]


def merge_qkv(groups: list[tuple[str, list[Any]]]) -> list[tuple[str, list[Any]]]:
    """The Keras weighted layers with each MultiHeadAttention's query, key and value sublayers
    (consecutive, in that order: the describe child orders them) as one group, named by the
    attention layer: the counterpart of torch's one packed in_proj."""
    out: list[tuple[str, list[Any]]] = []
    i = 0
    while i < len(groups):
        three = groups[i : i + 3]
        if len(three) == 3 and all(
            vs[0].kind == "attention" and projection(vs[0]) == p
            for (_, vs), p in zip(three, QKV, strict=True)
        ):
            out.append((attention_layer(three[0][1][0]), [v for _, vs in three for v in vs]))
            i += 3
        else:
            out.append(groups[i])
            i += 1
    return out


def is_qkv(variables: list[KerasVar]) -> bool:
    return bool(variables) and all(
        v.kind == "attention" and projection(v) in QKV for v in variables
    )


def _check_heads(module: str, lay: str, heads: int | None, kernel: KerasVar, width: int) -> None:
    """A Keras projection kernel (E, heads, key_dim) against torch's num_heads and head_dim."""
    if heads is None or len(kernel.shape) != 3:
        return
    k_heads, k_dim = kernel.shape[1], kernel.shape[2]
    dim = width // heads
    if (k_heads, k_dim) == (heads, dim):
        return
    name = projection(kernel)
    setting = "value_dim" if name == "value" else "key_dim"
    if k_heads == heads and k_dim == width:
        why = (
            f"its {setting} is {k_dim}, the model width, where torch's head_dim is {width} / "
            f"{heads} = {dim}"
        )
    elif k_heads != heads:
        why = f"it has {k_heads} heads of {k_dim}, torch {heads} heads of {dim}"
    else:
        why = f"its {setting} is {k_dim}, torch's head_dim {dim}"
    raise UserError(
        f"model pair: torch {module!r} (MultiheadAttention, {heads} heads of {dim}) vs Keras "
        f"{lay!r} (MultiHeadAttention): its {name} kernel is {list(kernel.shape)}: {why}; give "
        f"MultiHeadAttention(num_heads={heads}, key_dim={dim}) ({setting} is the width of one "
        f"head: embed_dim / num_heads). Received: {kernel.path} {list(kernel.shape)}"
    )


def qkv_entries(
    module: str, arrays: list[TorchArray], lay: str, variables: list[KerasVar]
) -> list[MapEntry]:
    """torch's q/k/v projection (packed or not) onto a MultiHeadAttention's query, key and value
    variables."""
    by = {(projection(v), v.role): v for v in variables}
    width = next((a.shape[0] // 3 for a in arrays if a.name.endswith("in_proj_weight")), None)
    if width is None:
        width = next(a.shape[0] for a in arrays if a.name.endswith("q_proj_weight"))
    heads = arrays[0].heads
    for p in QKV:
        if (p, "kernel") in by:
            _check_heads(module, lay, heads, by[p, "kernel"], width)
    t_bias = any(a.name.endswith("in_proj_bias") for a in arrays)
    k_bias = any(v.role == "bias" for v in variables)
    if t_bias != k_bias:
        side = "torch" if t_bias else "Keras"
        raise UserError(
            f"model pair: torch {module!r} (MultiheadAttention) vs Keras {lay!r} "
            f"(MultiHeadAttention): a bias on the {side} side only (missing or extra bias: "
            f"nn.MultiheadAttention's bias=, MultiHeadAttention's use_bias=). "
            f"Received: torch {[a.name for a in arrays]}, Keras {[v.path for v in variables]}"
        )
    entries = []
    for a in arrays:
        leaf = a.name.rsplit(".", 1)[-1]
        role = "bias" if leaf == "in_proj_bias" else "kernel"
        if leaf in ("in_proj_weight", "in_proj_bias"):
            targets = [by.get((p, role)) for p in QKV]
            e = MapEntry(a.name, tuple(v.path for v in targets if v), "qkv_heads", heads=heads)
        else:
            one = by.get((SEPARATE.get(leaf, ""), role))
            targets = [one]
            e = MapEntry(a.name, one.path if one else "", "heads_in", heads=heads)
        if any(v is None for v in targets) or heads is None:
            raise UserError(
                f"model pair: torch {a.name} {list(a.shape)} has no counterpart among Keras "
                f"{lay!r}'s {[v.path for v in variables]}. Received: {a.name}"
            )
        got = keras_shapes(e, a.shape)
        want = tuple(v.shape for v in targets if v is not None)
        if got != want or any(v.trainable != a.trainable for v in targets if v is not None):
            raise UserError(
                f"model pair: torch {a.name} {list(a.shape)} cannot map onto Keras "
                f"{[v.path for v in targets if v]} {[list(s) for s in want]} ({e.transform} "
                f"gives {[list(s) for s in got or ()]}). Received: {a.name}"
            )
        entries.append(e)
    return entries


def output_entry(a: TorchArray, v: KerasVar) -> MapEntry:
    """out_proj's weight or bias onto a MultiHeadAttention's attention_output kernel or bias."""
    if projection(v) != OUTPUT or not a.name.endswith("weight") or len(v.shape) != 3:
        return MapEntry(a.name, v.path, "identity")
    heads = v.shape[0]
    if a.heads is not None and a.heads != heads:
        raise UserError(
            f"model pair: torch {a.module!r} has {a.heads} heads and Keras "
            f"{attention_layer(v)!r} {heads}; give MultiHeadAttention(num_heads={a.heads}, "
            f"key_dim={a.shape[1] // a.heads}). Received: {v.path} {list(v.shape)}"
        )
    return MapEntry(a.name, v.path, "heads_out", heads=heads)


def zero_gradients(arrays: tuple[TorchArray, ...] | list[TorchArray]) -> dict[str, tuple[int, int]]:
    """The parts of a pair's arrays whose exact gradient is zero, by canonical name: the key's
    bias of every nn.MultiheadAttention (``in_proj_bias[E:2E]``). It adds q.b_k to every score of a
    query alike, which the softmax cancels; each framework computes rounding noise there instead,
    which Adam-like optimizers divide by eps into updates that differ between any two
    implementations (the transformer pair's fp64 runs parted by 1.3e-10 on that bias alone after
    200 steps under adam). Both backends set that part of the gradient to zero: the exact step."""
    return {
        a.name: (a.shape[0] // 3, 2 * (a.shape[0] // 3))
        for a in arrays
        if a.cls == "MultiheadAttention" and a.name.endswith("in_proj_bias") and a.trainable
    }

"""The automatic weight map of a model pair: torch modules with weights and Keras layers with
variables, paired in order, and within a pair the arrays by role, each with the layout transform
its kind and shapes justify (:func:`match`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import dualtrain.core.pair.attention as attention
from dualtrain.core.pair.record import KerasVar, MapEntry, Side, TorchArray
from dualtrain.core.pair.transforms import keras_shape
from dualtrain.errors import UserError

_ROLE_ORDER = {
    "dense": ("weight", "bias"),
    "conv2d": ("weight", "bias"),
    "batchnorm": ("weight", "bias", "running_mean", "running_var"),
}
_KERAS_ROLES = {
    "dense": ("kernel", "bias"),
    "conv2d": ("kernel", "bias"),
    "batchnorm": ("gamma", "beta", "moving_mean", "moving_variance"),
}


def _groups(items: Iterable[Any], key: str) -> list[tuple[str, list[Any]]]:
    out: list[tuple[str, list[Any]]] = []
    for it in items:
        k = getattr(it, key)
        if out and out[-1][0] == k:
            out[-1][1].append(it)
        else:
            out.append((k, [it]))
    return out


def _transform(a: TorchArray, v: KerasVar) -> MapEntry:
    """The transform that takes torch array ``a`` to Keras variable ``v`` when their kinds and
    shapes justify one; UserError otherwise."""
    if v.kind == "attention":  # out_proj onto a MultiHeadAttention's attention_output
        e = attention.output_entry(a, v)
    elif a.kind in ("dense", "attention") and a.name.endswith("weight") and len(a.shape) == 2:
        if v.flatten_hwc is not None and len(v.flatten_hwc) == 3:
            h, w, c = v.flatten_hwc
            if c > 1 and h * w > 1:
                e = MapEntry(a.name, v.path, "flatten_chw", (c, h, w))
                if keras_shape(e, a.shape) == v.shape:
                    return e
        e = MapEntry(a.name, v.path, "transpose")
    elif a.kind == "conv2d" and len(a.shape) == 4:
        e = MapEntry(a.name, v.path, "oihw_hwio")
    else:
        e = MapEntry(a.name, v.path, "identity")
    if keras_shape(e, a.shape) != v.shape:
        raise UserError(
            f"model pair: torch {a.name} {list(a.shape)} ({a.cls}) cannot map onto Keras "
            f"{v.path} {list(v.shape)} ({v.cls}) by any layout transform ({e.transform} gives "
            f"{list(keras_shape(e, a.shape) or ())}); the layers differ, or the automatic map "
            f"paired the wrong ones (give model.weight_map, docs/own-models.md). Received: "
            f"{a.name} -> {v.path}"
        )
    return e


def match(torch: Side, keras: Side) -> tuple[MapEntry, ...]:
    """The automatic map: torch modules with weights and Keras layers with variables, paired in
    order (the torch side in the order its modules first ran, the Keras side in the model's layer
    order); within a pair, arrays by role (weight/kernel, bias, ...). Unambiguous only when both
    sides have the same sequence of weighted layers of the same kinds with shapes a layout
    transform explains: anything else is one line naming the first pair that fails."""
    t_groups = _groups(torch.torch, "module")
    k_groups = attention.merge_qkv(_groups(keras.keras, "layer"))
    entries: list[MapEntry] = []
    for i, ((mod, arrays), (lay, variables)) in enumerate(zip(t_groups, k_groups, strict=False)):
        kinds = (arrays[0].kind, variables[0].kind)
        if attention.is_qkv(variables) and kinds[0] == "attention":
            entries += attention.qkv_entries(mod, arrays, lay, variables)
            continue
        if not _kinds_pair(*kinds) or len(arrays) != len(variables):
            what = _describe_mismatch(arrays, variables)
            raise UserError(
                f"model pair: weighted layer {i + 1} differs: torch {mod!r} ({arrays[0].cls}: "
                f"{', '.join(a.name.rsplit('.', 1)[-1] for a in arrays)}) vs Keras {lay!r} "
                f"({variables[0].cls}: {', '.join(v.role for v in variables)}){what}; fix the "
                f"port or give model.weight_map (docs/own-models.md). Received: {len(t_groups)} "
                f"torch and {len(k_groups)} Keras weighted layers"
            )
        order = {r: j for j, r in enumerate(_KERAS_ROLES.get(kinds[1], ()))}
        variables = sorted(variables, key=lambda v: order.get(v.role, len(order)))
        t_order = {r: j for j, r in enumerate(_ROLE_ORDER.get(kinds[0], ()))}
        arrays = sorted(arrays, key=lambda a: t_order.get(a.name.rsplit(".", 1)[-1], len(t_order)))
        for a, v in zip(arrays, variables, strict=True):
            if a.trainable != v.trainable:
                raise UserError(
                    f"model pair: torch {a.name} is {'a parameter' if a.trainable else 'a buffer'}"
                    f" but Keras {v.path} is {'trainable' if v.trainable else 'not trainable'}. "
                    f"Received: {a.name} -> {v.path}"
                )
            entries.append(_transform(a, v))
    if len(t_groups) != len(k_groups):
        extra = t_groups[len(k_groups) :] or k_groups[len(t_groups) :]
        side = "torch" if len(t_groups) > len(k_groups) else "Keras"
        raise UserError(
            f"model pair: the torch model has {len(t_groups)} weighted layers and the Keras one "
            f"{len(k_groups)}: {side} {extra[0][0]!r} has no counterpart (a layer missing from "
            f"the port?). Received: torch {[g for g, _ in t_groups]}, Keras "
            f"{[g for g, _ in k_groups]}"
        )
    return tuple(entries)


def _kinds_pair(t: str, k: str) -> bool:
    """Layers of these kinds can hold the same arrays: the same kind, a packed attention
    projection (MultiheadAttention's in_proj) against a Dense of 3 x width, an out_proj (Linear)
    against a MultiHeadAttention's attention_output."""
    return t == k or (t, k) in (("attention", "dense"), ("dense", "attention"))


def _describe_mismatch(arrays: list[TorchArray], variables: list[KerasVar]) -> str:
    """The classic reason two paired layers hold different arrays, when it is one."""
    t_norm = arrays[0].cls == "LayerNorm"
    k_norm = variables[0].cls == "LayerNormalization"
    if t_norm != k_norm and {arrays[0].kind, variables[0].kind} & {"attention", "dense"}:
        first, then = ("torch", "Keras") if t_norm else ("Keras", "torch")
        return (
            f" (a LayerNorm on the {first} side where the {then} side has its next sublayer: "
            f"pre-LN against post-LN? nn.TransformerEncoderLayer(norm_first=True) computes "
            f"x + attn(norm1(x)) and x + ff(norm2(x)), norm_first=False norm1(x + attn(x)) and "
            f"norm2(x + ff(x)): write both sides' blocks in the same order)"
        )
    t_bias = any(a.name.endswith(".bias") for a in arrays)
    k_bias = any(v.role == "bias" for v in variables)
    if arrays[0].kind == variables[0].kind and t_bias != k_bias:
        side = "torch" if t_bias else "Keras"
        return f" (a bias on the {side} side only: missing or extra bias)"
    return ""

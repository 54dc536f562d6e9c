"""The classic mistakes of an attention port, named where the locator's evidence fits one: the
torch side's attention recomputed in NumPy from what torch recorded (its packed projection
x W^T + b, its mask), once as torch computes it and once per mistake, and each compared with what
the Keras side made (the heads' context before the output projection, or the attention's output
after it). The one the Keras side matches to float64 rounding is the finding: q/k/v taken from the
packed projection in another order, the heads split (head_dim, heads), the scale applied twice or
not at all, the softmax over the queries, the mask with the other polarity or left out; the
tokens pooled another way (the first token where torch averages them); and post-LN against pre-LN
(a block's LayerNorm before its sublayer on one side, after its residual add on the other).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from dualtrain.core.locate.compare import TOL, rel
from dualtrain.core.pair.record import Layout

_QKV = ("query", "key", "value")


def _softmax(s: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(s - s.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def context(
    proj: np.ndarray,
    heads: int,
    mask: np.ndarray | None,
    *,
    order: tuple[int, int, int] = (0, 1, 2),
    dh: bool = False,
    merge_dh: bool | None = None,
    scale: float | None = None,
    axis: int = -1,
    polarity: str = "torch",
) -> np.ndarray:
    """The heads' context (N, T, E) of a packed projection (N, T, 3E), torch's way by default:
    q, k, v its thirds in ``order``, head h the features h*D .. (h+1)*D-1 (``dh``: every heads-th
    feature; ``merge_dh``: the heads merged back that way, by default as they were split),
    softmax(q k^T * scale) over the keys (``axis``), ``mask`` True = masked (``polarity``
    "inverted": True = attended, as Keras reads a mask; "none": no mask)."""
    n, t, e3 = proj.shape
    e = e3 // 3
    d = e // heads
    parts = np.split(proj, 3, axis=-1)
    q, k, v = (parts[i] for i in order)

    def split(a: np.ndarray) -> np.ndarray:
        if dh:
            return a.reshape(n, t, d, heads).transpose(0, 3, 1, 2)
        return a.reshape(n, t, heads, d).transpose(0, 2, 1, 3)

    q, k, v = split(q), split(k), split(v)
    s = q @ k.transpose(0, 1, 3, 2) * (1.0 / math.sqrt(d) if scale is None else scale)
    if mask is not None and polarity != "none":
        masked = mask.astype(bool) if polarity == "torch" else ~mask.astype(bool)
        # Keras masks with a large negative number: a row with every key masked is uniform
        s = np.where(masked, -0.7 * np.finfo(np.float64).max, s)
    ctx = _softmax(s, axis) @ v
    if dh if merge_dh is None else merge_dh:
        return ctx.transpose(0, 2, 3, 1).reshape(n, t, e)
    return ctx.transpose(0, 2, 1, 3).reshape(n, t, e)


def _mistakes(heads: int, has_mask: bool) -> list[tuple[str, dict]]:
    d_hint = "(reshape (N, T, heads, head_dim): torch's head h takes features h*head_dim ..)"
    out: list[tuple[str, dict]] = []
    if has_mask:
        out += [
            (
                "the attention mask with the other polarity (torch's attn_mask True = masked, "
                "Keras's attention_mask True = attended: give Keras the logical not of torch's "
                "mask, or use_causal_mask=True for a causal one)",
                {"polarity": "inverted"},
            ),
            (
                "the attention mask left out on the Keras side (torch's attention is masked: "
                "give Keras's attention_mask the logical not of torch's mask, or "
                "use_causal_mask=True for a causal one)",
                {"polarity": "none"},
            ),
        ]
    out += [
        (
            "softmax over the wrong axis (over the queries: the attention weights of each "
            "query must sum to one over the keys, softmax(scores, axis=-1) for scores (N, "
            "heads, queries, keys))",
            {"axis": -2},
        ),
        (
            "the scale applied twice (the scores times 1/head_dim: torch scales q k^T by "
            "1/sqrt(head_dim) once; Keras's MultiHeadAttention scales the query itself)",
            {"scale": "twice"},
        ),
        (
            "the scale not applied (torch divides q k^T by sqrt(head_dim))",
            {"scale": 1.0},
        ),
        (
            "the scale 1/sqrt(width) where torch's is 1/sqrt(head_dim) (head_dim = width / heads)",
            {"scale": "width"},
        ),
        (f"the heads split in the other order (head_dim, heads) {d_hint}", {"dh": True}),
        (
            f"the heads merged back in the other order (head_dim, heads) {d_hint}",
            {"dh": False, "merge_dh": True},
        ),
        (
            f"the heads split in the other order (head_dim, heads) {d_hint}",
            {"dh": True, "merge_dh": False},
        ),
    ]
    for order in itertools.permutations(range(3)):
        if order != (0, 1, 2):
            names = ", ".join(_QKV[i] for i in order)
            out.append(
                (
                    f"q, k, v taken from the packed projection in another order (the port reads "
                    f"its thirds as the {names} of torch's: in_proj_weight's rows are query, "
                    f"key, value in that order; an explicit weight map's qkv_heads entry lists "
                    f"the Keras query, key and value variables in that order)",
                    {"order": order},
                )
            )
    return out


def attention_mistake(
    observed: np.ndarray | None,
    proj: np.ndarray | None,
    heads: int | None,
    mask: np.ndarray | None,
    out_weight: np.ndarray | None = None,
    out_bias: np.ndarray | None = None,
) -> str:
    """The mistake whose attention makes ``observed`` (the heads' context, or with ``out_weight``
    the attention's output) from torch's packed projection ``proj`` (N, T, 3E); "" when none
    does, or torch's own attention does."""
    if observed is None or proj is None or not heads or proj.shape[-1] % (3 * heads):
        return ""
    d = proj.shape[-1] // 3 // heads

    def made(kw: dict) -> np.ndarray:
        if kw.get("scale") in ("twice", "width"):
            kw = {**kw, "scale": 1.0 / d if kw["scale"] == "twice" else 1.0 / math.sqrt(d * heads)}
        ctx = context(proj, heads, mask, **kw)
        if out_weight is None:
            return ctx
        return ctx @ np.asarray(out_weight).T + (0.0 if out_bias is None else out_bias)

    if _fits(observed, made({})):
        return ""
    for name, kw in _mistakes(heads, mask is not None):
        if _fits(observed, made(kw)):
            return name
    return ""


def _fits(a: np.ndarray, b: np.ndarray) -> bool:
    r = rel(a, b)
    return r is not None and r <= TOL


#: how a port may pool the tokens (N, T, E) -> (N, E), against torch's
POOLS = {
    "the mean over the tokens": lambda a: a.mean(axis=1),
    "the first token": lambda a: a[:, 0],
    "the last token": lambda a: a[:, -1],
    "the max over the tokens": lambda a: a.max(axis=1),
    "the sum over the tokens": lambda a: a.sum(axis=1),
}


def pool_mistake(t: dict[str, np.ndarray], module: str, observed: np.ndarray | None) -> str:
    """A layer fed pooled tokens: which pooling of torch's tokens (a module output of shape
    (N, T, E)) makes torch's input and which the Keras side's (``observed``), when they differ."""
    x = t.get(f"in/{module}")
    if observed is None or x is None or x.ndim != 2:
        return ""
    for key, tokens in t.items():
        if not key.startswith("out/") or tokens.ndim != 3 or tokens.shape[::2] != x.shape:
            continue
        made = {name: f(tokens) for name, f in POOLS.items()}
        torch_pool = next((n for n, a in made.items() if _fits(x, a)), None)
        keras_pool = next((n for n, a in made.items() if _fits(observed, a)), None)
        if torch_pool and keras_pool and torch_pool != keras_pool:
            return (
                f"the tokens pooled another way (torch takes {torch_pool} of the output of "
                f"{key[4:]!r}, Keras {keras_pool}: pool the same way on both sides)"
            )
    return ""


def residual_mistake(t: dict[str, np.ndarray], module: str, observed: np.ndarray | None) -> str:
    """A layer whose Keras input is an earlier torch module's output alone where torch's is that
    output plus the block's input (a residual add left out), or torch's input plus such an output
    once more (an extra add)."""
    x = t.get(f"in/{module}")
    if observed is None or x is None:
        return ""
    outs = {k[4:]: v for k, v in t.items() if k.startswith("out/") and v.shape == x.shape}
    for name, y in outs.items():
        if _fits(observed, y) and not _fits(x, y):
            return (
                f"the residual connection left out (the Keras layer takes the output of "
                f"{name!r} alone, torch that output plus the block's input: add the input back)"
            )
        if _fits(observed, x + y):
            return (
                f"a residual add torch does not make (the Keras layer takes torch's input plus "
                f"the output of {name!r} once more)"
            )
    return ""


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, eps: float) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + eps)
    return y * w + (0.0 if b is None else b)


#: the fix for each order, said after what was found
_NORM_FIRST = (
    "pre-LN (norm_first=True) normalises each sublayer's input, x + attn(norm1(x)) and "
    "x + ff(norm2(x)); post-LN (norm_first=False) normalises after each residual add, "
    "norm1(x + attn(x)) and norm2(x + ff(x))"
)


def norm_order_mistake(
    layout: Layout, module: str, t: dict[str, np.ndarray], k: dict[str, np.ndarray], w: dict
) -> str:
    """Post-LN against pre-LN (``norm_first``), where an explicit map pairs the two orders: the
    Keras input of a torch LayerNorm is torch's input to it plus torch's attention of that
    input (a post-LN Keras block where torch's is pre-LN); or the Keras input of a torch
    attention is a torch LayerNorm of torch's input to it (a pre-LN Keras block where torch's
    is post-LN). Both recomputed in NumPy from torch's weights."""
    x, observed = t.get(f"in/{module}"), k.get(f"kin/{module}")
    if x is None or observed is None:
        return ""
    torch_layers = {d.get("name"): d for d in layout.torch.layers}
    if torch_layers.get(module, {}).get("cls") == "LayerNorm":
        for mha, heads in {a.module: a.heads for a in layout.torch.torch if a.heads}.items():
            wi, wo = w.get(f"{mha}.in_proj_weight"), w.get(f"{mha}.out_proj.weight")
            if wi is None or wo is None or wi.shape[1] != x.shape[-1]:
                continue
            proj = x @ np.asarray(wi).T + w.get(f"{mha}.in_proj_bias", 0.0)
            out = context(proj, heads, t.get(f"mask/{mha}")) @ np.asarray(wo).T
            if _fits(observed, x + out + w.get(f"{mha}.out_proj.bias", 0.0)):
                return (
                    f"post-LN against pre-LN (norm_first): the Keras block is post-LN (its "
                    f"LayerNormalization takes the block's input plus the attention's output) "
                    f"where torch's is pre-LN ({module!r} takes the block's input); {_NORM_FIRST}: "
                    f"put each LayerNormalization before its sublayer in the Keras block (or "
                    f"give torch norm_first=False if post-LN is meant)"
                )
    if any(a.module == module and a.heads for a in layout.torch.torch):
        for name, cfg in torch_layers.items():
            gamma = w.get(f"{name}.weight")
            if cfg.get("cls") != "LayerNorm" or gamma is None or gamma.shape != x.shape[-1:]:
                continue
            ln = _layer_norm(x, gamma, w.get(f"{name}.bias"), float(cfg.get("eps", 1e-5)))
            if _fits(observed, ln):
                return (
                    f"pre-LN against post-LN (norm_first): the Keras block is pre-LN (its "
                    f"attention takes the LayerNorm {name!r} of the block's input) where "
                    f"torch's is post-LN ({module!r} takes the block's input); {_NORM_FIRST}: "
                    f"put each LayerNormalization after its residual add in the Keras block (or "
                    f"give torch norm_first=True if pre-LN is meant)"
                )
    return ""

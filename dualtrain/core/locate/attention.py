"""The classic mistakes of an attention port, named where the locator's evidence fits one: the
torch side's attention recomputed in NumPy from what torch recorded (its packed projection
x W^T + b, its mask), once as torch computes it and once per mistake, and each compared with what
the Keras side made (the heads' context before the output projection, or the attention's output
after it). The one the Keras side matches to float64 rounding is the finding: q/k/v taken from the
packed projection in another order, the heads split (head_dim, heads), the scale applied twice or
not at all, the softmax over the queries, the mask with the other polarity or left out; and the
tokens pooled another way (the first token where torch averages them).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from dualtrain.core.locate.compare import TOL, rel

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
                    f"key, value in that order)",
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

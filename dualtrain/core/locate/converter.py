"""A converter's mistakes, read from the weight map learned from it (model.convert): a weight laid
out otherwise than its Keras layer takes it (a kernel reshaped where it should be transposed), a
packed q, k, v weight split in another order, heads split head size first, and q and k reordered
within each head for a rotary embedding of the other layout."""

from __future__ import annotations

import numpy as np

from dualtrain.core.pair.record import Layout, MapEntry
from dualtrain.core.pair.transforms import to_keras

#: the layout a Keras layer takes of a torch module's weight, by the module's kind (nn.Linear,
#: nn.Conv2d), and what it is in words
_LAYOUTS = {
    "dense": ("transpose", "a transpose (Dense's kernel is (in, out): weight.T)"),
    "conv2d": ("oihw_hwio", "(O, I, H, W) -> (H, W, I, O) (Conv2D's kernel)"),
}


def converter_mistake(layout: Layout, module: str) -> str:
    """A learned map (model.convert) that lays a Linear's or Conv2d's weight out otherwise than
    its Keras layer takes it: a kernel reshaped where it should be transposed, or the axes in
    another order."""
    if not layout.learned:
        return ""
    a = next((x for x in layout.torch.torch if x.name == f"{module}.weight"), None)
    entry = layout.by_torch().get(f"{module}.weight")
    if entry is not None and len(entry.targets) == 3:
        return _packed_order(entry) or _heads_order(entry) or _rotary_order(entry)
    if a is None or entry is None or a.kind not in _LAYOUTS or len(entry.targets) != 1:
        return ""
    heads = _heads_order(entry) or _rotary_order(entry)
    if heads:
        return heads
    transform, words = _LAYOUTS[a.kind]
    ids = np.arange(int(np.prod(a.shape)), dtype=np.int64).reshape(a.shape)
    want = to_keras(MapEntry(a.name, entry.keras, transform), ids)
    got = to_keras(entry, ids)
    if np.array_equal(got.reshape(-1), want.reshape(-1)):  # an EinsumDense's kernel: reshaped
        return ""
    how = (
        "a reshape in its own order"
        if np.array_equal(got.reshape(-1), ids.reshape(-1))
        else ("another order of its elements")
    )
    return (
        f"the converter's layout of a weight: it makes Keras {entry.keras!r} {list(got.shape)} of "
        f"torch {a.name!r} {list(a.shape)} by {how}, not {words}"
    )


#: the projections a packed attention weight holds, in torch's order (nn.MultiheadAttention's
#: in_proj, Hugging Face's GPT-2 c_attn), and the path segments that name each on the Keras side
_PACKED = ("query", "key", "value")
_NAMES = {
    "query": "query",
    "q_proj": "query",
    "key": "key",
    "k_proj": "key",
    "value": "value",
    "v_proj": "value",
}


def _role(target: str) -> str:
    """The projection a Keras variable's path names (query, key, value), or ""."""
    return next((_NAMES[p] for p in target.split("/") if p in _NAMES), "")


def _heads_order(entry: MapEntry) -> str:
    """A query, key or value projection whose features the converter split into (heads, head
    size) in the other order: Keras's kernel (hidden, heads, head_dim) and bias (heads, head_dim)
    take each head's features as one block, and the learned view reads them head size first."""
    for target, view in zip(entry.targets, entry.views, strict=False):
        role = _role(target)
        if not role or view.shape != view.keras or len(view.shape) not in (2, 3):
            continue
        (heads, size), (s_heads, s_size) = view.shape[-2:], view.strides[-2:]
        if heads > 1 and size > 1 and s_size == heads * s_heads:
            return (
                f"the converter's split of heads: Keras {target!r} {list(view.keras)} takes the "
                f"{role} features of torch {entry.torch!r} as {heads} heads of {size}, each "
                f"head's {size} features one block in torch; the converter reads them head size "
                f"first (reshape to ({size}, {heads}) then transposed) where ({heads}, {size}) "
                "is meant"
            )
    return ""


def _rotary_permutations(size: int) -> dict[str, np.ndarray]:
    """Each head's features as a converter for the other rotary layout reorders them: torch's
    feature at each Keras position (half-split pairs (i, i + size/2), interleaved (2i, 2i + 1))."""
    j, half = np.arange(size), size // 2
    return {
        "evens, then odds": np.where(j < half, 2 * j, 2 * (j - half) + 1),
        "interleaved from both halves": j // 2 + (j % 2) * half,
    }


def _rotary_order(entry: MapEntry) -> str:
    """A query or key projection whose features the converter reordered within each head as a
    rotary embedding of the other layout needs (Meta's interleaved pairs against Hugging Face's
    half-split): the rotary embedding then rotates other pairs of features on the two sides."""
    for target, view in zip(entry.targets, entry.views, strict=False):
        role = _role(target)
        size = view.keras[-1] if view.keras else 0
        if role not in ("query", "key") or size < 4 or size % 2:
            continue
        idx = view.indices()
        rel = idx - idx[..., :1]
        for order, perm in _rotary_permutations(size).items():
            step = int(rel.reshape(-1, size)[0, int(np.argmax(perm == 1))])
            if step and np.array_equal(rel, np.broadcast_to(perm * step, rel.shape)):
                shown = ", ".join(map(str, perm[:4]))
                return (
                    f"the converter's rotary layout: Keras {target!r} {list(view.keras)} takes "
                    f"each head's {size} {role} features of torch {entry.torch!r} reordered "
                    f"({order}: torch's features {shown}, ...), as a converter does for a rotary "
                    f"embedding of the other layout (interleaved pairs (2i, 2i + 1) against "
                    f"half-split (i, i + {size // 2})): the two sides rotate other pairs of "
                    "features. Convert without the reordering (the torch model's rotary layout "
                    "is the Keras model's)"
                )
    return ""


def _packed_order(entry: MapEntry) -> str:
    """A packed q, k, v weight whose thirds the converter gave to the projections in another
    order (the learned map lists each array's variables by where each starts in it)."""
    roles = [_role(target) for target in entry.targets]
    if sorted(roles) != sorted(_PACKED) or tuple(roles) == _PACKED:
        return ""
    swapped = [r for r, want in zip(roles, _PACKED, strict=True) if r != want]
    return (
        f"the converter's split of a packed projection: torch {entry.torch!r} holds query, key, "
        f"value in that order, and the converter gives its thirds to {', '.join(roles)} "
        f"({' and '.join(sorted(swapped))} swapped)"
    )

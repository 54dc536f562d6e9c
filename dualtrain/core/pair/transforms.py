"""The layout transforms of a model pair's weight map (canonical torch layout -> Keras layout):

* ``identity``: biases, batchnorm's four arrays, anything of the same shape;
* ``transpose``: a dense weight (out, in) -> kernel (in, out);
* ``oihw_hwio``: a conv2d weight (O, I, H, W) -> kernel (H, W, I, O);
* ``flatten_chw``: a dense weight after a flatten of a (C, H, W) tensor: torch flattens C,H,W and
  Keras (NHWC) H,W,C, so the kernel's rows are the weight's columns permuted (the map records C,
  H, W, taken from the Keras layer's input);
* ``heads_in``: an attention's input projection, weight (heads x head_dim, E) -> kernel (E, heads,
  head_dim), bias (heads x head_dim,) -> (heads, head_dim): torch's head h takes the features
  h*head_dim .. (h+1)*head_dim - 1 of the projection, Keras's EinsumDense kernel holds them as
  axis 1 and 2 (nn.MultiheadAttention's q/k/v_proj_weight against MultiHeadAttention's query, key
  and value kernels);
* ``heads_out``: the output projection, weight (E, heads x head_dim) -> kernel (heads, head_dim,
  E) (out_proj.weight against the attention_output kernel);
* ``qkv_heads``: one array onto three variables: torch's packed in_proj_weight (3E, E) (or
  in_proj_bias (3E,)) split into its query, key and value rows, in that order, each by
  ``heads_in`` (:func:`to_keras_parts`, :func:`to_canonical_parts`);
* ``view``: a map learned from a converter (model.convert): each target a strided view of the
  array (``MapEntry.views``: any transpose, reshape, split or slice); an array split across
  several variables has each part in its variable's own layout.

The TF backend converts every array with its entry's transform when it loads or exports weights
(:func:`to_keras`, :func:`to_canonical`); :func:`check_identity` holds a map to carrying the
initial weights there and back bit for bit.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from dualtrain.core.pair.record import MapEntry
from dualtrain.errors import UserError

TRANSFORMS = (
    "identity",
    "transpose",
    "oihw_hwio",
    "flatten_chw",
    "heads_in",
    "heads_out",
    "qkv_heads",
)
#: a learned map's transform (model.convert), which no map file writes
VIEW = "view"
#: a split entry's transform: how many parts, and the transform of each part
SPLIT = {"qkv_heads": (3, "heads_in")}


def keras_shape(entry: MapEntry, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The Keras shape ``entry``'s transform makes of a torch array of ``shape`` (None: the
    transform does not apply to that shape)."""
    t = entry.transform
    if t == "identity":
        return shape
    if t == VIEW:
        return entry.views[0].keras if len(entry.views) == 1 else None
    if t == "transpose":
        return (shape[1], shape[0]) if len(shape) == 2 else None
    if t == "oihw_hwio":
        return (shape[2], shape[3], shape[1], shape[0]) if len(shape) == 4 else None
    if t == "flatten_chw":
        if len(shape) != 2 or entry.chw is None or int(np.prod(entry.chw)) != shape[1]:
            return None
        return (shape[1], shape[0])
    h = entry.heads or 0
    if t in ("heads_in", "heads_out") and (not h or len(shape) not in (1, 2) or shape[0] % h):
        return None
    if t == "heads_in":
        return (h, shape[0] // h) if len(shape) == 1 else (shape[1], h, shape[0] // h)
    if t == "heads_out":
        if len(shape) == 1:
            return shape
        return (h, shape[1] // h, shape[0]) if shape[1] % h == 0 else None
    return None


def keras_shapes(entry: MapEntry, shape: tuple[int, ...]) -> tuple[tuple[int, ...], ...] | None:
    """The Keras shape of each of ``entry``'s targets (one, or a split entry's parts) made of a
    torch array of ``shape`` (None: the transform does not apply to that shape)."""
    if entry.transform == VIEW:
        fits = all(v.array == tuple(shape) for v in entry.views)
        return tuple(v.keras for v in entry.views) if fits else None
    if entry.transform not in SPLIT:
        one = keras_shape(entry, shape)
        return None if one is None else (one,)
    n, each = SPLIT[entry.transform]
    if not shape or shape[0] % n or len(entry.targets) != n:
        return None
    part = keras_shape(replace(entry, transform=each), (shape[0] // n, *shape[1:]))
    return None if part is None else (part,) * n


def is_split(entry: MapEntry) -> bool:
    """The entry maps its array onto several variables (each a part)."""
    return len(entry.targets) > 1


def part_entry(entry: MapEntry) -> MapEntry:
    """A split entry's transform for one part (the canonical part: its rows of the array; a
    learned view's part: its elements in the variable's layout)."""
    if entry.transform == VIEW and is_split(entry):
        return replace(entry, transform="identity", views=())
    return (
        replace(entry, transform=SPLIT[entry.transform][1]) if entry.transform in SPLIT else entry
    )


def split_canonical(entry: MapEntry, array: np.ndarray) -> list[np.ndarray]:
    """A split entry's canonical array cut into its parts (q, k, v rows; a learned view's
    elements of each variable), in order."""
    a = np.asarray(array)
    if entry.transform == VIEW:
        flat = np.ascontiguousarray(a).reshape(-1)
        return [np.ascontiguousarray(flat[v.indices()]) for v in entry.views]
    return [np.ascontiguousarray(p) for p in np.split(a, SPLIT[entry.transform][0])]


def join_canonical(entry: MapEntry, parts: list[np.ndarray]) -> np.ndarray:
    """The inverse of :func:`split_canonical`."""
    if entry.transform == VIEW:
        return _scatter(entry, parts)
    return np.ascontiguousarray(np.concatenate([np.asarray(p) for p in parts], axis=0))


def _scatter(entry: MapEntry, parts: list[np.ndarray]) -> np.ndarray:
    """A learned entry's canonical array from its targets' arrays (each element where its view
    takes it from; the views together cover the array once: dualtrain.core.pair.learn)."""
    arrays = [np.asarray(p) for p in parts]
    flat = np.empty(int(np.prod(entry.views[0].array, dtype=np.int64)), dtype=arrays[0].dtype)
    for v, p in zip(entry.views, arrays, strict=True):
        flat[v.indices()] = p.reshape(v.keras)
    return flat.reshape(entry.views[0].array)


def to_keras_parts(entry: MapEntry, array: np.ndarray) -> list[np.ndarray]:
    """The Keras array of each of ``entry``'s targets (a split entry: each part's)."""
    if not is_split(entry):
        return [to_keras(entry, array)]
    each = part_entry(entry)
    return [to_keras(each, p) for p in split_canonical(entry, array)]


def to_canonical_parts(entry: MapEntry, arrays: list[np.ndarray]) -> np.ndarray:
    """The inverse of :func:`to_keras_parts`."""
    if not is_split(entry):
        (one,) = arrays
        return to_canonical(entry, one)
    each = part_entry(entry)
    return join_canonical(entry, [to_canonical(each, a) for a in arrays])


def to_keras(entry: MapEntry, array: np.ndarray) -> np.ndarray:
    a = np.asarray(array)
    t = entry.transform
    if t == VIEW:
        (view,) = entry.views  # a split entry's parts: to_keras_parts
        return np.ascontiguousarray(np.ascontiguousarray(a).reshape(-1)[view.indices()])
    if t == "transpose":
        a = a.T
    elif t == "oihw_hwio":
        a = a.transpose(2, 3, 1, 0)
    elif t == "flatten_chw":
        assert entry.chw is not None
        c, h, w = entry.chw
        a = a.reshape(a.shape[0], c, h, w).transpose(2, 3, 1, 0).reshape(h * w * c, a.shape[0])
    elif t in ("heads_in", "heads_out") or t in SPLIT:
        shape = keras_shape(entry, a.shape)
        if t in SPLIT or shape is None:
            raise ValueError(f"{entry.torch}: {t} does not take an array of shape {a.shape}")
        a = a.reshape(shape) if a.ndim == 1 else a.T.reshape(shape)
    return np.ascontiguousarray(a)


def to_canonical(entry: MapEntry, array: np.ndarray) -> np.ndarray:
    a = np.asarray(array)
    t = entry.transform
    if t == VIEW:
        return _scatter(entry, [a])
    if t == "transpose":
        a = a.T
    elif t == "oihw_hwio":
        a = a.transpose(3, 2, 0, 1)
    elif t == "flatten_chw":
        assert entry.chw is not None
        c, h, w = entry.chw
        out = a.shape[1]
        a = a.reshape(h, w, c, out).transpose(3, 2, 0, 1).reshape(out, c * h * w)
    elif t == "heads_in":
        a = a.reshape(-1) if a.ndim == 2 else a.reshape(a.shape[0], -1).T
    elif t == "heads_out":
        a = a if a.ndim == 1 else a.reshape(-1, a.shape[-1]).T
    elif t in SPLIT:
        raise ValueError(f"{entry.torch}: {t} maps onto several variables (to_canonical_parts)")
    return np.ascontiguousarray(a)


def check_identity(initial: dict[str, np.ndarray], read_back: dict[str, np.ndarray]) -> None:
    """The initial weights, carried into the Keras model by the map and read back, are the same
    bits (the transforms are permutations; an fp64 model widens float32 exactly): checked before
    step 1, so a map that lost or moved a value never trains."""
    for name, a in initial.items():
        b = read_back.get(name)
        if b is None or b.shape != a.shape or not np.array_equal(a.astype(b.dtype), b):
            raise UserError(
                f"model pair: {name} does not come back from the Keras model as it went in "
                f"(the weight map loses or moves values). Received: {name}"
            )

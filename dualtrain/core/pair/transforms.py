"""The layout transforms of a model pair's weight map (canonical torch layout -> Keras layout):

* ``identity``: biases, batchnorm's four arrays, anything of the same shape;
* ``transpose``: a dense weight (out, in) -> kernel (in, out);
* ``oihw_hwio``: a conv2d weight (O, I, H, W) -> kernel (H, W, I, O);
* ``flatten_chw``: a dense weight after a flatten of a (C, H, W) tensor: torch flattens C,H,W and
  Keras (NHWC) H,W,C, so the kernel's rows are the weight's columns permuted (the map records C,
  H, W, taken from the Keras layer's input).

The TF backend converts every array with its entry's transform when it loads or exports weights
(:func:`to_keras`, :func:`to_canonical`); :func:`check_identity` holds a map to carrying the
initial weights there and back bit for bit.
"""

from __future__ import annotations

import numpy as np

from dualtrain.core.pair.record import MapEntry
from dualtrain.errors import UserError

TRANSFORMS = ("identity", "transpose", "oihw_hwio", "flatten_chw")


def keras_shape(entry: MapEntry, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The Keras shape ``entry``'s transform makes of a torch array of ``shape`` (None: the
    transform does not apply to that shape)."""
    t = entry.transform
    if t == "identity":
        return shape
    if t == "transpose":
        return (shape[1], shape[0]) if len(shape) == 2 else None
    if t == "oihw_hwio":
        return (shape[2], shape[3], shape[1], shape[0]) if len(shape) == 4 else None
    if t == "flatten_chw":
        if len(shape) != 2 or entry.chw is None or int(np.prod(entry.chw)) != shape[1]:
            return None
        return (shape[1], shape[0])
    return None


def to_keras(entry: MapEntry, array: np.ndarray) -> np.ndarray:
    a = np.asarray(array)
    t = entry.transform
    if t == "transpose":
        a = a.T
    elif t == "oihw_hwio":
        a = a.transpose(2, 3, 1, 0)
    elif t == "flatten_chw":
        assert entry.chw is not None
        c, h, w = entry.chw
        a = a.reshape(a.shape[0], c, h, w).transpose(2, 3, 1, 0).reshape(h * w * c, a.shape[0])
    return np.ascontiguousarray(a)


def to_canonical(entry: MapEntry, array: np.ndarray) -> np.ndarray:
    a = np.asarray(array)
    t = entry.transform
    if t == "transpose":
        a = a.T
    elif t == "oihw_hwio":
        a = a.transpose(3, 2, 0, 1)
    elif t == "flatten_chw":
        assert entry.chw is not None
        c, h, w = entry.chw
        out = a.shape[1]
        a = a.reshape(h, w, c, out).transpose(3, 2, 0, 1).reshape(out, c * h * w)
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

"""The small real datasets bundled inside scikit-learn's package, as arrays datasets (offline).

``digits`` (1797 8x8 grey images, 0..16, 10 classes), ``wine`` (178 x 13 features, 3 classes),
``breast_cancer`` (569 x 30 features, 2 classes: a binary target), ``diabetes`` (442 x 10 raw
features, a float target: disease progression after one year).

scikit-learn defines no train/test split for them; dualtrain's is fixed and documented: every
fifth sample (rows 4, 9, 14, ...) is a test sample, the rest train, in the package's order. The
arrays are written once into the cache (``$DUALTRAIN_CACHE/bundled/NAME.npz``, importing
scikit-learn costs ~1 s in every worker otherwise) and their content is checked against the
sha256 recorded here, so another scikit-learn release that changed a dataset is an error, never a
silent change of data.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.core.data import arrays as arrays_mod
from dualtrain.core.data.mnist import cache_dir
from dualtrain.errors import UserError

#: content digest (dualtrain.core.data.arrays.digest) of each materialised dataset
CONTENT_SHA256 = {
    "digits": "04b428167a664a9650273a339a26b6a9962b8f97fa4660c933c8d07a142882d9",
    "wine": "467a495790d131d40ba9171163680956f0a2217ed8b13cee63ec06ec42a8d690",
    "breast_cancer": "0bb8edb90d29493184497563829102fcb5503672d22c841cdf2be9ba6881e8ad",
    "diabetes": "d2165c58bd8e193fd093c67c482e7b4e6ffa451c073a24fc88ffd0fd495976ef",
}
TEST_EVERY = 5


def _from_sklearn(name: str) -> dict[str, np.ndarray]:
    try:
        from sklearn import datasets  # lazy: optional (dualtrain[datasets]; ~1 s)
    except ImportError:
        raise UserError(
            f"data.dataset {name} is read from scikit-learn's package: pip install "
            f"'dualtrain[datasets]' (scikit-learn). Received: {name!r}"
        ) from None
    x: np.ndarray
    y: np.ndarray
    if name == "digits":
        b: Any = datasets.load_digits()
        x = b.images.astype(np.uint8).reshape(-1, 1, 8, 8)  # values 0..16, exactly
        y = b.target.astype(np.int64)
    elif name == "wine":
        b = datasets.load_wine()
        x, y = b.data.astype(np.float32), b.target.astype(np.int64)
    elif name == "breast_cancer":
        b = datasets.load_breast_cancer()
        # scikit-learn's target: 0 malignant, 1 benign
        x, y = b.data.astype(np.float32), b.target.astype(np.float32)
    elif name == "diabetes":
        b = datasets.load_diabetes(scaled=False)
        x, y = b.data.astype(np.float32), b.target.astype(np.float32)
    else:  # the spec's vocabulary holds only the names above
        raise ValueError(name)
    test = np.arange(len(y)) % TEST_EVERY == TEST_EVERY - 1
    return {"x_train": x[~test], "y_train": y[~test], "x_test": x[test], "y_test": y[test]}


def cache_path(name: str) -> Path:
    return cache_dir() / "bundled" / f"{name}.npz"


def path(name: str) -> Path:
    """The cache file holding ``name`` as an arrays dataset, written from scikit-learn on first
    use and checked against its pinned content digest."""
    dest = cache_path(name)
    if dest.is_file():
        try:
            if arrays_mod.digest(arrays_mod.read(dest, list(_KEYS))) == CONTENT_SHA256[name]:
                return dest
        except UserError:
            pass
        dest.unlink(missing_ok=True)
    arrays = _from_sklearn(name)
    found = arrays_mod.digest(arrays)
    if found != CONTENT_SHA256[name]:
        raise UserError(
            f"scikit-learn's {name} dataset has content sha256 {found[:12]}..., expected "
            f"{CONTENT_SHA256[name][:12]}... (another scikit-learn release changed it); install "
            f"the tested version (constraints.txt)"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        named: dict[str, Any] = dict(arrays)
        np.savez(f, **named)
    tmp.replace(dest)
    return dest


_KEYS = ("x_train", "y_train", "x_test", "y_test")

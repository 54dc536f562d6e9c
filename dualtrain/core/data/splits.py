"""A run's splits: train, an optional validation split taken from the training rows (by ids, or a
fraction drawn with a seed derived from the run's), test; each a list of row ids into the stored
arrays (:class:`Split`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from dualtrain.core.plan import torch_randperm
from dualtrain.errors import UserError
from dualtrain.spec import DataSpec, Experiment

TRAIN, VALIDATION, TEST = "train", "validation", "test"


@dataclass(frozen=True)
class Split:
    rows: np.ndarray
    """Row ids (int64) into the stored arrays, in the order the split numbers its samples."""
    contiguous: bool = False
    """rows are 0..n-1 (a slice reads them)."""

    def __len__(self) -> int:
        return len(self.rows)


def _validation_rows(d: DataSpec, n: int, seed: int) -> np.ndarray | None:
    if d.validation_ids:
        ids = np.asarray(sorted(d.validation_ids), dtype=np.int64)
        if ids[-1] >= n:
            raise UserError(
                f"data.validation_ids must be rows of the training split (< {n}). Received: "
                f"{int(ids[-1])}"
            )
        return ids
    if d.validation is None:
        return None
    k = int(round(d.validation * n))
    if not 1 <= k < n:
        raise UserError(
            f"data.validation {d.validation} of {n} training samples leaves "
            f"{'no validation' if k < 1 else 'no training'} sample. Received: {d.validation}"
        )
    return np.sort(torch_randperm(n, validation_seed(seed))[:k])


def validation_seed(seed: int) -> int:
    """The seed of the validation permutation (``torch.randperm(n, generator=manual_seed(it))``
    takes its first k ids): derived from the run's seed, apart from the epochs' shuffles."""
    digest = hashlib.sha256(f"dualtrain validation {seed}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def make_splits(spec: Experiment, n_train_all: int, n_test_all: int) -> dict[str, Split]:
    d = spec.data
    for name, limit, size in (
        ("train_limit", d.train_limit, n_train_all),
        ("test_limit", d.test_limit, n_test_all),
    ):
        if limit is not None and limit > size:
            raise UserError(
                f"data.{name} must be <= {size} (the {name.split('_')[0]} split's size). "
                f"Received: {limit}"
            )
    n = d.train_limit or n_train_all
    n_test = d.test_limit or n_test_all
    val = _validation_rows(d, n, spec.seed)
    out: dict[str, Split] = {}
    if val is None:
        out[TRAIN] = Split(np.arange(n, dtype=np.int64), contiguous=True)
    else:
        keep = np.ones(n, dtype=bool)
        keep[val] = False
        out[TRAIN] = Split(np.flatnonzero(keep).astype(np.int64))
        out[VALIDATION] = Split(val)
    out[TEST] = Split(np.arange(n_test, dtype=np.int64), contiguous=True)
    for name, s in out.items():
        if len(s) == 0:
            raise UserError(f"the {name} split has no samples. Received: 0 {name} samples")
    return out

"""Arrays on disk as a dataset: an ``.npz`` file or a folder of ``.npy`` files (docs/data.md).

Keys follow Keras's ``mnist.npz``: ``{name}_train`` and ``{name}_test`` for every model input
``name`` and for the target (``x_train``, ``y_train``, ``x_test``, ``y_test`` for one input named
``x`` and the target ``y``). ``.npy`` files are memory-mapped (a step reads only its rows); an
``.npz`` is read into memory. No pickle is ever loaded (``allow_pickle=False``): an object array is
refused in one line, as is a string array.

The checks here are about the files (present, readable, numeric, finite, consistent row counts);
:mod:`dualtrain.core.data` checks them against the model (shapes, labels, output width).
"""

from __future__ import annotations

import hashlib
import mmap
import zipfile
from pathlib import Path

import numpy as np

from dualtrain.core.data import filekinds
from dualtrain.errors import UserError

SPLITS = ("train", "test")
#: bytes per chunk when a pass reads a whole (possibly memory-mapped) array
CHUNK_BYTES = 16 << 20
#: a memory-mapped array at least this large gives its pages back after every read (:func:`take`)
RELEASE_BYTES = 64 << 20


def keys(inputs: tuple[str, ...], target: str) -> list[str]:
    return [f"{name}_{split}" for split in SPLITS for name in (*inputs, target)]


def _check_array(a: np.ndarray, key: str, where: str) -> None:
    if a.dtype.kind not in "biuf":
        raise UserError(
            f"{where}: {key} must be a numeric array (bool, integer or float). Received: dtype "
            f"{a.dtype}"
        )
    if a.ndim == 0:
        raise UserError(f"{where}: {key} must have one row per sample. Received: a scalar")


def _load_npy(path: Path, key: str) -> np.ndarray:
    try:
        a = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:  # object arrays need pickles
        raise UserError(f"{path}: {key} cannot be read without a pickle ({exc})") from None
    except OSError as exc:
        raise UserError(f"{path}: not a readable .npy file ({exc})") from None
    if not isinstance(a, np.ndarray):  # np.load of a .npy returns an ndarray (a memmap)
        raise UserError(f"{path}: not an .npy file. Received: {type(a).__name__}")
    return a


def read(path: str | Path, names: list[str]) -> dict[str, np.ndarray]:
    """The arrays ``names`` from an .npz file or a folder of .npy files (memory-mapped), checked to
    be present and numeric; a one-line UserError names the first problem."""
    p = Path(path).expanduser()
    where = str(path)
    out: dict[str, np.ndarray] = {}
    if p.is_dir():
        if not any(p.glob("*.npy")):
            raise UserError(filekinds.refusal(p, where, "arrays"))
        missing = [k for k in names if not (p / f"{k}.npy").is_file()]
        if missing:
            have = sorted(f.stem for f in p.glob("*.npy"))
            raise UserError(
                f"{where}: missing {', '.join(k + '.npy' for k in missing)} (the folder has: "
                f"{', '.join(have) or 'no .npy files'}). Received: data.path={where!r}"
            )
        for k in names:
            out[k] = _load_npy(p / f"{k}.npy", k)
    elif p.is_file() and p.suffix == ".npy":
        raise UserError(
            f"data.path is one .npy file; give an .npz file or a folder of .npy files named "
            f"{', '.join(k + '.npy' for k in names)}. Received: data.path={where!r}"
        )
    elif p.is_file():
        if not filekinds.reads(filekinds.file_kind(p), "arrays"):
            raise UserError(filekinds.refusal(p, where, "arrays"))
        try:
            with np.load(p, allow_pickle=False) as z:
                missing = [k for k in names if k not in z.files]
                if missing:
                    raise UserError(
                        f"{where}: missing key {', '.join(missing)} (the file has: "
                        f"{', '.join(z.files) or 'none'}). Received: data.path={where!r}"
                    )
                for k in names:
                    try:
                        out[k] = z[k]
                    except ValueError as exc:
                        raise UserError(
                            f"{where}: {k} cannot be read without a pickle ({exc})"
                        ) from None
        except (OSError, zipfile.BadZipFile, EOFError, TypeError) as exc:
            raise UserError(f"{where}: not a readable .npz file ({exc})") from None
        except ValueError:  # np.load on something that is neither npz nor npy: it tried a pickle
            raise UserError(
                f"{where}: not an .npz file (neither a zip of .npy arrays nor an .npy array); save "
                f"the arrays with numpy.savez. Received: data.path={where!r}"
            ) from None
    else:
        raise UserError(f"data.path does not exist: {p.resolve()}. Received: {where!r}")
    for k, a in out.items():
        _check_array(a, k, where)
    return out


def take(a: np.ndarray, rows: np.ndarray | slice) -> np.ndarray:
    """``a[rows]`` as an in-memory array. A large memory-mapped array then drops its pages from
    this process's mapping (madvise MADV_DONTNEED; they stay in the kernel's page cache), so a
    worker's resident memory holds its batches, not every row an epoch has touched: a dataset
    larger than RAM trains (bench/bench_mmap.py measures it)."""
    out = np.array(a[rows])
    if isinstance(a, np.memmap) and a.nbytes >= RELEASE_BYTES:
        release(a)
    return out


def release(a: np.memmap) -> None:
    mm = getattr(a, "_mmap", None)  # numpy's mmap.mmap behind the memmap (private, stable)
    if mm is not None and hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        mm.madvise(mmap.MADV_DONTNEED)


def row_chunks(a: np.ndarray):
    """Consecutive row ranges of ``a`` of about CHUNK_BYTES each (a pass over a memory-mapped
    array keeps only one chunk in memory)."""
    row = max(1, int(np.prod(a.shape[1:], dtype=np.int64)) * a.dtype.itemsize)
    step = max(1, CHUNK_BYTES // row)
    for s in range(0, a.shape[0], step):
        yield s, min(s + step, a.shape[0])


def check_finite(a: np.ndarray, key: str, where: str) -> None:
    if a.dtype.kind != "f":
        return
    for s, e in row_chunks(a):
        bad = ~np.isfinite(take(a, slice(s, e)))
        if bad.any():
            row = s + int(np.argwhere(bad)[0][0])
            raise UserError(
                f"{where}: {key} holds NaN or inf (first at row {row}); clean the data first. "
                f"Received: {a[row].ravel()[bad[row - s].ravel()][0]!r}"
            )


def digest(arrays: dict[str, np.ndarray]) -> str:
    """sha256 of the content: every array's key, dtype, shape and bytes (C order), keys sorted.
    Memory-mapped arrays are hashed a chunk at a time."""
    h = hashlib.sha256()
    for k in sorted(arrays):
        a = arrays[k]
        h.update(f"{k}|{a.dtype.str}|{a.shape}\n".encode())
        for s, e in row_chunks(a):
            h.update(take(a, slice(s, e)).tobytes())
    return h.hexdigest()

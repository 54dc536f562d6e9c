"""Tables and in-memory data, converted once into dualtrain's cached arrays (docs/data.md).

A table (``dataset: table``) is read and converted (:mod:`dualtrain.core.data.tables`) only the
first time: the arrays go into a folder of ``.npy`` files, the layout ``dataset: arrays`` reads
(memory-mapped), with ``table.json`` beside them (the columns each input took, the class names,
the test split)::

    $DUALTRAIN_CACHE/tables/<the table file's sha256>/<options>/   (default ~/.cache/dualtrain)
        x_train.npy  x_test.npy  y_train.npy  y_test.npy  table.json

``<options>`` is a digest of what else decides the arrays (the model's inputs, data.columns,
data.target, the test table's sha256 or data.test_fraction with the run's seed), so a folder is
never stale: other content or other options are another folder. A folder is written whole into a
temporary folder beside it and renamed into place, so a reader sees all of it or nothing (two
processes converting at once: the first rename wins, the other's copy is removed).

The Python API writes what it is given the same way: a pandas DataFrame under
``frames/<digest>/`` and a dict of NumPy arrays under ``arrays/<digest>/``, the digest that of the
converted arrays (and class names), the run then reading them as ``dataset: arrays``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.core.data import arrays as arrays_mod
from dualtrain.core.data import tables
from dualtrain.core.data.mnist import cache_dir
from dualtrain.errors import UserError
from dualtrain.spec import Experiment

#: what is written beside a converted table's arrays
META_FILE = "table.json"
#: bumped when a conversion would give other arrays for the same table and options
FORMAT = 1


def table_folder(spec: Experiment) -> Path:
    """The cached arrays of ``spec``'s table (data.path, data.test_path), converted on first use."""
    d = spec.data
    assert d.path is not None  # DataSpec requires it for dataset: table
    path = Path(d.path).expanduser()
    test_path = Path(d.test_path).expanduser() if d.test_path else None
    for p, field in ((path, "data.path"), (test_path, "data.test_path")):
        if p is not None and not p.exists():
            raise UserError(f"{field} does not exist: {p.resolve()}. Received: {str(p)!r}")
    layout = tables.Layout.of(spec)
    sha = tables.file_sha256(path)
    test_sha = tables.file_sha256(test_path) if test_path is not None else None
    options = {"format": FORMAT, **layout.options(), "test_sha256": test_sha}
    dest = cache_dir() / "tables" / sha / _digest(options)[:16]
    if (dest / META_FILE).is_file():
        return dest
    frame = tables.read_table(path, d.path)
    test = tables.read_table(test_path, str(d.test_path)) if test_path is not None else None
    conv = tables.convert(frame, test, layout, d.path, str(d.test_path or ""))
    source = {
        "source": Path(d.path).name,
        "sha256": sha,
        "test_source": test_path.name if test_path is not None else None,
        "test_sha256": test_sha,
    }
    return write(dest, conv.arrays, {**source, **conv.meta})


def frame_folder(spec: Experiment, frame: Any, test: Any | None) -> Path:
    """A DataFrame (and a test DataFrame, else data.test_fraction of its rows) converted as a
    table under ``spec`` and written into the cache; its folder."""
    layout = tables.Layout.of(spec)
    conv = tables.convert(frame, test, layout, "the DataFrame", "the test DataFrame")
    meta = {"source": "a pandas DataFrame", "sha256": None, **conv.meta}
    return _content_folder("frames", conv.arrays, meta)


def arrays_folder(given: dict[str, Any]) -> Path:
    """NumPy arrays by key (``x_train``, ...) written into the cache; its folder."""
    out: dict[str, np.ndarray] = {}
    for key, value in given.items():
        a = np.asarray(value)
        if a.dtype.kind not in "biuf":
            raise UserError(
                f"data[{key!r}] must be a numeric array (bool, integer or float). Received: "
                f"dtype {a.dtype}"
            )
        out[str(key)] = np.ascontiguousarray(a)
    return _content_folder("arrays", out, None)


def _content_folder(kind: str, arrays: dict[str, np.ndarray], meta: dict[str, Any] | None) -> Path:
    key = _digest({"arrays": arrays_mod.digest(arrays), "meta": meta})
    dest = cache_dir() / kind / key[:32]
    if dest.is_dir() and (meta is None or (dest / META_FILE).is_file()):
        return dest
    return write(dest, arrays, meta)


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def write(dest: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any] | None) -> Path:
    """``arrays`` as ``dest/KEY.npy`` (and ``meta`` as table.json), all of it or nothing: written
    into a temporary folder beside ``dest``, then renamed into place."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.mkdir()
    try:
        for key, a in arrays.items():
            np.save(tmp / f"{key}.npy", a, allow_pickle=False)
        if meta is not None:
            (tmp / META_FILE).write_text(json.dumps(meta, indent=1) + "\n")
        try:
            tmp.rename(dest)
        except OSError:  # another process renamed its copy first: the same content
            if not dest.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def read_meta(folder: str | Path) -> dict[str, Any] | None:
    """The table.json beside a folder of arrays (a table dualtrain converted), else None (a file
    of that name that dualtrain did not write is not read as one)."""
    p = Path(folder).expanduser() / META_FILE
    try:
        meta = json.loads(p.read_text()) if p.is_file() else None
    except (OSError, ValueError):
        return None
    ours = isinstance(meta, dict) and {"target", "target_key", "inputs"} <= set(meta)
    return meta if ours else None

"""Where the run's data comes from (MNIST, your arrays, your table, a bundled dataset), the stored
arrays read by key (``x_train``, ``y_test``, ...), and their shapes and row counts checked against
the model's inputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.core.data import arrays as arrays_mod
from dualtrain.core.data import bundled, filekinds, mnist, tablecache, tables
from dualtrain.core.data.columns import listed
from dualtrain.errors import UserError
from dualtrain.spec import Dataset, DataSpec, Experiment, ModelSpec


def stored_target(d: DataSpec, inputs: tuple[str, ...]) -> str:
    """The key the target's arrays are stored under: ``data.target`` for arrays, ``y`` otherwise
    (a table's: :func:`dualtrain.core.data.tables.target_key`)."""
    if d.dataset is Dataset.ARRAYS:
        return d.target
    return tables.target_key(inputs) if d.dataset is Dataset.TABLE else "y"


def input_names(spec: Experiment) -> tuple[tuple[str, ...], str]:
    inputs = tuple(i.name for i in spec.model.inputs)
    if spec.data.dataset is Dataset.TABLE:
        return inputs, stored_target(spec.data, inputs)
    if spec.data.dataset is not Dataset.ARRAYS:
        if inputs != ("x",):
            raise UserError(
                f"data.dataset {spec.data.dataset.value} has one input, named x; model.inputs "
                f"names {list(inputs)}. Received: model.inputs"
            )
        if spec.data.dataset is Dataset.MNIST and spec.model.inputs[0].shape != (1, 28, 28):
            raise UserError(
                "data.dataset mnist gives (1, 28, 28) images: model.inputs[x].shape must be "
                f"[1, 28, 28]. Received: {list(spec.model.inputs[0].shape)}"
            )
        return inputs, "y"
    return inputs, spec.data.target


def locate(spec: Experiment) -> str:
    """Where the data comes from (cheap: no decoding), or a UserError."""
    d = spec.data
    if d.dataset is Dataset.MNIST:
        return mnist.locate(d)
    if d.dataset is Dataset.ARRAYS:
        assert d.path is not None  # DataSpec requires it
        if not Path(d.path).expanduser().exists():
            raise UserError(
                f"data.path does not exist: {Path(d.path).expanduser().resolve()}. Received: "
                f"{d.path!r}"
            )
        return f"arrays:{d.path}"
    if d.dataset is Dataset.TABLE:
        for field, given in (("data.path", d.path), ("data.test_path", d.test_path)):
            p = Path(given).expanduser() if given else None
            if p is not None and not p.exists():
                raise UserError(f"{field} does not exist: {p.resolve()}. Received: {given!r}")
            if p is not None and (p.is_dir() or filekinds.file_kind(p) not in tables.TABLE_KINDS):
                raise UserError(filekinds.refusal(p, str(given), "table"))
        return f"table:{d.path}"
    return f"bundled:{d.dataset.value}"


def stamp(spec: Experiment, source: str) -> str:
    """The size and modification time of the files ``source`` reads (your arrays or table): a file
    changed since a check is checked again."""
    kind, _, where = source.partition(":")
    if kind not in ("arrays", "table"):
        return ""
    files: list[Path] = []
    for given in (where, spec.data.test_path if kind == "table" else None):
        if given:
            p = Path(given).expanduser()
            files += sorted(p.glob("*.npy")) if p.is_dir() else [p]
    return ";".join(f"{f}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)


def read_stored(spec: Experiment, source: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The stored arrays by key, and the facts a run records about them: a table's (its
    table.json: source sha256, the columns each input took, the class names)."""
    inputs, target = input_names(spec)
    kind, _, where = source.partition(":")
    keys = arrays_mod.keys(inputs, target)
    if kind == "bundled":
        return arrays_mod.read(bundled.path(where), keys), {}
    if kind in ("arrays", "table"):
        folder = tablecache.table_folder(spec) if kind == "table" else Path(where).expanduser()
        meta = tablecache.read_meta(folder) if folder.is_dir() else None
        facts = {} if meta is None else {"table": {**meta, "cache": str(folder)}}
        return arrays_mod.read(folder if kind == "table" else where, keys), facts
    raw = mnist.read_source(source)
    stored = {
        "x_train": raw["train_images"],
        "y_train": raw["train_labels"],
        "x_test": raw["test_images"],
        "y_test": raw["test_labels"],
    }
    return stored, {}


def check_shapes(
    model: ModelSpec,
    stored: dict[str, np.ndarray],
    target: str,
    where: str,
    columns: dict[str, list[str]] | None = None,
) -> None:
    """Every input's samples of the shape its model input says, one row per sample. ``columns``:
    a table's columns per input (a wrong shape is then said in columns)."""
    for i in model.inputs:
        cols = (columns or {}).get(i.name)
        if cols is not None and len(cols) != int(np.prod(i.shape)):
            raise UserError(
                f"{where} gives input {i.name} {len(cols)} column(s) ({listed(cols, 6)}), "
                f"model.inputs[{i.name}] says shape {list(i.shape)}: give it shape "
                f"[{len(cols)}], or list its columns in data.columns. Received: {len(cols)} "
                "column(s)"
            )
    for split in ("train", "test"):
        n = len(stored[f"{target}_{split}"])
        for i in model.inputs:
            key = f"{i.name}_{split}"
            a = stored[key]
            want = i.shape
            got = tuple(a.shape[1:])
            one_channel = len(want) == 3 and want[0] == 1
            flat = (int(np.prod(want)),)
            ok = got == want or (one_channel and got in (want[1:], flat))
            if not ok:
                raise UserError(
                    f"{where}: {key} has samples of shape {list(got)}, model.inputs[{i.name}] "
                    f"says {list(want)} (images are (N, C, H, W); (N, H, W) or (N, H*W) rows for "
                    f"one channel). Received: {key} {list(a.shape)}"
                )
            if len(a) != n:
                raise UserError(
                    f"{where}: {key} has {len(a)} rows but {target}_{split} has {n}: every input "
                    f"and the target need one row per sample. Received: {len(a)} != {n}"
                )

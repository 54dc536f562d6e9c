"""Data given to the Python API as objects, not paths (docs/python-api.md): a pandas DataFrame
(a table) or a dict of NumPy arrays (``x_train``, ``y_train``, ``x_test``, ``y_test``).

``data=df`` is short for ``data={"dataset": "table", "path": df}`` and ``data={"x_train": ...}``
for ``data={"dataset": "arrays", "path": {...}}``; in a ``data`` dict, ``path`` (and a table's
``test_path``) may be such an object, beside the section's other fields (``target``,
``test_fraction``, ``columns``, ...). The spec is validated first, with the object held aside;
then the object is converted as a table file would be (:mod:`dualtrain.core.data.tables`) and
written into dualtrain's cache under the digest of its content
(:mod:`dualtrain.core.data.tablecache`), and the spec the run records names that folder as
``dataset: arrays`` (a table's class names and columns in its table.json, recorded in the run).
pandas is never imported here: a DataFrame is recognised by the pandas module it came from.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dualtrain.core.data import tablecache, tables
from dualtrain.errors import UserError, shown
from dualtrain.spec import Dataset, DataSpec, Experiment

#: what a held object stands as in the spec while it is validated
HELD = {"frame": "<a pandas DataFrame>", "arrays": "<NumPy arrays>"}


def is_frame(value: Any) -> bool:
    pd = sys.modules.get("pandas")  # a DataFrame's module is loaded already
    return pd is not None and isinstance(value, pd.DataFrame)


def _is_array(value: Any) -> bool:
    np = sys.modules.get("numpy")
    pd = sys.modules.get("pandas")
    return (np is not None and isinstance(value, np.ndarray)) or (
        pd is not None and isinstance(value, pd.Series | pd.DataFrame)
    )


def _is_arrays(value: Any) -> bool:
    """A mapping of arrays by key (``x_train``, ...), not a data section (whose keys are fields)."""
    fields = {f.name for f in dataclasses.fields(DataSpec)}
    return (
        isinstance(value, Mapping)
        and bool(value)
        and all(_is_array(v) for v in value.values())
        and not fields & set(value)
    )


def data_section(value: Any) -> Any:
    """``data=``'s value as a section dict: a DataFrame or a dict of arrays becomes the section's
    ``path``, with the dataset it implies; anything else is left as it is."""
    if is_frame(value):
        return {"dataset": Dataset.TABLE.value, "path": value}
    if _is_arrays(value):
        return {"dataset": Dataset.ARRAYS.value, "path": dict(value)}
    if isinstance(value, Mapping) and "dataset" not in value:
        path = value.get("path")
        if is_frame(path):
            return {**value, "dataset": Dataset.TABLE.value}
        if _is_arrays(path):
            return {**value, "dataset": Dataset.ARRAYS.value}
    return value


def hold(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the spec with placeholders for the objects in data.path and data.test_path, the objects)."""
    data = data_section(raw.get("data"))
    if not isinstance(data, dict):
        if data is not None and not isinstance(data, Mapping):
            raise UserError(
                "data must be a mapping (the data section), a pandas DataFrame or a dict of "
                f"NumPy arrays. Received: {shown(data)}"
            )
        return raw, {}
    held: dict[str, Any] = {}
    for field in ("path", "test_path"):
        value = data.get(field)
        if value is None or isinstance(value, str):
            continue
        if is_frame(value):
            held[field] = value
        elif field == "path" and isinstance(value, dict) and _is_arrays(value):
            held[field] = value
        else:
            raise UserError(
                f"data.{field} takes a path, a pandas DataFrame"
                f"{' or a dict of NumPy arrays' if field == 'path' else ''}. Received: "
                f"{shown(value)}"
            )
    if not held:
        return raw, {}
    kinds = {f: "frame" if is_frame(v) else "arrays" for f, v in held.items()}
    data = {**data, **{f: HELD[k] for f, k in kinds.items()}}
    return {**raw, "data": data}, held


def materialise(spec: Experiment, held: dict[str, Any]) -> Experiment:
    """``spec`` with the held objects written into the cache and named by their folder."""
    if not held:
        return spec
    d = spec.data
    path, test = held.get("path"), held.get("test_path")
    if is_frame(path) and d.dataset is not Dataset.TABLE:
        raise UserError(
            f"a DataFrame is a table: data.dataset table (with data.target, the target column). "
            f"Received: data.dataset {d.dataset.value}"
        )
    if not is_frame(path) and path is not None and d.dataset is not Dataset.ARRAYS:
        raise UserError(
            f"a dict of NumPy arrays is data.dataset arrays. Received: data.dataset "
            f"{d.dataset.value}"
        )
    if test is not None and not is_frame(path):  # a DataFrame's test split beside a file
        raise UserError(
            "data.test_path as a DataFrame goes with data.path as a DataFrame (give the table "
            "as one too). Received: data.path a file"
        )
    if is_frame(path):
        if test is None and d.test_path:  # the test split as a file beside the DataFrame
            test = tables.read_table(Path(d.test_path).expanduser(), d.test_path)
        folder = tablecache.frame_folder(spec, path, test)
        meta = tablecache.read_meta(folder) or {}
        new = dataclasses.replace(
            d,
            dataset=Dataset.ARRAYS,
            path=str(folder),
            target=meta.get("target_key", "y"),
            columns={},
            test_path=None,
            test_fraction=None,
        )
    else:
        assert path is not None  # held: a DataFrame or a dict of arrays
        new = dataclasses.replace(d, path=str(tablecache.arrays_folder(path)))
    return spec.replace(data=new)

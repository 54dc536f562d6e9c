"""Your own table as a dataset (``dataset: table``, docs/data.md): a CSV or Parquet file, or a
pandas DataFrame through the Python API, read with pandas, checked column by column
(:mod:`dualtrain.core.data.columns`) and converted into the arrays dualtrain trains on
(:func:`convert`); :mod:`dualtrain.core.data.tablecache` keeps the result, once, in the cache.

* Every row is a sample; the first row of a CSV names the columns (a header is required).
* The target column is ``data.target``. Integer, bool and float targets are kept (integers as
  int64, floats as float32); text or categorical targets become classes 0..K-1: a pandas
  categorical in its category order, text in sorted order of its values (train and test together),
  the class names recorded beside the arrays and in the run.
* Each model input takes the columns ``data.columns`` lists for it, in that order; with none given
  the model's one input takes every column but the target, in the table's order. Input columns are
  numbers (bool, integer or float, stored as float32: what the model reads); a text, date or
  categorical column is refused, as is a missing value, NaN or inf, naming the column and the row.
* The test split is a second table (``data.test_path``) or ``data.test_fraction`` of the rows, drawn
  by a permutation of a seed derived from the run's (:func:`test_seed`), sorted; the training split
  is the other rows in the table's order. Both backends read the same converted arrays.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.core.data import filekinds
from dualtrain.core.data.columns import encode_target, features, listed, pandas
from dualtrain.core.plan import torch_randperm
from dualtrain.errors import UserError
from dualtrain.spec import Experiment

#: the table kinds :func:`read_table` reads
TABLE_KINDS = ("csv", "tsv", "parquet")


def read_table(path: Path, where: str) -> Any:
    """The table at ``path`` as a DataFrame (its column names as strings);
    any other file is named as what it is, with what to do, in one line."""
    kind = filekinds.file_kind(path)
    if kind not in TABLE_KINDS:
        raise UserError(filekinds.refusal(path, where, "table"))
    pd = pandas()
    try:
        if kind == "parquet":
            frame = pd.read_parquet(path)
        else:
            frame = pd.read_csv(path, sep="\t" if kind == "tsv" else ",")
    except ImportError:
        raise UserError(
            "reading a Parquet table needs pyarrow: pip install 'dualtrain[tables]'. Received: "
            f"data.path={where!r}"
        ) from None
    except (ValueError, OSError) as exc:  # pandas' parser errors are ValueErrors
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{where}: not a readable {kind} table ({reason})") from None
    return named(frame)


def named(frame: Any) -> Any:
    """The frame with its column names as strings (a DataFrame made from an array has 0, 1, ...)."""
    if all(isinstance(c, str) for c in frame.columns):
        return frame
    return frame.set_axis([str(c) for c in frame.columns], axis=1)


def _is_number(name: str) -> bool:
    try:
        float(name)
    except ValueError:
        return False
    return True


def file_sha256(path: Path) -> str:
    """sha256 of the file's bytes, read 1 MiB at a time (what ``sha256sum`` prints)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def test_seed(seed: int) -> int:
    """The seed of the test permutation (``torch.randperm(n)`` with it: the first k rows are the
    test split), derived from the run's seed, apart from the validation split's and the epochs'."""
    digest = hashlib.sha256(f"dualtrain test {seed}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def target_key(inputs: tuple[str, ...]) -> str:
    """The name the target's arrays are stored under (``y_train``, ``y_test``): ``y``, with an
    underscore added while a model input has that name."""
    key = "y"
    while key in inputs:
        key += "_"
    return key


@dataclass(frozen=True)
class Layout:
    """How a table becomes arrays: each model input's columns, the target column, the test split."""

    inputs: tuple[str, ...]
    """The model's inputs, in order."""
    columns: dict[str, list[str]]
    """data.columns: each input's columns (empty: the one input takes every other column)."""
    target: str
    test_fraction: float | None
    seed: int

    @classmethod
    def of(cls, spec: Experiment) -> Layout:
        d = spec.data
        return cls(
            inputs=tuple(i.name for i in spec.model.inputs),
            columns={k: list(v) for k, v in d.columns.items()},
            target=d.target,
            test_fraction=d.test_fraction,
            seed=spec.seed,
        )

    def options(self) -> dict[str, Any]:
        """What decides the arrays besides the tables' content (the cache key)."""
        return {
            "inputs": list(self.inputs),
            "columns": self.columns,
            "target": self.target,
            "test_fraction": self.test_fraction,
            "test_seed": None if self.test_fraction is None else test_seed(self.seed),
        }

    def input_columns(self, names: list[str], where: str) -> dict[str, list[str]]:
        """Each input's columns, checked against the table's column names."""
        if self.target not in names and any(_is_number(n) for n in names):
            raise UserError(
                f"{where} has no column {self.target!r}, and its first row looks like data "
                f"({', '.join(names[:4])}, ...), not column names: a table needs a header row "
                f"naming its columns. Received: data.target={self.target!r}"
            )
        if self.target not in names:
            raise UserError(
                f"{where} has no column {self.target!r} (data.target names the target column); "
                f"its columns: {listed(names)}. Received: data.target={self.target!r}"
            )
        if not self.columns:
            if len(self.inputs) != 1:
                raise UserError(
                    f"model.inputs names {len(self.inputs)} inputs ({', '.join(self.inputs)}): "
                    "data.columns lists each one's columns, e.g. {x: [c1, c2]}. Received: no "
                    "data.columns"
                )
            features = [n for n in names if n != self.target]
            unnamed = [n for n in features if n.startswith("Unnamed: ")]
            if unnamed:
                raise UserError(
                    f"{where}: column {unnamed[0]!r} has no name in the header (a DataFrame's "
                    "index saved with it?): write the table with index=False, or list the input "
                    f"columns in data.columns. Received: columns {listed(names)}"
                )
            return {self.inputs[0]: features}
        extra = sorted(set(self.columns) - set(self.inputs))
        missing = [i for i in self.inputs if i not in self.columns]
        if extra or missing:
            raise UserError(
                f"data.columns must list the columns of every model input "
                f"({', '.join(self.inputs)}). Received: data.columns for "
                f"{', '.join(self.columns) or 'none'}"
            )
        for name, cols in self.columns.items():
            absent = [c for c in cols if c not in names]
            if absent:
                raise UserError(
                    f"{where} has no column {absent[0]!r} (data.columns[{name}]); its columns: "
                    f"{listed(names)}. Received: {absent[0]!r}"
                )
        return {i: self.columns[i] for i in self.inputs}


@dataclass(frozen=True)
class Converted:
    """A table's arrays (``{input}_train``, ``{target key}_test``, ...) and what table.json says
    about them."""

    arrays: dict[str, np.ndarray]
    meta: dict[str, Any]


def convert(
    frame: Any, test: Any | None, layout: Layout, where: str, test_where: str = ""
) -> Converted:
    """The arrays of ``frame`` (and of the test table ``test``, else a test fraction of the rows),
    every column checked; one-line UserErrors name the column and the row."""
    frame = named(frame)
    names = [str(c) for c in frame.columns]
    cols = layout.input_columns(names, where)
    if test is not None:
        test = named(test)
        Layout(layout.inputs, cols, layout.target, None, layout.seed).input_columns(
            [str(c) for c in test.columns], test_where
        )
    for which, w in ((frame, where), (test, test_where)):
        if which is not None and len(which) == 0:
            raise UserError(f"{w} has no rows. Received: a header only")
    y, y_test, classes = encode_target(frame, test, layout.target, where, test_where)
    key = target_key(layout.inputs)
    out: dict[str, np.ndarray] = {}
    if test is None:
        train_rows, test_rows = split_rows(len(frame), layout)
        for name, c in cols.items():
            x = features(frame, c, where)
            out[f"{name}_train"], out[f"{name}_test"] = x[train_rows], x[test_rows]
        out[f"{key}_train"], out[f"{key}_test"] = y[train_rows], y[test_rows]
        test_ids = [int(i) for i in test_rows]
    else:
        for name, c in cols.items():
            out[f"{name}_train"] = features(frame, c, where)
            out[f"{name}_test"] = features(test, c, test_where)
        assert y_test is not None  # encoded with the test table
        out[f"{key}_train"], out[f"{key}_test"] = y, y_test
        test_ids = []
    meta = {
        "rows": len(frame),
        "test_rows": len(test) if test is not None else len(test_ids),
        "columns": names,
        "inputs": cols,
        "target": layout.target,
        "target_key": key,
        "target_dtype": str(frame[layout.target].dtype),
        "class_names": None if classes is None else classes[0],
        "class_order": None if classes is None else classes[1],
        "test_fraction": layout.test_fraction,
        "test_seed": layout.options()["test_seed"],
        "test_ids_sha256": hashlib.sha256(np.asarray(test_ids, "<i8").tobytes()).hexdigest()
        if test is None
        else None,
    }
    return Converted({k: np.ascontiguousarray(v) for k, v in out.items()}, meta)


def split_rows(n: int, layout: Layout) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, test rows) of a table of ``n`` rows under ``data.test_fraction``: the first
    ``round(fraction * n)`` of the seed's permutation, sorted, are the test rows."""
    f = layout.test_fraction
    assert f is not None  # the spec gives a fraction or a test table
    k = int(round(f * n))
    if not 1 <= k < n:
        raise UserError(
            f"data.test_fraction {f} of {n} rows leaves {'no test' if k < 1 else 'no training'} "
            f"row. Received: {f}"
        )
    test_rows = np.sort(torch_randperm(n, test_seed(layout.seed))[:k])
    keep = np.ones(n, dtype=bool)
    keep[test_rows] = False
    return np.flatnonzero(keep), test_rows

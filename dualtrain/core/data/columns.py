"""A table's columns checked and converted (:mod:`dualtrain.core.data.tables` reads and splits
the table): input columns into float32 (numbers only, every value finite), the target column kept
(integers as int64, bools, floats as float32) or, when it is text or a categorical, encoded into
class ids 0..K-1 with its class names. A refusal is one line naming the column, the row and what to
do; pandas is imported on first use (dualtrain[tables]).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dualtrain.errors import UserError


def pandas() -> Any:
    """The pandas module, or a one-line UserError saying how to install it."""
    try:
        import pandas as pd  # lazy: optional (dualtrain[tables]; ~0.25 s to import)
    except ImportError:
        raise UserError(
            "data.dataset table reads CSV and Parquet tables with pandas: pip install "
            "'dualtrain[tables]' (pandas, pyarrow). Received: no module named pandas"
        ) from None
    return pd


def listed(names: list[str], most: int = 12) -> str:
    """Column names for a message: the first ``most``, then how many in all."""
    shown = ", ".join(repr(n) for n in names[:most])
    return shown + (f", ... ({len(names)} in all)" if len(names) > most else "")


def features(frame: Any, cols: list[str], where: str) -> np.ndarray:
    """The columns ``cols`` side by side as float32 (N, F), each checked: numbers, finite."""
    out = np.empty((len(frame), len(cols)), dtype=np.float32)
    for j, c in enumerate(cols):
        out[:, j] = feature(frame[c], c, where)
    return out


def feature(s: Any, col: str, where: str) -> np.ndarray:
    pd = pandas()
    types = pd.api.types
    numeric = types.is_bool_dtype(s.dtype) or (
        types.is_numeric_dtype(s.dtype) and not types.is_complex_dtype(s.dtype)
    )
    if not numeric:
        raise UserError(_not_numbers(s, col, where))
    v = s.to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(v)
    if bad.any():
        row = int(np.argmax(bad))
        what = "a missing value (NaN)" if np.isnan(v[row]) else f"{float(v[row])!r}"
        raise UserError(
            f"{where}: column {col!r} holds {what} at row {row} (rows count from 0 after the "
            "header); clean the data first (drop or fill those rows). Received: "
            f"{int(bad.sum())} such value(s)"
        )
    v32 = v.astype(np.float32)
    over = ~np.isfinite(v32)
    if over.any():
        row = int(np.argmax(over))
        raise UserError(
            f"{where}: column {col!r} holds {v[row]:g} at row {row}, beyond float32 (the inputs' "
            "precision); scale the column first. Received: a value over 3.4e38"
        )
    return v32


def _not_numbers(s: Any, col: str, where: str) -> str:
    pd = pandas()
    dtype = s.dtype
    if isinstance(dtype, pd.CategoricalDtype):
        what, todo = "categories", "encode it as numbers first (one-hot columns, or its codes)"
    elif pd.api.types.is_datetime64_any_dtype(dtype) or pd.api.types.is_timedelta64_dtype(dtype):
        what, todo = "dates or times", "convert it to numbers first (a timestamp, a day of year)"
    else:
        parsed = pd.to_numeric(s, errors="coerce")
        rows = np.flatnonzero((parsed.isna() & s.notna()).to_numpy())
        row = int(rows[0]) if len(rows) else 0
        value = str(s.iloc[row])
        value = value if len(value) <= 40 else value[:37] + "..."
        what = f"text ({value!r} at row {row})"
        todo = (
            "leave it out (list the inputs' columns in data.columns), name it as data.target, "
            "or encode it as numbers first"
        )
    return (
        f"{where}: column {col!r} holds {what}, not numbers (dtype {dtype}); an input column must "
        f"be numeric: {todo}. Received: column {col!r}"
    )


def encode_target(
    frame: Any, test: Any | None, col: str, where: str, test_where: str
) -> tuple[np.ndarray, np.ndarray | None, tuple[list[str], str] | None]:
    """The target column as stored (int64, bool or float32 values; text or a categorical as class
    ids 0..K-1), of the table and the test table, and (class names, their order) when encoded."""
    pd = pandas()
    types = pd.api.types
    parts = [(frame[col], where)] + ([(test[col], test_where)] if test is not None else [])
    for s, w in parts:
        missing = np.flatnonzero(s.isna().to_numpy())
        if len(missing):
            raise UserError(
                f"{w}: the target column {col!r} has a missing value at row {int(missing[0])} "
                "(rows count from 0 after the header); drop or fill those rows. Received: "
                f"{len(missing)} missing"
            )
    dtype = frame[col].dtype
    if isinstance(dtype, pd.CategoricalDtype):
        names = [str(c) for c in dtype.categories]
        codes = [_codes(s, dtype.categories, w, col) for s, w in parts]
        return codes[0], codes[1] if test is not None else None, (names, "category order")
    if types.is_bool_dtype(dtype) or types.is_integer_dtype(dtype) or types.is_float_dtype(dtype):
        kind = "bool" if types.is_bool_dtype(dtype) else "int64"
        kind = "float32" if types.is_float_dtype(dtype) else kind
        out = [_numbers(s, kind, w, col) for s, w in parts]
        return out[0], out[1] if test is not None else None, None
    values = [_text(s, w, col) for s, w in parts]
    names = sorted(set().union(*(set(v) for v in values)))
    codes = [_codes(s, pd.Index(names), w, col) for s, w in parts]
    return codes[0], codes[1] if test is not None else None, (names, "sorted")


def _codes(s: Any, categories: Any, where: str, col: str) -> np.ndarray:
    pd = pandas()
    codes = np.asarray(pd.Categorical(s, categories=categories).codes, dtype=np.int64)
    unknown = np.flatnonzero(codes < 0)
    if len(unknown):
        row = int(unknown[0])
        raise UserError(
            f"{where}: the target {str(s.iloc[row])!r} at row {row} is not one of the training "
            f"table's classes ({listed([str(c) for c in categories], 8)}). Received: column "
            f"{col!r}"
        )
    return codes


def _numbers(s: Any, kind: str, where: str, col: str) -> np.ndarray:
    pd = pandas()
    types = pd.api.types
    if not (types.is_bool_dtype(s.dtype) or types.is_numeric_dtype(s.dtype)):
        raise UserError(
            f"{where}: the target column {col!r} holds {s.dtype}, the training table's numbers; "
            f"give both tables the same kind of target. Received: dtype {s.dtype}"
        )
    if kind == "float32":
        v = s.to_numpy(dtype=np.float64)
        if not np.isfinite(v).all():
            row = int(np.argmax(~np.isfinite(v)))
            raise UserError(
                f"{where}: the target column {col!r} holds {float(v[row])!r} at row {row}; clean "
                "the data first. Received: a value that is not finite"
            )
        return v.astype(np.float32)
    return s.to_numpy(dtype=np.bool_ if kind == "bool" else np.int64)


def _text(s: Any, where: str, col: str) -> set[str]:
    pd = pandas()
    inferred = pd.api.types.infer_dtype(s, skipna=True)
    if inferred != "string":
        raise UserError(
            f"{where}: the target column {col!r} holds {inferred} values (dtype {s.dtype}); a "
            "target is class names (text or a categorical), integer labels or numbers, of one "
            f"kind. Received: {inferred}"
        )
    return set(s.unique())

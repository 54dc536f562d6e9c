"""Data given to the Python API as objects (dualtrain.api.inmemory, docs/python-api.md): a pandas
DataFrame is a table, a dict of NumPy arrays an arrays dataset; both are written into the cache by
content and the spec names that folder. A bad DataFrame, or one given where none is taken, is
refused in one line that never prints the frame. Real runs from a DataFrame:
parity_tests/test_tables.py."""

from __future__ import annotations

import numpy as np
import pytest

import dualtrain
from dualtrain.core import data
from dualtrain.core.data import tablecache
from dualtrain.spec import Dataset

pd = pytest.importorskip("pandas")

MODEL = {
    "inputs": [{"name": "x", "shape": [2]}],
    "preset": None,
    "layers": [{"type": "dense", "units": 3}],
}
TABLE = {"target": "species", "test_fraction": 0.25}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DUALTRAIN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def frame(n=200):
    rng = np.random.default_rng(0)
    return pd.DataFrame(
        {
            "a": rng.normal(size=n),
            "b": rng.normal(size=n),
            "species": [("setosa", "versicolor", "virginica")[i % 3] for i in range(n)],
        }
    )


def test_a_dataframe_is_the_table_a_csv_of_it_is(tmp_path, cache):
    df = frame()
    spec = dualtrain.experiment({"model": MODEL, "data": TABLE}, data=df)
    assert spec.data.dataset is Dataset.ARRAYS and spec.data.target == "y"
    assert spec.data.path is not None and spec.data.path.startswith(str(cache / "frames"))
    meta = tablecache.read_meta(spec.data.path)
    assert meta is not None and meta["class_names"] == ["setosa", "versicolor", "virginica"]
    assert meta["source"] == "a pandas DataFrame"
    # the same table as a CSV file: the same arrays, the same content digest
    df.to_csv(tmp_path / "t.csv", index=False)
    from_csv = dualtrain.experiment(
        {"model": MODEL}, data={"dataset": "table", "path": tmp_path / "t.csv", **TABLE}
    )
    from_frame = data.check(spec)
    assert data.check(from_csv).sha256 == from_frame.sha256
    assert from_frame.class_names == meta["class_names"]  # recorded in the run's data.json
    # the section's fields beside it; the same frame again: the same folder
    again = dualtrain.experiment({"model": MODEL}, data={"path": df, **TABLE})
    assert again.data.path == spec.data.path


def test_numpy_arrays_are_an_arrays_dataset(cache):
    rng = np.random.default_rng(1)
    given = {
        "x_train": rng.normal(size=(30, 2)).astype(np.float32),
        "y_train": np.arange(30) % 3,
        "x_test": rng.normal(size=(9, 2)).astype(np.float32),
        "y_test": np.arange(9) % 3,
    }
    spec = dualtrain.experiment({"model": MODEL}, data=given)
    assert spec.data.dataset is Dataset.ARRAYS
    assert spec.data.path is not None and spec.data.path.startswith(str(cache / "arrays"))
    d = data.check(spec)
    assert d.size(data.TRAIN) == 30 and d.stored["y_test"].tolist() == given["y_test"].tolist()
    with pytest.raises(dualtrain.UserError, match=r"data\['x_train'\] must be a numeric array"):
        dualtrain.experiment({"model": MODEL}, data={**given, "x_train": np.array(["a"] * 30)})


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"seed": "frame"}, "seed must be an integer. Received: a DataFrame of 200 rows x 3 "),
        ({"data": {"path": "frame"}}, "data.dataset table needs one test split"),
        ({"data": {"path": "bad", **TABLE}}, "the DataFrame: column 'color' holds text"),
        ({"data": {"path": "frame", "target": "kind", "test_fraction": 0.2}}, "has no column"),
        ({"data": {"dataset": "arrays", "path": "frame"}}, "a DataFrame is a table: data.dataset"),
        ({"data": {"path": np.zeros(3)}}, "data.path takes a path, a pandas DataFrame or a dict"),
        ({"train": "frame"}, "train must be a mapping. Received: a DataFrame of 200 rows"),
    ],
)
def test_a_bad_dataframe_is_one_line_without_the_frame(tmp_path, kwargs, words):
    df = frame()
    bad = df.assign(color=["red"] * 200)

    def put(value):
        if isinstance(value, dict):
            return {k: put(v) for k, v in value.items()}
        return {"frame": df, "bad": bad}.get(value, value) if isinstance(value, str) else value

    out = tmp_path / "run"
    with pytest.raises(dualtrain.UserError) as err:
        dualtrain.run({"model": MODEL}, "torch", out=out, **put(kwargs))
    message = str(err.value)
    assert words in message and "\n" not in message and len(message) < 600
    assert "setosa" not in message and "red" not in message.replace("'red'", "")
    assert not out.exists()

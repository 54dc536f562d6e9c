"""The data section's table fields (dataset: table; docs/spec.md): a target column, each input's
columns, exactly one test split; refused elsewhere; the spec's plain form round-trips them."""

from __future__ import annotations

import pytest

from dualtrain.errors import UserError
from dualtrain.spec import Dataset, dump_spec, from_dict, load_spec

TABLE = {"dataset": "table", "path": "iris.csv", "target": "species", "test_fraction": 0.2}


def test_a_table_spec_and_its_plain_form(tmp_path):
    spec = from_dict({"data": {**TABLE, "columns": {"x": ["sepal length (cm)", "petal width"]}}})
    d = spec.data
    assert d.dataset is Dataset.TABLE and d.target == "species" and d.test_fraction == 0.2
    assert d.columns == {"x": ["sepal length (cm)", "petal width"]}
    (tmp_path / "s.yaml").write_text(dump_spec(spec))
    assert load_spec(tmp_path / "s.yaml") == spec
    other = from_dict({"data": {**TABLE, "test_fraction": None, "test_path": "test.csv"}})
    assert other.data.test_path == "test.csv"
    # a target column's name need not be an identifier
    assert from_dict({"data": {**TABLE, "target": "Species name"}}).data.target == "Species name"


@pytest.mark.parametrize(
    "data, words",
    [
        ({**TABLE, "test_fraction": None}, "data.dataset table needs one test split"),
        ({**TABLE, "test_path": "t.csv"}, "data.dataset table needs one test split"),
        ({**TABLE, "test_fraction": 1.0}, "data.test_fraction must be a fraction in (0, 1)"),
        ({**TABLE, "path": None}, "data.path must name a .csv or .parquet file"),
        ({**TABLE, "columns": {"x": "a"}}, "data.columns[x] must map a model input to a list"),
        ({**TABLE, "columns": {"x": ["a", "a"]}}, "data.columns[x] names a column twice"),
        ({**TABLE, "columns": {"x": ["species"]}}, "names the target column 'species' as an"),
        ({"test_fraction": 0.2}, "data.test_fraction is only for dataset: table"),
        ({"columns": {"x": ["a"]}}, "data.columns is only for dataset: table"),
        ({"path": "x.npz"}, "data.path is only for dataset: arrays or table"),
        ({"dataset": "arrays", "path": "x.npz", "target": "a b"}, "must be an identifier"),
    ],
)
def test_bad_table_fields_are_one_line(data, words):
    with pytest.raises(UserError) as err:
        from_dict({"data": data})
    assert words in str(err.value) and "\n" not in str(err.value)

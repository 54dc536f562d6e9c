"""Your own table (dataset: table; dualtrain.core.data.tables, columns, tablecache): CSV, TSV and
Parquet read into the same cached arrays once, the test split by a second table or a seeded
fraction, text and categorical targets encoded in a stated order, and every bad table or other
file refused in one line naming the column, the row or the file's kind."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from dualtrain.core import data
from dualtrain.core.data import arrays, tablecache, tables
from dualtrain.core.plan import torch_randperm
from dualtrain.errors import UserError
from dualtrain.spec import from_dict

pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")

RNG = np.random.default_rng(0)
NAMES = ["setosa", "versicolor", "virginica"]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DUALTRAIN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def frame(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "sepal length": rng.normal(5.8, 0.8, n).round(2),
            "sepal width": rng.normal(3.0, 0.4, n).round(2),
            "petal length": rng.integers(1, 7, n),
            "species": [NAMES[i % 3] for i in range(n)][::-1],
        }
    )


def spec_for(path, *, shape=(3,), width=3, loss="cross_entropy", inputs=None, seed=0, **data_):
    fields = {"dataset": "table", "path": str(path), "target": "species", **data_}
    if "test_path" not in fields:
        fields.setdefault("test_fraction", 0.25)
    model = {
        "inputs": inputs or [{"name": "x", "shape": list(shape)}],
        "loss": loss,
        "preset": None,
        "layers": [{"type": "flatten"}, {"type": "dense", "units": width}],
    }
    if inputs and len(inputs) > 1:
        model["layers"] = [{"type": "concat"}, {"type": "dense", "units": width}]
    spec = {"seed": seed, "data": fields, "model": model, "distribution": {"world_size": 2}}
    return from_dict(spec)


def write(tmp_path, df, name="iris.csv"):
    p = tmp_path / name
    if name.endswith(".parquet"):
        df.to_parquet(p, index=False)
    else:
        df.to_csv(p, index=False, sep="\t" if ".tsv" in name else ",")
    return p


def test_csv_tsv_and_parquet_give_the_same_arrays_once_in_the_cache(tmp_path, cache):
    df = frame()
    checked = {}
    for name in ("iris.csv", "iris.tsv", "iris.csv.gz", "iris.parquet"):
        path = write(tmp_path, df, name)
        d = data.check(spec_for(path))
        checked[name] = d
        table = d.facts["table"]
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        assert table["sha256"] == sha and table["source"] == name  # the file's own bytes
        folder = tablecache.table_folder(spec_for(path))
        assert folder.parent == cache / "tables" / sha and table["cache"] == str(folder)
        assert sorted(p.name for p in folder.iterdir()) == [
            "table.json",
            "x_test.npy",
            "x_train.npy",
            "y_test.npy",
            "y_train.npy",
        ]
        assert isinstance(d.stored["x_train"], np.memmap)  # the cached arrays, memory-mapped
    digests = {d.sha256 for d in checked.values()}
    assert len(digests) == 1  # one content, whatever the file format
    d = checked["iris.csv"]
    assert d.class_names == NAMES and d.facts["table"]["class_order"] == "sorted"
    assert d.record()["table"]["class_names"] == NAMES and d.facts["classes"] == 3
    assert d.stored["x_train"].dtype == np.float32 and d.stored["y_train"].dtype == np.int64
    codes = np.array([NAMES.index(s) for s in df["species"]])
    train, test = tables.split_rows(40, tables.Layout.of(spec_for(tmp_path / "iris.csv")))
    assert d.stored["y_test"].tolist() == codes[test].tolist()
    x = df[["sepal length", "sepal width", "petal length"]].to_numpy(np.float32)
    np.testing.assert_array_equal(d.stored["x_train"], x[train])


def test_the_table_is_converted_once(tmp_path, monkeypatch):
    path = write(tmp_path, frame())
    first = data.check(spec_for(path))

    def read_again(*args):
        raise AssertionError("the table was read again")

    monkeypatch.setattr(tables, "read_table", read_again)
    assert data.check(spec_for(path)).sha256 == first.sha256
    # other options are another folder beside the first
    with pytest.raises(AssertionError, match="read again"):
        data.check(spec_for(path, test_fraction=0.5))


def test_the_test_fraction_is_drawn_by_the_seed(tmp_path):
    path = write(tmp_path, frame(n=50))
    layout = tables.Layout.of(spec_for(path, test_fraction=0.2, seed=3))
    train, test = tables.split_rows(50, layout)
    want = np.sort(torch_randperm(50, tables.test_seed(3))[:10])
    assert test.tolist() == want.tolist() and len(train) == 40
    assert np.all(np.diff(train) > 0) and not set(train) & set(test)
    d = data.check(spec_for(path, test_fraction=0.2, seed=3))
    assert d.size(data.TEST) == 10 and d.size(data.TRAIN) == 40
    other = data.check(spec_for(path, test_fraction=0.2, seed=4))
    assert other.sha256 != d.sha256  # another seed, another split: another content
    assert tables.test_seed(3) != tables.test_seed(4)


def test_a_test_table_and_the_class_order(tmp_path):
    train, test = frame(n=30), frame(n=9, seed=1)
    test.loc[0, "species"] = "arctica"  # a class only the test table has still gets an id
    d = data.check(
        spec_for(
            write(tmp_path, train),
            test_path=str(write(tmp_path, test, "test.csv")),
            width=4,
        )
    )
    assert d.class_names == ["arctica", *NAMES] and d.size(data.TEST) == 9
    assert d.stored["y_test"][0] == 0 and d.facts["table"]["test_source"] == "test.csv"
    # a categorical target keeps its category order (unused categories included)
    cat = train.assign(species=pd.Categorical(train["species"], categories=[*NAMES[::-1], "x"]))
    d = data.check(spec_for(write(tmp_path, cat, "cat.parquet"), width=4))
    assert d.class_names == [*NAMES[::-1], "x"]
    assert d.facts["table"]["class_order"] == "category order"


def test_integer_bool_and_float_targets_are_kept(tmp_path):
    df = frame()
    ints = df.assign(species=np.arange(40) % 3)
    d = data.check(spec_for(write(tmp_path, ints, "ints.csv")))
    assert d.class_names is None and d.stored["y_train"].dtype == np.int64
    assert set(d.stored["y_train"].tolist()) == {0, 1, 2}
    floats = df.assign(species=np.linspace(0, 1, 40))
    d = data.check(spec_for(write(tmp_path, floats, "floats.csv"), width=1, loss="mse"))
    assert d.stored["y_train"].dtype == np.float32 and d.class_names is None
    flags = df.assign(species=np.arange(40) % 2 == 0)
    d = data.check(
        spec_for(write(tmp_path, flags, "flags.parquet"), width=1, loss="binary_cross_entropy")
    )
    assert d.stored["y_train"].dtype == np.bool_


def test_columns_choose_each_inputs_columns_in_order(tmp_path):
    df = frame()
    inputs = [
        {"name": "y", "shape": [2], "layers": [{"type": "dense", "units": 4}]},
        {"name": "b", "shape": [1], "layers": [{"type": "dense", "units": 4}]},
    ]
    columns = {"y": ["petal length", "sepal length"], "b": ["sepal width"]}
    d = data.check(spec_for(write(tmp_path, df), inputs=inputs, columns=columns))
    assert d.target_name == "y_" and d.facts["table"]["target_key"] == "y_"  # input y kept
    rows = d.splits[data.TRAIN].rows
    train, _ = tables.split_rows(40, tables.Layout.of(spec_for(tmp_path / "iris.csv")))
    want = df[["petal length", "sepal length"]].to_numpy(np.float32)[train]
    np.testing.assert_array_equal(d.stored["y_train"][rows], want)
    assert d.facts["table"]["inputs"] == columns


def test_pixel_columns_feed_a_one_channel_image(tmp_path):
    df = pd.DataFrame(RNG.integers(0, 255, (20, 4)), columns=["p0", "p1", "p2", "p3"])
    df["species"] = np.arange(20) % 3
    d = data.check(spec_for(write(tmp_path, df), shape=(1, 2, 2)))
    (x,) = d.inputs(data.TRAIN, np.array([0, 1]))
    assert x.shape == (2, 1, 2, 2)


def _bad(tmp_path, case):
    df = frame()
    extra: dict = {}
    if case == "text column":
        df["color"] = [str(i / 4) for i in range(40)]  # numbers but one
        df.loc[3, "color"] = "blue"
    elif case == "categorical column":
        df["color"] = pd.Categorical(["red"] * 40)
    elif case == "date column":
        df["when"] = pd.date_range("2020-01-01", periods=40)
    elif case == "nan":
        df.loc[7, "sepal width"] = np.nan
    elif case == "inf":
        df.loc[9, "sepal length"] = np.inf
    elif case == "missing target":
        df.loc[5, "species"] = None
    elif case == "no target column":
        extra = {"target": "label"}
    elif case == "unknown column":
        extra = {"columns": {"x": ["sepal length", "petal width"]}}
    elif case == "index column":
        df.index = df.index + 100
    elif case == "too small a test fraction":
        extra = {"test_fraction": 0.01}
    elif case == "more classes than outputs":
        df.loc[0, "species"] = "arctica"
    elif case == "wrong width":
        extra = {"columns": {"x": ["sepal length", "sepal width"]}}
    path = tmp_path / "iris.csv"
    if case in ("categorical column", "date column"):  # kinds a CSV cannot carry
        path = tmp_path / "iris.parquet"
        df.to_parquet(path, index=False)
    elif case == "no header":
        df.to_csv(path, index=False, header=False)
    elif case == "index column":
        df.to_csv(path)  # the index saved as a first column without a name
    else:
        df.to_csv(path, index=False)
    return spec_for(path, **extra)


BAD = {
    "text column": "column 'color' holds text ('blue' at row 3), not numbers (dtype",
    "categorical column": "column 'color' holds categories, not numbers (dtype category)",
    "date column": "column 'when' holds dates or times, not numbers",
    "nan": "column 'sepal width' holds a missing value (NaN) at row 7",
    "inf": "column 'sepal length' holds inf at row 9",
    "missing target": "the target column 'species' has a missing value at row 5",
    "no target column": "has no column 'label' (data.target names the target column)",
    "unknown column": "has no column 'petal width' (data.columns[x])",
    "index column": "column 'Unnamed: 0' has no name in the header",
    "no header": "its first row looks like data (5.9, 2.5, 3, setosa, ...), not column names: "
    "a table needs a header row",
    "too small a test fraction": "data.test_fraction 0.01 of 40 rows leaves no test row",
    "more classes than outputs": "the target column 'species' has 4 classes (arctica, setosa,",
    "wrong width": "gives input x 2 column(s) ('sepal length', 'sepal width'), "
    "model.inputs[x] says shape [3]",
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_tables_are_one_line_errors(tmp_path, case):
    spec = _bad(tmp_path, case)
    with pytest.raises(UserError) as err:
        data.check(spec)
    assert BAD[case] in str(err.value) and "\n" not in str(err.value)
    if case == "text column":  # what to do, not only what is wrong
        assert "list the inputs' columns in data.columns" in str(err.value)


def test_a_target_of_mixed_kinds_is_refused(tmp_path):
    df = frame().astype({"species": object})
    df.loc[2, "species"] = 7
    with pytest.raises(UserError, match="the target column 'species' holds mixed-integer values"):
        tables.convert(df, None, tables.Layout.of(spec_for(tmp_path / "x.csv")), "the DataFrame")


@pytest.mark.parametrize(
    "name, content, words",
    [
        ("data.pkl", b"\x80\x04\x95", "is a pickle, which dualtrain never loads"),
        ("model.pt", b"PK\x03\x04rest", "is a PyTorch file (torch.save: a pickle)"),
        ("data.json", b'{"x": [1, 2]}', "is a JSON file: save the data as a CSV or Parquet"),
        ("data.txt", b"a,b\n1,2\n", "is a text file: a CSV table needs the .csv suffix"),
        ("digit.png", b"\x89PNG\r\n\x1a\n", "is an image: stack the images into arrays"),
        ("sheet.xlsx", b"PK\x03\x04rest", "is an Excel workbook: save the sheet as CSV or Parquet"),
        ("data.npz", None, "is an .npz file of arrays: use data.dataset: arrays"),
    ],
)
def test_other_files_as_a_table_are_named(tmp_path, name, content, words):
    path = tmp_path / name
    if content is None:
        np.savez(path, x=np.zeros(2))
    else:
        path.write_bytes(content)
    with pytest.raises(UserError) as err:
        data.check(spec_for(path))
    assert words in str(err.value) and "docs/data.md" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_table_or_other_file_given_as_arrays_is_named(tmp_path):
    path = write(tmp_path, frame())
    spec = from_dict(
        {
            "data": {"dataset": "arrays", "path": str(path)},
            "model": {"inputs": [{"name": "x", "shape": [3]}], "preset": "mlp"},
        }
    )
    with pytest.raises(UserError, match=r"data.path is a CSV table: use data.dataset: table, with"):
        data.check(spec)
    images = tmp_path / "images"
    (images / "cat").mkdir(parents=True)
    (images / "cat" / "0.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(UserError, match=r"is a folder of image folders \(cat/, ...: torchvision"):
        arrays.read(images, ["x_train"])
    (tmp_path / "d.pkl").write_bytes(b"\x80\x04\x95")
    with pytest.raises(UserError, match="is a pickle, which dualtrain never loads"):
        arrays.read(tmp_path / "d.pkl", ["x_train"])


def test_the_cache_is_written_whole_or_not_at_all(tmp_path, monkeypatch, cache):
    dest = cache / "tables" / "abc" / "key"
    a = {"x_train": np.zeros((2, 2), np.float32), "y_train": np.zeros(2, np.int64)}
    saved = []

    def failing_save(path, array, allow_pickle):
        saved.append(path)
        if len(saved) == 2:
            raise OSError(28, "No space left on device")
        np.lib.format.write_array(open(path, "wb"), array, allow_pickle=allow_pickle)

    monkeypatch.setattr(tablecache.np, "save", failing_save)
    with pytest.raises(OSError):
        tablecache.write(dest, a, {"target": "y"})
    assert not dest.exists() and list(dest.parent.iterdir()) == []  # no half-written folder
    monkeypatch.undo()
    monkeypatch.setenv("DUALTRAIN_CACHE", str(cache))
    assert tablecache.write(dest, a, {"target": "y"}) == dest
    # a second writer that finishes later keeps the first one's folder and removes its own copy
    assert tablecache.write(dest, a, {"target": "y"}) == dest
    assert [p.name for p in dest.parent.iterdir()] == ["key"]
    assert json.loads((dest / "table.json").read_text()) == {"target": "y"}


def test_a_table_json_dualtrain_did_not_write_is_not_read(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    for k, v in {"x_train": np.zeros((4, 3)), "y_train": np.arange(4) % 3}.items():
        np.save(folder / f"{k}.npy", v)
        np.save(folder / f"{k.replace('train', 'test')}.npy", v)
    (folder / "table.json").write_text('{"my": "notes"}')
    spec = from_dict(
        {
            "data": {"dataset": "arrays", "path": str(folder)},
            "model": {"inputs": [{"name": "x", "shape": [3]}], "preset": "mlp"},
        }
    )
    d = data.check(spec)
    assert "table" not in d.facts and d.class_names is None

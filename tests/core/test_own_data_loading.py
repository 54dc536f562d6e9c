"""Your own data (dualtrain.core.data): arrays on disk, the bundled datasets, splits, normalisation,
the losses' reference values, and every bad input refused in one line."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from dualtrain.core import data
from dualtrain.core.data import arrays, bundled
from dualtrain.core.losses import reference
from dualtrain.core.plan import torch_randperm
from dualtrain.errors import UserError
from dualtrain.spec import Loss, from_dict

RNG = np.random.default_rng(0)


def table(n_train=40, n_test=10, features=3, classes=3):
    return {
        "x_train": RNG.normal(5.0, 2.0, (n_train, features)).astype(np.float32),
        "y_train": (np.arange(n_train) % classes).astype(np.int64),
        "x_test": RNG.normal(5.0, 2.0, (n_test, features)).astype(np.float32),
        "y_test": (np.arange(n_test) % classes).astype(np.int64),
    }


def spec_for(path, *, shape=(3,), width=3, loss="cross_entropy", data_extra=None, inputs=None):
    model = {
        "inputs": inputs or [{"name": "x", "shape": list(shape)}],
        "loss": loss,
        "preset": None,
        "layers": [{"type": "flatten"}, {"type": "dense", "units": width}],
    }
    return from_dict(
        {
            "data": {"dataset": "arrays", "path": str(path), **(data_extra or {})},
            "model": model,
            "distribution": {"world_size": 2},
        }
    )


def write_npz(tmp_path, arrays_, name="d.npz"):
    p = tmp_path / name
    np.savez(p, **arrays_)
    return p


def write_folder(tmp_path, arrays_, name="d"):
    folder = tmp_path / name
    folder.mkdir()
    for k, v in arrays_.items():
        np.save(folder / f"{k}.npy", v)
    return folder


def test_npz_and_npy_folder_give_the_same_rows_and_digest(tmp_path):
    a = table()
    from_npz = data.check(spec_for(write_npz(tmp_path, a)))
    from_dir = data.check(spec_for(write_folder(tmp_path, a)))
    assert isinstance(from_dir.stored["x_train"], np.memmap)  # memory-mapped, not read
    assert from_npz.sha256 == from_dir.sha256 == arrays.digest(a)
    ids = np.array([7, 3, 31])
    for d in (from_npz, from_dir):
        (x,) = d.inputs(data.TRAIN, ids)
        xt = a["x_train"].astype(np.float64)
        mean, std = xt.mean(0), xt.std(0)  # auto: from the training split
        np.testing.assert_allclose(x, (xt[ids] - mean) / std, rtol=0, atol=1e-6)
        assert x.dtype == np.float32
        assert d.targets(data.TRAIN, ids).tolist() == a["y_train"][ids].tolist()
    # the digest follows the content, not the path: one changed value changes it
    b = {k: v.copy() for k, v in a.items()}
    b["x_test"][0, 0] += 1
    assert data.check(spec_for(write_npz(tmp_path, b, "e.npz"))).sha256 != from_npz.sha256


def test_auto_statistics_per_channel_exclude_the_validation_split(tmp_path):
    images = RNG.integers(0, 256, (50, 3, 4, 4)).astype(np.uint8)
    a = {
        "x_train": images,
        "y_train": np.arange(50) % 10,
        "x_test": images[:5],
        "y_test": np.arange(5),
    }
    spec = spec_for(
        write_npz(tmp_path, a), shape=(3, 4, 4), width=10, data_extra={"validation": 0.2}
    )
    d = data.check(spec)
    val = np.sort(torch_randperm(50, data.validation_seed(0))[:10])
    assert d.splits[data.VALIDATION].rows.tolist() == val.tolist()
    train_rows = np.setdiff1d(np.arange(50), val)
    assert d.splits[data.TRAIN].rows.tolist() == train_rows.tolist()
    t = d.transforms[0]
    x = images[train_rows].astype(np.float64)
    np.testing.assert_allclose(t.mean.ravel(), x.mean(axis=(0, 2, 3)), rtol=1e-6)
    np.testing.assert_allclose(t.std.ravel(), x.std(axis=(0, 2, 3)), rtol=1e-6)
    record = d.record()
    assert record["validation_ids"] == val.tolist() and record["sizes"]["validation"] == 10
    json.dumps(record)  # what data.json holds is JSON
    # explicit ids and given statistics
    spec = spec_for(
        write_npz(tmp_path, a, "b.npz"),
        shape=(3, 4, 4),
        width=10,
        data_extra={
            "validation": [4, 1, 2],
            "stats": [{"input": "x", "mean": [1.0], "std": [2.0]}],
        },
    )
    d = data.check(spec)
    assert d.splits[data.VALIDATION].rows.tolist() == [1, 2, 4]
    (x,) = d.inputs(data.VALIDATION, np.array([0]))
    np.testing.assert_array_equal(x[0], (images[1].astype(np.float32) - 1.0) / 2.0)


def test_images_stored_without_a_channel_axis(tmp_path):
    a = {
        "x_train": RNG.integers(0, 9, (20, 5, 5)).astype(np.uint8),
        "y_train": np.arange(20) % 2,
        "x_test": RNG.integers(0, 9, (4, 5, 5)).astype(np.uint8),
        "y_test": np.arange(4) % 2,
    }
    d = data.check(spec_for(write_npz(tmp_path, a), shape=(1, 5, 5), width=2))
    assert d.inputs(data.TEST, slice(0, 4))[0].shape == (4, 1, 5, 5)


def test_binary_and_regression_targets(tmp_path):
    a = table()
    a["y_train"] = (np.arange(40) % 2).astype(np.float32)
    a["y_test"] = (np.arange(10) % 2).astype(np.float32)
    d = data.check(spec_for(write_npz(tmp_path, a), width=1, loss="binary_cross_entropy"))
    assert d.targets(data.TRAIN, np.arange(3)).shape == (3, 1)
    a["y_train"] = RNG.normal(size=(40, 2)).astype(np.float32)
    a["y_test"] = RNG.normal(size=(10, 2)).astype(np.float32)
    d = data.check(spec_for(write_npz(tmp_path, a, "r.npz"), width=2, loss="mse"))
    assert d.targets(data.TEST, slice(0, 10)).dtype == np.float32


def test_two_named_inputs(tmp_path):
    a = {
        "image_train": RNG.integers(0, 9, (12, 1, 4, 4)).astype(np.uint8),
        "meta_train": RNG.normal(size=(12, 2)).astype(np.float32),
        "y_train": np.arange(12) % 3,
        "image_test": RNG.integers(0, 9, (6, 1, 4, 4)).astype(np.uint8),
        "meta_test": RNG.normal(size=(6, 2)).astype(np.float32),
        "y_test": np.arange(6) % 3,
    }
    spec = from_dict(
        {
            "data": {"dataset": "arrays", "path": str(write_npz(tmp_path, a))},
            "model": {
                "inputs": [
                    {"name": "image", "shape": [1, 4, 4], "layers": [{"type": "flatten"}]},
                    {"name": "meta", "shape": [2], "layers": [{"type": "dense", "units": 4}]},
                ],
                "preset": None,
                "layers": [{"type": "concat"}, {"type": "dense", "units": 3}],
            },
        }
    )
    d = data.check(spec)
    image, meta = d.inputs(data.TRAIN, np.array([2, 5]))
    assert image.shape == (2, 1, 4, 4) and meta.shape == (2, 2)


BAD = {
    "a missing key": (
        lambda a: a.pop("y_test"),
        {},
        "missing key y_test",
    ),
    "shape mismatch between inputs and targets": (
        lambda a: a.update(y_train=a["y_train"][:-1]),
        {},
        "x_train has 40 rows but y_train has 39",
    ),
    "a sample shape the model does not take": (
        lambda a: a.update(x_test=np.zeros((10, 4), np.float32)),
        {},
        "x_test has samples of shape [4], model.inputs[x] says [3]",
    ),
    "training samples of a shape the model does not take": (
        lambda a: a.update(x_train=np.zeros((40, 5), np.float32)),
        {},
        "x_train has samples of shape [5], model.inputs[x] says [3]",
    ),
    "a label out of range for the model's output": (
        lambda a: a["y_train"].__setitem__(3, 7),
        {},
        "label 7 is out of range for the model's 3 outputs",
    ),
    "a negative label": (
        lambda a: a["y_test"].__setitem__(0, -1),
        {},
        "label -1 is out of range",
    ),
    "a NaN": (
        lambda a: a["x_train"].__setitem__((5, 1), np.nan),
        {},
        "x_train holds NaN or inf (first at row 5)",
    ),
    "an inf": (
        lambda a: a["x_test"].__setitem__((2, 0), np.inf),
        {},
        "x_test holds NaN or inf (first at row 2)",
    ),
    # an inf in the training split: its statistics (inf - inf) must not warn before the refusal
    "an inf in the training split": (
        lambda a: a["x_train"].__setitem__((4, 2), np.inf),
        {},
        "x_train holds NaN or inf (first at row 4)",
    ),
    "float labels for cross-entropy": (
        lambda a: a.update(y_train=a["y_train"].astype(np.float32)),
        {},
        "y_train must be integer class labels",
    ),
    "a string array": (
        lambda a: a.update(x_test=np.array([["a", "b", "c"]] * 10)),
        {},
        "x_test must be a numeric array",
    ),
    "a validation split leaving no training sample": (
        lambda a: None,
        {"validation_ids": list(range(40))},
        "the train split has no samples",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("layout", ["npz", "npy"])
def test_bad_arrays_are_one_line_errors(tmp_path, case, layout):
    change, extra, words = BAD[case]
    a = table()
    change(a)
    path = write_npz(tmp_path, a) if layout == "npz" else write_folder(tmp_path, a)
    if layout == "npy" and case == "a missing key":
        words = "missing y_test.npy"
    with warnings.catch_warnings(record=True) as seen, pytest.raises(UserError) as err:
        warnings.simplefilter("always")
        data.check(spec_for(path, data_extra=extra))
    message = str(err.value)
    assert "\n" not in message and words in message, message
    # the refusal is its one line: no NumPy warning from the statistics before it
    assert not [w for w in seen if issubclass(w.category, RuntimeWarning)], seen


def test_object_arrays_are_refused_without_loading_a_pickle(tmp_path):
    a = table()
    a["x_train"] = np.array([{"not": "data"}] * 40, dtype=object)
    for path in (write_npz(tmp_path, a), write_folder(tmp_path, a)):
        with pytest.raises(UserError, match="cannot be read without a pickle"):
            data.check(spec_for(path))


def test_missing_path_and_unreadable_file(tmp_path):
    with pytest.raises(UserError, match=f"data.path does not exist: {tmp_path / 'nope.npz'}."):
        data.check(spec_for(tmp_path / "nope.npz"))
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(UserError, match="not a readable .npz file|not an .npz file"):
        data.check(spec_for(tmp_path / "junk.npz"))


def test_one_npy_file_and_mnist_with_another_shape_are_one_line_errors(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((3, 3), np.float32))
    with pytest.raises(UserError, match="data.path is one .npy file"):
        data.check(spec_for(tmp_path / "x.npy"))
    spec = from_dict({"model": {"inputs": [{"name": "x", "shape": [784]}]}})
    with pytest.raises(UserError, match=r"must be \[1, 28, 28\]"):
        data.open_data(spec)


def test_spec_refuses_bad_data_fields():
    with pytest.raises(UserError, match="data.path must name"):
        from_dict({"data": {"dataset": "arrays"}})
    with pytest.raises(UserError, match="data.validation must be a fraction"):
        from_dict({"data": {"validation": 1.5}})
    with pytest.raises(UserError, match="data.path is only for dataset: arrays"):
        from_dict({"data": {"path": "x.npz"}})
    with pytest.raises(UserError, match="data.normalize: none turns off"):
        from_dict({"data": {"normalize": "none", "stats": [{"mean": [0.0], "std": [1.0]}]}})


@pytest.mark.parametrize("name", sorted(bundled.CONTENT_SHA256))
def test_bundled_datasets_are_pinned_and_cached(tmp_path, monkeypatch, name):
    monkeypatch.setenv("DUALTRAIN_CACHE", str(tmp_path))
    path = bundled.path(name)
    assert path == tmp_path / "bundled" / f"{name}.npz"
    got = arrays.read(path, ["x_train", "y_train", "x_test", "y_test"])
    assert arrays.digest(got) == bundled.CONTENT_SHA256[name]
    n = len(got["y_train"]) + len(got["y_test"])
    assert len(got["y_test"]) == n // 5  # every fifth sample


def test_loss_reference_values():
    z = np.array([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
    per, hit = reference(Loss.CROSS_ENTROPY, z, np.array([0, 2]))
    lse0 = np.log(np.exp(2.0) + 1.0 + np.exp(-1.0))
    np.testing.assert_allclose(per, [lse0 - 2.0, np.log(3.0)])
    assert hit.tolist() == [1.0, 0.0]
    per, hit = reference(Loss.BINARY_CROSS_ENTROPY, np.array([[3.0], [-1.0]]), np.array([1.0, 1.0]))
    np.testing.assert_allclose(per, [np.log1p(np.exp(-3.0)), np.log1p(np.exp(1.0))])
    assert hit.tolist() == [1.0, 0.0]
    per, mae = reference(Loss.MSE, np.array([[1.0, 2.0]]), np.array([[0.0, 4.0]]))
    np.testing.assert_allclose(per, [2.5]) and np.testing.assert_allclose(mae, [1.5])


def test_an_empty_replica_gets_empty_arrays_of_the_right_shape(tmp_path):
    a = table()
    a["y_train"] = RNG.normal(size=40).astype(np.float32)
    a["y_test"] = RNG.normal(size=10).astype(np.float32)
    d = data.check(spec_for(write_npz(tmp_path, a), width=1, loss="mse"))
    none = np.zeros(0, np.int64)
    assert d.targets(data.TRAIN, none).shape == (0, 1)
    assert d.inputs(data.TRAIN, none)[0].shape == (0, 3)

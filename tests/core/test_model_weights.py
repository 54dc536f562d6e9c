import numpy as np
import pytest

from dualtrain.core.model import conv_flatten_shape, param_shapes, resolve
from dualtrain.core.weights import (
    check_layout,
    init_weights,
    initial_weights,
    load_weights,
    save_weights,
    weights_digest,
)
from dualtrain.errors import UserError
from dualtrain.spec import load_spec


def test_mlp_layout_is_torch_sequential():
    shapes = param_shapes(load_spec(None).model)
    assert shapes == {
        "1.weight": (256, 784),
        "1.bias": (256,),
        "3.weight": (128, 256),
        "3.bias": (128,),
        "5.weight": (10, 128),
        "5.bias": (10,),
    }


def test_cnn_shapes_and_flatten():
    model = load_spec(None, ["model.preset=cnn"]).model
    shapes = param_shapes(model)
    assert shapes["0.weight"] == (32, 1, 3, 3)
    assert shapes["3.weight"] == (64, 32, 3, 3)
    # 28 -conv3-> 26 -pool2-> 13 -conv3-> 11 -pool2-> 5: flatten sees (64, 5, 5)
    assert conv_flatten_shape(model) == {"6": (64, 5, 5)}
    assert shapes["7.weight"] == (128, 64 * 5 * 5)


def test_same_padding_keeps_size():
    model = load_spec(
        None,
        [
            "model.preset=null",
            "model.layers=[{type: conv2d, filters: 4, kernel_size: 3, "
            "padding: same}, {type: flatten}, {type: dense, units: 10}]",
        ],
    ).model
    assert resolve(model)[0].out_shape == (4, 28, 28)


@pytest.mark.parametrize(
    "layers, words",
    [
        ("[{type: dense, units: 10}]", "flatten"),
        ("[{type: flatten}, {type: conv2d, filters: 2, kernel_size: 3}]", "C,H,W"),
        ("[{type: conv2d, filters: 2, kernel_size: 3}]", "flat vector"),
        (
            "[{type: conv2d, filters: 2, kernel_size: 40}, {type: flatten}, "
            "{type: dense, units: 10}]",
            "fit",
        ),
    ],
)
def test_bad_stacks(layers, words):
    model = load_spec(None, ["model.preset=null", f"model.layers={layers}"]).model
    with pytest.raises(UserError, match=words):
        resolve(model)


def test_init_is_deterministic_and_torch_distributed():
    model = load_spec(None).model
    a, b = init_weights(model, 0), init_weights(model, 0)
    assert weights_digest(a) == weights_digest(b)
    assert weights_digest(init_weights(model, 1)) != weights_digest(a)
    w = a["1.weight"]
    assert w.dtype == np.float32
    bound = 1 / np.sqrt(784)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.99 * bound
    assert abs(float(w.mean())) < 1e-3


def test_save_load_and_init_from(tmp_path):
    model = load_spec(None).model
    w = init_weights(model, 3)
    save_weights(tmp_path / "w.npz", w)
    back = load_weights(tmp_path / "w.npz")
    assert weights_digest(back) == weights_digest(w)
    spec = load_spec(None, [f"model.init_from={tmp_path / 'w.npz'}"])
    assert weights_digest(initial_weights(spec.model, 0)) == weights_digest(w)
    bad = dict(w)
    bad.pop("1.bias")
    with pytest.raises(UserError, match="missing"):
        check_layout(bad, model)


def test_weights_files_keep_float64_and_store_the_rest_as_float32(tmp_path):
    w = init_weights(load_spec(None).model, 0)
    w64 = {k: v.astype(np.float64) / 3 for k, v in w.items()}
    save_weights(tmp_path / "a.npz", w64)
    back = load_weights(tmp_path / "a.npz")
    assert all(back[k].dtype == np.float64 and np.array_equal(back[k], w64[k]) for k in w)
    save_weights(tmp_path / "b.npz", {k: v.astype(np.float16) for k, v in w.items()})
    assert {v.dtype for v in load_weights(tmp_path / "b.npz").values()} == {np.dtype(np.float32)}
    assert weights_digest(w64) != weights_digest({k: v.astype(np.float32) for k, v in w64.items()})

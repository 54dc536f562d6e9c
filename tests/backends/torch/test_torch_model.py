"""The torch model is the canonical layout: weights in and out unchanged, logits as NumPy
computes."""

from __future__ import annotations

import numpy as np

from dualtrain.backends.torch.model import build_model, export_canonical, load_canonical
from dualtrain.backends.torch.tools import forward_logits
from dualtrain.core.data.dataset import open_data
from dualtrain.core.data.splits import TEST
from dualtrain.core.data.transforms import normalize
from dualtrain.core.weights import init_weights
from dualtrain.spec import load_spec


def test_canonical_round_trip_mlp_and_cnn():
    for preset in ("mlp", "cnn"):
        spec = load_spec(None, [f"model.preset={preset}"])
        w = init_weights(spec.model, 3)
        model = build_model(spec.model)
        load_canonical(model, w)
        back = export_canonical(model)
        assert set(back) == set(w) and all(np.array_equal(back[k], w[k]) for k in w)


def test_forward_logits_equals_numpy_mlp():
    spec = load_spec(None, [])
    w = init_weights(spec.model, 0)
    data = open_data(load_spec(None, ["data.test_limit=16"]))
    images = data.stored["x_test"][:16]
    got = forward_logits(spec, w, data.inputs(TEST, slice(0, 16)))
    h = normalize(images).reshape(16, -1).astype(np.float64)
    for i, relu in ((1, True), (3, True), (5, False)):
        h = h @ w[f"{i}.weight"].T.astype(np.float64) + w[f"{i}.bias"]
        h = np.maximum(h, 0) if relu else h
    assert got.dtype == np.float32 and got.shape == (16, 10)
    np.testing.assert_allclose(got, h, rtol=0, atol=1e-5)


def test_same_padding_conv_keeps_shape():
    spec = load_spec(
        None,
        [
            "model.layers=[{type: conv2d, filters: 4, kernel_size: 3, padding: same},"
            " {type: relu}, {type: flatten}, {type: dense, units: 10}]",
            "model.preset=null",
        ],
    )
    model = build_model(spec.model)
    assert tuple(model.state_dict()["3.weight"].shape) == (10, 4 * 28 * 28)

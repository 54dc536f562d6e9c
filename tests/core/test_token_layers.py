"""The token layer types as dualtrain.spec.layers declares them: shapes, canonical names in
torch's nn.MultiheadAttention layout, initial values, Keras layouts, and the one-line refusals."""

import math

import numpy as np
import pytest

from dualtrain.core.model import keras_layouts, param_shapes, resolve, walk
from dualtrain.core.weights import init_weights
from dualtrain.errors import UserError
from dualtrain.spec.load import from_dict

VIT = [
    {"type": "patches", "size": 7, "dim": 16},
    {"type": "position"},
    {"type": "residual", "body": [{"type": "layernorm"}, {"type": "attention", "heads": 4}]},
    {"type": "dense", "units": 8},
    {"type": "token_pool", "pool": "first"},
    {"type": "dense", "units": 10},
]


def _model(layers, shape=(1, 28, 28)):
    spec = {"inputs": [{"name": "x", "shape": list(shape)}], "preset": None, "layers": layers}
    return from_dict({"model": spec}).model


def test_shapes_and_names_follow_torch():
    m = _model(VIT)
    shapes = {r.prefix: (r.in_shape, r.out_shape) for r in walk(resolve(m))}
    assert shapes["0"] == ((1, 28, 28), (16, 16))  # 4 x 4 patches of 7 x 7, width 16
    assert shapes["3"] == ((16, 16), (16, 8))  # dense per token
    assert shapes["4"] == ((16, 8), (8,))
    p = param_shapes(m)
    assert p["0.weight"] == (16, 1, 7, 7) and p["1.weight"] == (16, 16)
    assert p["2.body.1.in_proj_weight"] == (48, 16) and p["2.body.1.in_proj_bias"] == (48,)
    assert p["2.body.1.out_proj.weight"] == (16, 16) and p["2.body.1.out_proj.bias"] == (16,)
    layouts = keras_layouts(m)
    assert layouts["0.weight"] == "oihw_hwio" and layouts["3.weight"] == "transpose"
    assert layouts["1.weight"] == "identity"  # the position embedding is not a dense weight
    assert layouts["2.body.1.in_proj_weight"] == "identity"  # TF keeps torch's packed layout
    assert layouts["2.body.1.out_proj.weight"] == "transpose"


def test_initial_values_are_torchs():
    w = init_weights(_model(VIT), seed=0)
    d = 16
    xavier = math.sqrt(6.0 / (4 * d))
    assert np.abs(w["2.body.1.in_proj_weight"]).max() <= xavier
    assert np.abs(w["2.body.1.in_proj_weight"]).max() > 0.9 * xavier
    assert not w["2.body.1.in_proj_bias"].any() and not w["2.body.1.out_proj.bias"].any()
    assert np.abs(w["2.body.1.out_proj.weight"]).max() <= 1 / math.sqrt(d)
    assert 0.015 < w["1.weight"].std() < 0.025  # N(0, 0.02^2)
    assert np.abs(w["0.weight"]).max() <= 1 / math.sqrt(49)


@pytest.mark.parametrize(
    "layers, shape, message",
    [
        ([{"type": "patches", "size": 5, "dim": 8}], (1, 28, 28), "must tile the 28x28"),
        ([{"type": "flatten"}, {"type": "attention", "heads": 2}], (1, 28, 28), "needs tokens"),
        (VIT[:1] + [{"type": "attention", "heads": 3}], (1, 28, 28), "heads must divide"),
        (VIT[:1] + [{"type": "batchnorm"}], (1, 28, 28), "for tokens .* use layernorm"),
        (VIT[:1] + [{"type": "dense", "units": 10}], (1, 28, 28), "after a token_pool"),
        (
            [{"type": "dense", "units": 4}, {"type": "embedding", "vocab": 3, "dim": 4}],
            (5,),
            "first",
        ),
        ([{"type": "attention"}], (5,), "needs 'heads'"),
        ([{"type": "token_pool", "pool": "last"}], (5,), "pool"),
        ([{"type": "dense", "units": 4, "heads": 2}], (5,), "takes no 'heads'"),
    ],
)
def test_token_layer_mistakes_are_one_line(layers, shape, message):
    with pytest.raises(UserError, match=message):
        resolve(_model(layers, shape))


def test_embedding_takes_ids_and_aliases_read_framework_names():
    m = _model(
        [
            {"type": "embedding", "vocab": 12, "dim": 8},
            {"type": "MultiheadAttention", "heads": 2, "causal": True},
            {"type": "token_pool", "pool": "cls"},
            {"type": "dense", "units": 2},
        ],
        shape=(10,),
    )
    assert [r.out_shape for r in resolve(m)] == [(10, 8), (10, 8), (8,), (2,)]
    assert m.layers[2].pool.value == "first" and m.layers[1].causal is True

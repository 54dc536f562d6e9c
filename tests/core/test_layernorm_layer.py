"""The layernorm layer type: torch's nn.LayerNorm over a feature vector (eps 1e-5 by default,
elementwise weight 1 and bias 0 at the start, no random draw), named as Keras names it too;
refused where its input is not a feature vector."""

import numpy as np
import pytest

from dualtrain.core.model import resolve
from dualtrain.core.weights import init_weights
from dualtrain.errors import UserError
from dualtrain.spec.load import from_dict


def _model(layers, shape=(4,)):
    spec = {"inputs": [{"name": "x", "shape": list(shape)}], "preset": None, "layers": layers}
    return from_dict({"model": spec}).model


def test_layernorm_normalises_features_with_torch_defaults():
    m = _model(
        [
            {"type": "dense", "units": 6},
            {"type": "LayerNormalization"},
            {"type": "dense", "units": 2},
        ]
    )
    ln = resolve(m)[1]
    assert ln.spec.eps == 1e-5 and ln.out_shape == (6,)
    assert ln.params == (("1.weight", (6,)), ("1.bias", (6,)))
    w = init_weights(m, seed=0)
    assert np.array_equal(w["1.weight"], np.ones(6, np.float32))
    assert np.array_equal(w["1.bias"], np.zeros(6, np.float32))
    # the dense layers' draws are those of the same model without the layernorm
    plain = init_weights(_model([{"type": "dense", "units": 6}, {"type": "dense", "units": 2}]), 0)
    assert np.array_equal(w["0.weight"], plain["0.weight"])


@pytest.mark.parametrize(
    "layers, shape, message",
    [
        ([{"type": "layernorm"}], (1, 8, 8), r"last axis of a flat \(F,\) or tokens"),
        ([{"type": "layernorm", "eps": 0.0}], (4,), "layernorm.eps must be > 0"),
        ([{"type": "layernorm", "momentum": 0.1}], (4,), "takes no 'momentum'"),
    ],
)
def test_layernorm_mistakes_are_one_line(layers, shape, message):
    with pytest.raises(UserError, match=message):
        resolve(_model(layers, shape))


def test_gelu_form_is_exact_unless_tanh_is_asked_for():
    m = _model([{"type": "gelu"}, {"type": "gelu", "approximate": "tanh"}])
    assert [layer.approximate.value for layer in m.layers] == ["none", "tanh"]
    with pytest.raises(UserError, match="takes no 'approximate'"):
        _model([{"type": "relu", "approximate": "tanh"}])
    with pytest.raises(UserError, match="approximate"):
        _model([{"type": "gelu", "approximate": "sigmoid"}])

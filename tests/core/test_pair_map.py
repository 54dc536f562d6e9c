"""The model pair's weight map (dualtrain.core.pair), framework-free: the layout transforms are
exact permutations that make a dense or conv layer compute the same thing in both layouts, the
automatic map pairs layers by order and kind and names what does not fit, an explicit map is
checked entry by entry, and the spec takes a pair or dualtrain's layers, never both."""

from __future__ import annotations

import numpy as np
import pytest

from dualtrain.core import pair
from dualtrain.errors import UserError
from dualtrain.spec import from_dict

RNG = np.random.default_rng(0)


def test_dense_after_flatten_computes_the_same_in_both_layouts():
    # torch flattens (C, H, W), Keras (H, W, C): the flatten_chw kernel makes the dense layers agree
    c, h, w, out = 3, 4, 5, 7
    x = RNG.normal(size=(2, c, h, w))
    weight = RNG.normal(size=(out, c * h * w))
    e = pair.MapEntry("fc.weight", "fc/kernel", "flatten_chw", (c, h, w))
    kernel = pair.to_keras(e, weight)
    torch_out = x.reshape(2, -1) @ weight.T
    keras_out = x.transpose(0, 2, 3, 1).reshape(2, -1) @ kernel
    np.testing.assert_allclose(keras_out, torch_out, rtol=1e-12)
    assert np.array_equal(pair.to_canonical(e, kernel), weight)
    # the plain transpose does not: the test above can fail
    wrong = pair.to_keras(pair.MapEntry("fc.weight", "fc/kernel", "transpose"), weight)
    assert not np.allclose(x.transpose(0, 2, 3, 1).reshape(2, -1) @ wrong, torch_out)


@pytest.mark.parametrize(
    "transform,shape",
    [("identity", (5,)), ("transpose", (3, 4)), ("oihw_hwio", (8, 3, 3, 2))],
)
def test_transforms_round_trip_bit_identically(transform, shape):
    a = RNG.normal(size=shape).astype(np.float32)
    e = pair.MapEntry("t", "k", transform)
    k = pair.to_keras(e, a)
    assert k.shape == pair.keras_shape(e, shape)
    assert np.array_equal(pair.to_canonical(e, k), a)


def _torch(*arrays):
    return pair.Side("t:f", "T", (10,), torch=tuple(pair.TorchArray(*a) for a in arrays))


def _keras(*variables):
    return pair.Side("k:f", "K", (10,), keras=tuple(pair.KerasVar(*v) for v in variables))


CONV_T = [
    ("conv.weight", (4, 1, 3, 3), True, "conv", "conv2d", "Conv2d"),
    ("conv.bias", (4,), True, "conv", "conv2d", "Conv2d"),
]
FC_T = [
    ("fc.weight", (10, 64), True, "fc", "dense", "Linear"),
    ("fc.bias", (10,), True, "fc", "dense", "Linear"),
]
CONV_K = [
    ("c/kernel", (3, 3, 1, 4), True, "c", "conv2d", "kernel", "Conv2D"),
    ("c/bias", (4,), True, "c", "conv2d", "bias", "Conv2D"),
]
FC_K = [
    ("d/kernel", (64, 10), True, "d", "dense", "kernel", "Dense", (4, 4, 4)),
    ("d/bias", (10,), True, "d", "dense", "bias", "Dense"),
]


def test_automatic_map_pairs_layers_in_order_with_their_transforms():
    layout = pair.layout(_torch(*CONV_T, *FC_T), _keras(*CONV_K, *FC_K), None)
    got = {e.torch: (e.keras, e.transform, e.chw) for e in layout.entries}
    assert got == {
        "conv.weight": ("c/kernel", "oihw_hwio", None),
        "conv.bias": ("c/bias", "identity", None),
        "fc.weight": ("d/kernel", "flatten_chw", (4, 4, 4)),
        "fc.bias": ("d/bias", "identity", None),
    }
    assert pair.Layout.from_json(layout.to_json()) == layout  # the run's record reads back


def test_a_bias_on_one_side_only_is_named():
    with pytest.raises(UserError, match="missing or extra bias"):
        pair.layout(_torch(CONV_T[0], *FC_T), _keras(*CONV_K, *FC_K), None)


def test_a_layer_missing_from_the_port_is_named():
    with pytest.raises(UserError, match="'fc' has no counterpart"):
        pair.layout(_torch(*CONV_T, *FC_T), _keras(*CONV_K), None)


def test_shapes_no_transform_explains_are_refused():
    k = [("d/kernel", (32, 10), True, "d", "dense", "kernel", "Dense"), FC_K[1]]
    with pytest.raises(UserError, match="cannot map onto Keras d/kernel"):
        pair.layout(_torch(*CONV_T, *FC_T), _keras(*CONV_K, *k), None)


def _map(tmp_path, entries):
    import json

    p = tmp_path / "map.json"
    p.write_text(json.dumps(entries))
    return str(p)


FULL = [
    {"torch": "conv.weight", "keras": "c/kernel", "transform": "oihw_hwio"},
    {"torch": "conv.bias", "keras": "c/bias"},
    {"torch": "fc.weight", "keras": "d/kernel", "transform": "flatten_chw", "chw": [4, 4, 4]},
    {"torch": "fc.bias", "keras": "d/bias"},
]


@pytest.mark.parametrize(
    "case,match",
    [
        ("leaves one out", "leaves torch fc.bias out"),
        ("two onto one", "maps torch conv.bias more than once"),
        ("reshape", "a reshape dualtrain cannot justify"),
        ("unknown", "no such array in the torch model"),
        ("transform", "transform must be one of"),
    ],
)
def test_explicit_map_mistakes_are_one_line(tmp_path, case, match):
    entries = [dict(e) for e in FULL]
    if case == "leaves one out":
        entries.pop()
    elif case == "two onto one":
        entries.append(dict(entries[1]))
    elif case == "reshape":
        entries[2]["transform"] = "identity"  # (10, 64) onto (64, 10)
    elif case == "unknown":
        entries[0]["torch"] = "conv2.weight"
    else:
        entries[0]["transform"] = "hwio"
    with pytest.raises(UserError, match=match):
        pair.layout(_torch(*CONV_T, *FC_T), _keras(*CONV_K, *FC_K), _map(tmp_path, entries))


def test_explicit_map_is_used_as_given(tmp_path):
    layout = pair.layout(_torch(*CONV_T, *FC_T), _keras(*CONV_K, *FC_K), _map(tmp_path, FULL))
    assert layout.explicit and layout.by_torch()["fc.weight"].chw == (4, 4, 4)


@pytest.mark.parametrize(
    "model,match",
    [
        ({"torch": "m:f"}, "needs model.torch and model.keras .* or model.torch and model.conv"),
        ({"convert": "c:f"}, "Received: only model.convert"),
        ({"torch": "m:f", "keras": "k:f", "convert": "c:f"}, "keras .* or model.convert .*both"),
        ({"torch": "m:f", "convert": "c:f", "weight_map": "m.yaml"}, "learns the map"),
        ({"torch": "m:f", "convert": "c.f"}, "model.convert must be 'package.module:factory'"),
        ({"torch": "m:f", "keras": "k:f", "preset": "mlp"}, "not both"),
        ({"torch": "m.f", "keras": "k:f"}, "must be 'package.module:factory'"),
        ({"preset": "mlp", "args": {"width": 3}}, "model.args is for a model pair"),
    ],
)
def test_spec_takes_a_pair_or_layers(model, match):
    with pytest.raises(UserError, match=match):
        from_dict({"model": model})


def test_spec_with_a_pair_keeps_its_args():
    spec = from_dict({"model": {"torch": "m:f", "keras": "k:g", "args": {"width": 4}}})
    assert spec.model.is_pair and spec.model.args == {"width": 4}
    assert "layers" not in spec.to_dict()["model"]
    assert "torch" not in from_dict({}).to_dict()["model"]  # dualtrain's layers: no pair fields
    converted = from_dict({"model": {"torch": "m:f", "convert": "c:g"}}).model
    assert converted.is_pair and converted.keras is None
    assert converted.keras_side == "model.convert='c:g'"


def test_the_locator_tells_activations_apart():
    from dualtrain.core.locate import mistakes as locate

    x = np.linspace(-4.0, 4.0, 81)
    for name, fn in locate.ACTIVATIONS.items():
        assert locate.classify(fn(x))[0] == name
    # the two gelus differ by up to ~1e-3 on the probe: never taken for each other
    tanh_form = locate.ACTIVATIONS["gelu (tanh approximation)"](x)
    assert locate.classify(tanh_form + 1e-5)[0] == "other"


def test_locator_counts_an_exact_match_as_a_match():
    # rel() is 0.0 for identical arrays: a falsy value that must still mean "the same"
    from dualtrain.core.locate import mistakes as locate

    a = np.arange(6.0)
    assert locate.close(a, a.copy())
    assert not locate.close(a, a + 1e-6) and not locate.close(a, None)


def test_a_learned_map_takes_only_the_port_it_was_learned_on():
    # a map learned from a converter (fc.weight a transposed view), and the port built again from
    # its config: the same variables take it; one with a variable more (KerasHub's Llama, whose
    # get_config loses tie_word_embeddings, comes back with reverse_embeddings) is one line
    view = pair.ViewOf(0, (64, 10), (1, 64), (64, 10), (10, 64))
    learned = (
        pair.MapEntry("fc.weight", "d/kernel", "view", views=(view,)),
        pair.MapEntry("fc.bias", "d/bias", "identity"),
    )
    layout = pair.layout(_torch(*FC_T), _keras(*FC_K), None, learned)
    assert layout.learned and layout.by_torch()["fc.weight"].transform == "view"
    w = np.arange(640.0).reshape(10, 64)
    assert np.array_equal(pair.to_keras(layout.by_torch()["fc.weight"], w), w.T)
    extra = ("d/reverse", (10, 64), True, "d", "dense", "reverse", "Dense")
    with pytest.raises(UserError, match=r"built again from its config .*\(new: \['d/reverse'\]"):
        pair.layout(_torch(*FC_T), _keras(*FC_K, extra), None, learned)

"""A split map entry on the TF side (dualtrain.backends.tf.pair): torch's packed in_proj_weight is
three Keras variables, one engine name each (``NAME#0`` .. ``#2``); weights, gradients and
optimizer slots go back to the canonical packed array by :func:`canonical` (joined in part order)
and come in by :func:`engine_names` (split), bit for bit, and a canonical array is never split by
a map that does not split it."""

import numpy as np

from dualtrain.core import pair

E, H = 8, 2
Q = ("a/query/kernel", "a/key/kernel", "a/value/kernel")


def _layout() -> pair.Layout:
    t = pair.Side(
        "t:f",
        "T",
        (10,),
        torch=(
            pair.TorchArray("attn.in_proj_weight", (3 * E, E), True, "attn", "attention", "", H),
            pair.TorchArray("head.weight", (10, E), True, "head", "dense", "Linear"),
        ),
    )
    entries = (
        pair.MapEntry("attn.in_proj_weight", Q, "qkv_heads", heads=H),
        pair.MapEntry("head.weight", "head/kernel", "transpose"),
    )
    return pair.Layout(t, pair.Side("k:f", "K", (10,)), entries)


def test_parts_join_into_the_canonical_array_and_split_back():
    from dualtrain.backends.tf.mapping import PairConversion, canonical, engine_names

    conv = PairConversion(_layout())
    rng = np.random.default_rng(0)
    w, head = rng.normal(size=(3 * E, E)), rng.normal(size=(10, E))
    parts = engine_names(conv, {"attn.in_proj_weight": w, "head.weight": head})
    assert list(parts) == [
        "attn.in_proj_weight#0",
        "attn.in_proj_weight#1",
        "attn.in_proj_weight#2",
        "head.weight",
    ]
    keras = [(n, conv.to_keras(n, a, "float64")) for n, a in parts.items()]
    assert [k.shape for _, k in keras] == [(E, H, E // H)] * 3 + [(E, 10)]
    back = canonical(conv, keras)
    assert list(back) == ["attn.in_proj_weight", "head.weight"]
    assert np.array_equal(back["attn.in_proj_weight"], w) and np.array_equal(
        back["head.weight"], head
    )
    # the check fails on a defect of its class: the parts joined in another order
    swapped = canonical(conv, [keras[1], keras[0], keras[2], keras[3]])
    assert not np.array_equal(swapped["attn.in_proj_weight"], w)

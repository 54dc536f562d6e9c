"""Attention in a model pair's weight map (dualtrain.core.pair), framework-free: torch's packed
in_proj_weight (3E, E) and in_proj_bias (3E,) split onto Keras's query, key and value kernels
(E, heads, head_dim) and biases (heads, head_dim), out_proj.weight (E, E) onto the output kernel
(heads, head_dim, E); the layouts compute what torch computes, come back bit for bit, and a shape
no layout explains is one line naming the setting that makes it."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from dualtrain.core import pair
from dualtrain.errors import UserError

RNG = np.random.default_rng(0)
E, H = 12, 3
D = E // H
QKV = ("a/query/kernel", "a/key/kernel", "a/value/kernel")
QKV_B = ("a/query/bias", "a/key/bias", "a/value/bias")


def _in_proj() -> tuple[pair.MapEntry, pair.MapEntry]:
    return (
        pair.MapEntry("attn.in_proj_weight", QKV, "qkv_heads", heads=H),
        pair.MapEntry("attn.in_proj_bias", QKV_B, "qkv_heads", heads=H),
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_packed_projection_round_trips_bit_for_bit(dtype):
    w, b = RNG.normal(size=(3 * E, E)).astype(dtype), RNG.normal(size=3 * E).astype(dtype)
    ew, eb = _in_proj()
    kernels, biases = pair.to_keras_parts(ew, w), pair.to_keras_parts(eb, b)
    assert [k.shape for k in kernels] == [(E, H, D)] * 3 == list(pair.keras_shapes(ew, w.shape))
    assert [k.shape for k in biases] == [(H, D)] * 3 == list(pair.keras_shapes(eb, b.shape))
    assert np.array_equal(pair.to_canonical_parts(ew, kernels), w)
    assert np.array_equal(pair.to_canonical_parts(eb, biases), b)
    # each part alone, as the TF side converts its variables (and their optimizer slots)
    for i, (part, kernel) in enumerate(zip(pair.split_canonical(ew, w), kernels, strict=True)):
        assert np.array_equal(part, w[i * E : (i + 1) * E])
        assert np.array_equal(pair.to_canonical(pair.part_entry(ew), kernel), part)
    out = pair.MapEntry("attn.out_proj.weight", "a/attention_output/kernel", "heads_out", heads=H)
    wo = RNG.normal(size=(E, E)).astype(dtype)
    assert pair.to_keras(out, wo).shape == (H, D, E)
    assert np.array_equal(pair.to_canonical(out, pair.to_keras(out, wo)), wo)


def _torch_attention(x, w, b, wo, bo):
    """nn.MultiheadAttention's forward (F.multi_head_attention_forward), self-attention."""
    n, t, _ = x.shape
    q, k, v = np.split(x @ w.T + b, 3, axis=-1)
    q, k, v = (a.reshape(n, t, H, D).transpose(0, 2, 1, 3) for a in (q, k, v))
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3).reshape(n, t, E) @ wo.T + bo


def _keras_attention(x, kernels, biases, ko, bo):
    """Keras's MultiHeadAttention: EinsumDense projections, scores over the key axis."""
    q, k, v = (
        np.einsum("abc,cde->abde", x, kk) + bb for kk, bb in zip(kernels, biases, strict=True)
    )
    s = np.einsum("aecd,abcd->acbe", k, q / np.sqrt(D))
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("abcd,cde->abe", np.einsum("acbe,aecd->abcd", p, v), ko) + bo


def test_the_layouts_make_keras_attention_compute_torchs():
    x = RNG.normal(size=(2, 5, E))
    w, b = RNG.normal(size=(3 * E, E)), RNG.normal(size=3 * E)
    wo, bo = RNG.normal(size=(E, E)), RNG.normal(size=E)
    ew, eb = _in_proj()
    out = pair.MapEntry("o", "k", "heads_out", heads=H)
    want = _torch_attention(x, w, b, wo, bo)
    got = _keras_attention(
        x, pair.to_keras_parts(ew, w), pair.to_keras_parts(eb, b), pair.to_keras(out, wo), bo
    )
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # the check fails on a defect of its class: the heads laid out (head_dim, heads)
    dh = [k.reshape(E, D, H).transpose(0, 2, 1) for k in pair.to_keras_parts(ew, w)]
    wrong = _keras_attention(x, dh, pair.to_keras_parts(eb, b), pair.to_keras(out, wo), bo)
    assert not np.allclose(wrong, want)


def test_a_shape_the_transform_cannot_make_is_refused():
    ew, _ = _in_proj()
    assert pair.keras_shapes(ew, (3 * E + 1, E)) is None  # not three equal parts
    assert pair.keras_shapes(pair.MapEntry("w", QKV[:2], "qkv_heads", heads=H), (3 * E, E)) is None
    assert pair.keras_shape(pair.MapEntry("w", "k", "heads_in", heads=5), (E, E)) is None
    with pytest.raises(ValueError, match="heads_in does not take an array of shape"):
        pair.to_keras(pair.MapEntry("w", "k", "heads_in", heads=5), np.zeros((E, E)))


def _torch(*arrays):
    return pair.Side("t:f", "T", (10,), torch=tuple(pair.TorchArray(*a) for a in arrays))


def _keras(*variables):
    return pair.Side("k:f", "K", (10,), keras=tuple(pair.KerasVar(*v) for v in variables))


MHA_T = [
    ("attn.in_proj_weight", (3 * E, E), True, "attn", "attention", "MultiheadAttention", H),
    ("attn.in_proj_bias", (3 * E,), True, "attn", "attention", "MultiheadAttention", H),
    ("attn.out_proj.weight", (E, E), True, "attn.out_proj", "dense", "Linear", H),
    ("attn.out_proj.bias", (E,), True, "attn.out_proj", "dense", "Linear", H),
]


def _mha_k(key_dim=D, heads=H):
    out = []
    for p in ("query", "key", "value"):
        out += [
            (f"a/{p}/kernel", (E, heads, key_dim), True, f"a/{p}", "attention", "kernel"),
            (f"a/{p}/bias", (heads, key_dim), True, f"a/{p}", "attention", "bias"),
        ]
    return out + [
        (
            "a/attention_output/kernel",
            (heads, key_dim, E),
            True,
            "a/attention_output",
            "attention",
            "kernel",
        ),
        ("a/attention_output/bias", (E,), True, "a/attention_output", "attention", "bias"),
    ]


def test_automatic_map_splits_the_packed_projection():
    layout = pair.layout(_torch(*MHA_T), _keras(*_mha_k()), None)
    got = {e.torch: (e.targets, e.transform, e.heads) for e in layout.entries}
    assert got == {
        "attn.in_proj_weight": (QKV, "qkv_heads", H),
        "attn.in_proj_bias": (QKV_B, "qkv_heads", H),
        "attn.out_proj.weight": (("a/attention_output/kernel",), "heads_out", H),
        "attn.out_proj.bias": (("a/attention_output/bias",), "identity", None),
    }
    assert pair.Layout.from_json(layout.to_json()) == layout  # model_pair.json keeps the split


def test_key_dim_given_the_width_is_one_line_naming_the_fix():
    with pytest.raises(UserError) as exc:
        pair.layout(_torch(*MHA_T), _keras(*_mha_k(key_dim=E)), None)
    msg = str(exc.value)
    assert "\n" not in msg
    assert f"its query kernel is [{E}, {H}, {E}]: its key_dim is {E}, the model width" in msg
    assert f"give MultiHeadAttention(num_heads={H}, key_dim={D})" in msg
    with pytest.raises(UserError, match=f"it has 2 heads of {E // 2}, torch {H} heads of {D}"):
        pair.layout(_torch(*MHA_T), _keras(*_mha_k(key_dim=E // 2, heads=2)), None)


def test_explicit_map_file_takes_a_list_of_keras_variables(tmp_path):
    rows = [
        {"torch": "attn.in_proj_weight", "keras": list(QKV), "transform": "qkv_heads"},
        {"torch": "attn.in_proj_bias", "keras": list(QKV_B), "transform": "qkv_heads"},
        {
            "torch": "attn.out_proj.weight",
            "keras": "a/attention_output/kernel",
            "transform": "heads_out",
        },
        {"torch": "attn.out_proj.bias", "keras": "a/attention_output/bias"},
    ]
    path = tmp_path / "map.yaml"
    path.write_text(yaml.safe_dump(rows))
    layout = pair.layout(_torch(*MHA_T), _keras(*_mha_k()), str(path))
    assert layout.explicit and layout.by_torch()["attn.in_proj_weight"].heads == H  # inferred
    assert layout.by_torch()["attn.out_proj.weight"].heads == H
    rows[0]["keras"] = QKV[0]  # one variable for a split transform
    path.write_text(yaml.safe_dump(rows))
    with pytest.raises(UserError, match=r"qkv_heads maps onto a list of 3 variables"):
        pair.layout(_torch(*MHA_T), _keras(*_mha_k()), str(path))
    rows[0]["keras"] = [QKV[0], QKV[1], "a/attention_output/kernel"]  # a shape it cannot make
    path.write_text(yaml.safe_dump(rows))
    with pytest.raises(UserError, match="a reshape dualtrain cannot justify"):
        pair.layout(_torch(*MHA_T), _keras(*_mha_k()), str(path))

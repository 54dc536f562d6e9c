"""The locator's normalisation mistakes, framework-free: post-LN against pre-LN (norm_first) named
from what each side feeds a block's LayerNorm or attention (dualtrain.core.locate.attention
.norm_order_mistake), and a LayerNorm epsilon that differs named with the side that differs
(dualtrain.core.locate.mistakes.norm_eps_mistake)."""

from __future__ import annotations

import numpy as np
import pytest

from dualtrain.core.locate.attention import context, norm_order_mistake
from dualtrain.core.locate.mistakes import norm_eps_mistake
from dualtrain.core.pair.record import Layout, Side, TorchArray

RNG = np.random.default_rng(1)
N, T, E, H = 2, 5, 8, 2
W = {
    "b.attn.in_proj_weight": RNG.normal(size=(3 * E, E)),
    "b.attn.in_proj_bias": RNG.normal(size=3 * E),
    "b.attn.out_proj.weight": RNG.normal(size=(E, E)),
    "b.attn.out_proj.bias": RNG.normal(size=E),
    "b.norm1.weight": RNG.normal(size=E),
    "b.norm1.bias": RNG.normal(size=E),
}
TORCH = Side(
    "f",
    "Block",
    (T, E),
    torch=tuple(
        TorchArray(name, W[name].shape, True, name.rsplit(".", 1)[0], "other", heads=H)
        for name in W
        if ".attn." in name
    )
    + tuple(
        TorchArray(n, W[n].shape, True, "b.norm1", "other", "LayerNorm") for n in W if "norm" in n
    ),
    layers=({"name": "b.norm1", "cls": "LayerNorm", "eps": 1e-5},),
)
LAYOUT = Layout(TORCH, Side("g", "Model", (T, E)), ())
X = RNG.normal(size=(N, T, E))


def _attn(x: np.ndarray) -> np.ndarray:
    proj = x @ W["b.attn.in_proj_weight"].T + W["b.attn.in_proj_bias"]
    return context(proj, H, None) @ W["b.attn.out_proj.weight"].T + W["b.attn.out_proj.bias"]


def _norm(x: np.ndarray) -> np.ndarray:
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * W["b.norm1.weight"] + W["b.norm1.bias"]


def test_a_post_ln_keras_block_against_torchs_pre_ln_is_named():
    # torch's norm1 takes the block's input x; a post-LN Keras block gives it x + attn(x)
    t = {"in/b.norm1": X}
    found = norm_order_mistake(LAYOUT, "b.norm1", t, {"kin/b.norm1": X + _attn(X)}, W)
    assert found.startswith("post-LN against pre-LN (norm_first): the Keras block is post-LN")
    assert "put each LayerNormalization before its sublayer" in found
    # anything else at that input is not this mistake
    assert norm_order_mistake(LAYOUT, "b.norm1", t, {"kin/b.norm1": X + 2 * _attn(X)}, W) == ""


def test_a_pre_ln_keras_block_against_torchs_post_ln_is_named():
    # torch's attention takes the block's input x; a pre-LN Keras block gives it norm1(x)
    t = {"in/b.attn": X}
    found = norm_order_mistake(LAYOUT, "b.attn", t, {"kin/b.attn": _norm(X)}, W)
    assert found.startswith("pre-LN against post-LN (norm_first): the Keras block is pre-LN")
    assert "'b.norm1'" in found and "after its residual add" in found
    assert norm_order_mistake(LAYOUT, "b.attn", t, {"kin/b.attn": _norm(2 * X)}, W) == ""


LN = {"cls": "LayerNorm"}
KLN = {"cls": "LayerNormalization"}


@pytest.mark.parametrize(
    ("eps_t", "eps_k", "fix"),
    [
        (1e-5, 1e-3, "set the Keras layer's epsilon=1e-05)"),  # Keras left at its default
        (
            1e-3,
            1e-5,
            "the torch side differs: its eps=0.001, Keras's default,",
        ),  # copied onto torch
        (1e-6, 1e-5, "set the Keras layer's epsilon=1e-06)"),  # torch's own value, Keras a default
        (1e-5, 1e-6, "the torch side differs: its eps=1e-05 where"),  # Keras's own, torch a default
        (1e-6, 1e-7, "make them equal"),  # neither tells
    ],
    ids=["keras-default", "keras-default-on-torch", "keras-differs", "torch-differs", "either"],
)
def test_a_layernorm_eps_names_the_side_that_differs(eps_t, eps_k, fix):
    found = norm_eps_mistake({**LN, "eps": eps_t}, {**KLN, "epsilon": eps_k})
    assert found.startswith(f"LayerNorm eps (torch eps={eps_t:g}, Keras LayerNormalization"), found
    assert fix in found, found
    side = "torch" if "torch side" in fix else "Keras" if "set the Keras" in fix else "either"
    assert ("set the Keras layer's" in found) == (side == "Keras"), found
    assert ("the torch side differs" in found) == (side == "torch"), found


def test_float32_inside_a_float64_layer_is_told_from_a_mistake():
    from dualtrain.core.locate.mistakes import FLOAT32_U, float32_inside

    # Hugging Face's and KerasHub's RMSNorm in float64: 6.7e-8 apart, 1.1 x float32's rounding
    assert "float32 arithmetic inside the layer" in float32_inside(6.7e-8)
    assert "1.1 x float32's rounding" in float32_inside(1.1 * FLOAT32_U)
    # float64 rounding, and a difference a mistake makes (an approximate gelu: ~1e-3): not it
    assert float32_inside(1e-12) == "" and float32_inside(1e-3) == ""
    assert float32_inside(2e-6) == ""  # past 16 x float32's rounding

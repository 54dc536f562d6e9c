"""The locator's converter mistakes on learned maps (dualtrain.core.locate.converter
.converter_mistake), framework-free: NumPy stand-ins for a converter that splits an attention
projection's features into (heads, head size) the right way, and one that reads them head size
first, on Hugging Face GPT-2's packed c_attn and on a Llama-style q_proj of its own; and one that
reorders q's and k's features within each head for a rotary embedding of the other layout."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dualtrain.core.locate.converter import converter_mistake
from dualtrain.core.locate.finding import Finding
from dualtrain.core.pair import learn as L
from dualtrain.core.pair.record import Layout, Side, TorchArray

D, HEADS = 8, 2
HD = D // HEADS
SHAPES = {
    "h.0.attn.c_attn.weight": (D, 3 * D),  # HF Conv1D: (in, out), q | k | v along out
    "layers.0.q_proj.weight": (D, D),  # a Linear: (out, in)
}


def _split(flat: np.ndarray, transposed: bool) -> np.ndarray:
    """The last axis of ``flat`` (heads x head size) as (heads, head size)."""
    if transposed:  # the mistake: head size first, then swapped into place
        return np.swapaxes(flat.reshape(*flat.shape[:-1], HD, HEADS), -1, -2)
    return flat.reshape(*flat.shape[:-1], HEADS, HD)


def converter(transposed: bool):
    def convert(t):
        w = t["h.0.attn.c_attn.weight"]
        out = {
            f"attn/{part}/kernel": _split(w[:, k * D : (k + 1) * D], transposed)
            for k, part in enumerate(("query", "key", "value"))
        }
        out["llama/q_proj/kernel"] = _split(t["layers.0.q_proj.weight"].T, transposed)
        return out

    return convert


def _layout(transposed: bool) -> Layout:
    m = L.learn(SHAPES, converter(transposed))
    arrays = (
        TorchArray(
            "h.0.attn.c_attn.weight",
            SHAPES["h.0.attn.c_attn.weight"],
            True,
            "h.0.attn.c_attn",
            "other",
            "Conv1D",
        ),
        TorchArray("layers.0.q_proj.weight", (D, D), True, "layers.0.q_proj", "dense", "Linear"),
    )
    torch = Side("t:f", "M", (10,), torch=arrays)
    return Layout(torch, Side("k:f", "M", (10,)), L.entries(m, SHAPES), learned=True)


@pytest.mark.parametrize("module", ["h.0.attn.c_attn", "layers.0.q_proj"])
def test_heads_split_head_size_first_is_named(module):
    said = converter_mistake(_layout(True), module)
    assert said.startswith("the converter's split of heads: Keras "), said
    assert f"as {HEADS} heads of {HD}" in said and f"({HD}, {HEADS}) then transposed" in said


@pytest.mark.parametrize("module", ["h.0.attn.c_attn", "layers.0.q_proj"])
def test_heads_split_as_keras_takes_them_is_no_mistake(module):
    assert converter_mistake(_layout(False), module) == ""


ROTARY = {
    "evens, then odds": np.r_[0:8:2, 1:8:2],  # half-split from interleaved (Meta -> HF's permute)
    "interleaved from both halves": np.ravel(np.c_[0:4, 4:8]),  # its inverse
}
RD = 8  # a rotary head's size: 2 heads of 8


def _rotary_layout(order: str | None, role: str = "query") -> Layout:
    """A q_proj (16, 16) split into 2 heads of 8, each head's features reordered by ``order``."""
    shapes = {"layers.0.q_proj.weight": (2 * RD, 2 * RD)}

    def convert(t):
        kernel = t["layers.0.q_proj.weight"].T.reshape(2 * RD, 2, RD)
        if order is not None:
            kernel = kernel[..., ROTARY[order]]
        return {f"llama/{role}/kernel": kernel}

    m = L.learn(shapes, convert)
    arrays = (TorchArray("layers.0.q_proj.weight", shapes["layers.0.q_proj.weight"], True,
                         "layers.0.q_proj", "dense", "Linear"),)  # fmt: skip
    torch = Side("t:f", "M", (10,), torch=arrays)
    return Layout(torch, Side("k:f", "M", (10,)), L.entries(m, shapes), learned=True)


@pytest.mark.parametrize("order", sorted(ROTARY))
def test_q_reordered_for_the_other_rotary_layout_is_named(order):
    said = converter_mistake(_rotary_layout(order), "layers.0.q_proj")
    assert said.startswith("the converter's rotary layout: Keras 'llama/query/kernel'"), said
    assert f"({order}: torch's features {', '.join(map(str, ROTARY[order][:4]))}, ...)" in said


def test_a_value_projection_reordered_is_no_rotary_mistake():
    # rotary embeddings turn q and k only: v's features reordered are another order of elements
    said = converter_mistake(_rotary_layout("evens, then odds", "value"), "layers.0.q_proj")
    assert "rotary" not in said and "another order of its elements" in said, said


def test_q_in_the_heads_own_order_is_no_mistake():
    assert converter_mistake(_rotary_layout(None), "layers.0.q_proj") == ""


def test_a_difference_between_outputs_of_other_shapes_says_so():
    # Hugging Face's packed q, k, v projection against KerasHub's whole attention: (N, T, 3E)
    # against (N, T, E); the line said "(output, inf)"
    where = "torch 'h.0.attn.c_attn' / Keras 'transformer_layer_0/self_attention'"
    found = Finding(where, "output", math.inf, "", "Fed the torch module's input, ...")
    assert f"at {where} (output, other shapes). " in found.line()
    assert "(other shapes; no classic mistake fits)" in found.lead()
    assert "(output, 0.5)" in Finding(where, "output", 0.5, "", "").line()

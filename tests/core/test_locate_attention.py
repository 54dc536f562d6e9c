"""The locator's attention mistakes (dualtrain.core.locate.attention), framework-free: each mistaken
attention, computed from a packed projection, is named as that mistake and no other; torch's own
attention is no mistake, and one that is off in another way is named as none."""

from __future__ import annotations

import numpy as np
import pytest

from dualtrain.core.locate.attention import (
    attention_mistake,
    context,
    pool_mistake,
    residual_mistake,
)

RNG = np.random.default_rng(0)
N, T, E, H = 2, 5, 12, 3
PROJ = RNG.normal(size=(N, T, 3 * E))
CAUSAL = np.triu(np.ones((T, T), bool), 1)  # torch's polarity: True = masked

#: (the mistaken attention's arguments, the start of its name)
MISTAKES = {
    "qkv order": ({"order": (1, 0, 2)}, "q, k, v taken from the packed projection in another"),
    "heads (D, H)": ({"dh": True}, "the heads split in the other order"),
    "heads (D, H), merged (H, D)": ({"dh": True, "merge_dh": False}, "the heads split in the"),
    "softmax axis": ({"axis": -2}, "softmax over the wrong axis"),
    "scale twice": ({"scale": 1.0 / (E // H)}, "the scale applied twice"),
    "no scale": ({"scale": 1.0}, "the scale not applied"),
    "scale of the width": ({"scale": 1.0 / np.sqrt(E)}, "the scale 1/sqrt(width)"),
    "heads merged (D, H)": ({"merge_dh": True}, "the heads merged back in the other order"),
    "mask polarity": ({"polarity": "inverted"}, "the attention mask with the other polarity"),
    "mask left out": ({"polarity": "none"}, "the attention mask left out"),
}


@pytest.mark.parametrize("name", MISTAKES)
def test_each_mistake_is_named(name):
    kwargs, expected = MISTAKES[name]
    observed = context(PROJ, H, CAUSAL, **kwargs)
    assert attention_mistake(observed, PROJ, H, CAUSAL).startswith(expected)
    # through the output projection too (a Keras MultiHeadAttention fed torch's input)
    w, b = RNG.normal(size=(E, E)), RNG.normal(size=E)
    assert attention_mistake(observed @ w.T + b, PROJ, H, CAUSAL, w, b).startswith(expected)


def test_torchs_attention_and_other_differences_are_no_named_mistake():
    faithful = context(PROJ, H, CAUSAL)
    assert attention_mistake(faithful, PROJ, H, CAUSAL) == ""
    assert attention_mistake(faithful * (1 + 1e-6), PROJ, H, CAUSAL) == ""  # off another way
    # without a mask, no mask mistake is offered
    assert attention_mistake(context(PROJ, H, None), PROJ, H, None) == ""


def test_tokens_pooled_another_way_are_named():
    tokens = RNG.normal(size=(N, T, E))
    t = {"out/norm": tokens, "in/head": tokens.mean(axis=1)}
    got = pool_mistake(t, "head", tokens[:, 0])
    assert got.startswith("the tokens pooled another way (torch takes the mean over the tokens")
    assert "Keras the first token" in got
    assert pool_mistake(t, "head", tokens.mean(axis=1)) == ""  # pooled alike
    assert pool_mistake(t, "head", tokens[:, 0] + 1.0) == ""  # no pooling makes it


def test_a_residual_add_left_out_or_made_twice_is_named():
    x, y = RNG.normal(size=(N, T, E)), RNG.normal(size=(N, T, E))
    t = {"out/attn": y, "in/norm2": x + y}
    assert residual_mistake(t, "norm2", y).startswith("the residual connection left out")
    assert residual_mistake(t, "norm2", x + 2 * y).startswith("a residual add torch does not")
    assert residual_mistake(t, "norm2", x + y) == "" and residual_mistake(t, "norm2", x) == ""

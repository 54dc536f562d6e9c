"""A weight map learned from values (dualtrain.core.pair.learn), on converters written as a
converter writer would (NumPy stand-ins for KerasHub's HF converters: Hugging Face's packed GPT-2
attention split into KerasHub's query, key and value kernels, a conv kernel to HWIO, a flatten that
interleaves axes, tied embeddings) and on converters that get it wrong: each wrong one is named."""

import numpy as np
import pytest

from dualtrain.core.pair import learn as L
from dualtrain.errors import UserError

D, HEADS = 8, 2
HD = D // HEADS
SHAPES = {
    "wte.weight": (11, D),
    "h.0.attn.c_attn.weight": (D, 3 * D),  # HF Conv1D: (in, out), q | k | v along out
    "h.0.attn.c_attn.bias": (3 * D,),
    "h.0.attn.c_proj.weight": (D, D),
    "conv.weight": (4, 3, 2, 2),  # OIHW
    "fc.weight": (5, 4 * 3 * 3),  # a dense after a flatten of (C=4, H=3, W=3)
    "ln.weight": (D,),
}


def gpt2_like(t):
    """KerasHub's GPT-2 converter's moves, on NumPy."""
    w, b = t["h.0.attn.c_attn.weight"], t["h.0.attn.c_attn.bias"]
    out = {"token_embedding/embeddings": t["wte.weight"]}
    for k, part in enumerate(("query", "key", "value")):
        out[f"attn/{part}/kernel"] = w[:, k * D : (k + 1) * D].reshape(D, HEADS, HD)
        out[f"attn/{part}/bias"] = b[k * D : (k + 1) * D].reshape(HEADS, HD)
    out["attn/attention_output/kernel"] = t["h.0.attn.c_proj.weight"].reshape(HEADS, HD, D)
    out["conv/kernel"] = t["conv.weight"].transpose(2, 3, 1, 0)
    fc = t["fc.weight"].reshape(5, 4, 3, 3).transpose(2, 3, 1, 0).reshape(36, 5)  # H,W,C rows
    out["fc/kernel"] = fc
    out["ln/gamma"] = t["ln.weight"]
    return out


def _real(seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}


def test_a_converters_moves_are_learned_and_reproduce_it_bit_for_bit():
    m = L.learn(SHAPES, gpt2_like, real=_real())
    by = {s.keras: s for s in m.sources}
    # a split of the packed projection, a reshape, a transpose: strided views of one array
    q = by["attn/query/kernel"].view
    assert q is not None and q.torch == "h.0.attn.c_attn.weight" and q.offset == 0
    assert q.strides == (3 * D, HD, 1)
    assert by["attn/value/bias"].view.offset == 2 * D
    assert by["conv/kernel"].view.strides == (2, 1, 4, 12)
    # the flatten's H,W,C rows interleave axes: no single stride per Keras axis, a view over
    # finer ones (H and W stay together: h*3+w is contiguous in torch's C,H,W too)
    fc = by["fc/kernel"].view
    assert fc is not None and fc.keras == (36, 5)
    assert (fc.shape, fc.strides) == ((9, 4, 5), (1, 9, 36))
    real = _real(1)
    mine, theirs = L.apply_all(m, real), gpt2_like(real)
    assert all(np.array_equal(mine[k], theirs[k]) for k in theirs)
    assert not m.shared
    assert any("attn/query/kernel [8, 2, 4] <- h.0.attn.c_attn.weight" in x for x in m.describe())


def test_tied_weights_are_said_and_a_dropped_array_is_named():
    def tied(t):
        out = gpt2_like(t)
        out["lm_head/kernel"] = t["wte.weight"].T  # the output layer reuses the embedding
        return out

    assert L.learn(SHAPES, tied).shared == ("wte.weight",)

    def dropped(t):
        out = gpt2_like(t)
        del out["ln/gamma"]
        return out

    with pytest.raises(UserError, match=r"torch array 'ln.weight' \[8\] reaches no Keras"):
        L.learn(SHAPES, dropped)

    def half(t):
        out = gpt2_like(t)
        out["attn/value/bias"] = out["attn/value/bias"][:1]
        return out

    with pytest.raises(UserError, match=r"'h.0.attn.c_attn.bias'.*4 of 24 elements unused"):
        L.learn(SHAPES, half)


@pytest.mark.parametrize(
    "change, words",
    [
        ("rescale", "changes values (rescales, rounds or computes them)"),
        ("raise", "it raised KeyError"),
        ("nothing", "must give the Keras model's variables by name"),
        ("fold", "on the real weights it gives Keras variable 'ln/gamma' other values"),
    ],
)
def test_a_converter_that_does_more_than_move_values_is_one_line(change, words):
    def convert(t):
        if change == "raise":
            return {"x": t["missing"]}
        if change == "nothing":
            return None
        out = gpt2_like(t)
        if change == "rescale":
            out["conv/kernel"] = out["conv/kernel"] * 0.5
        if change == "fold":  # value-dependent: identity on the distinct values, not on these
            g = out["ln/gamma"]
            out["ln/gamma"] = np.where(g < 0, 0.0, g).astype(g.dtype)
        return out

    with pytest.raises(UserError) as err:
        L.learn(SHAPES, convert, real=_real())
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_model_past_one_pass_takes_two_and_decodes_every_id(monkeypatch):
    monkeypatch.setattr(L, "DIGIT_BITS", 3)
    monkeypatch.setattr(L, "BASE", 8)  # 8 ids a pass: this model's 99 need 3
    shapes = {"a": (7, 5), "b": (40,), "c": (3, 2, 4)}
    assert L.passes_for(sum(int(np.prod(s)) for s in shapes.values())) == 3

    def convert(t):
        return {"x": t["a"].T, "y": t["b"][::-1].reshape(5, 8), "z": t["c"].transpose(2, 0, 1)}

    rng = np.random.default_rng(0)
    real = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    m = L.learn(shapes, convert, real=real)
    by = {s.keras: s.view for s in m.sources}
    assert by["y"].strides == (-8, -1) and by["y"].offset == 39  # a reversal is a view too

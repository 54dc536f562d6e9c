"""The Keras 3 port of transformer_torch.py, faithful: a stride-7 Conv2D and a Reshape make the same
16 tokens (row-major, as torch's flatten(2).transpose(1, 2)), ``Position`` holds the learned
position parameter, each block is torch's pre-LN TransformerEncoderLayer written with Keras's own
layers (LayerNormalization with torch's epsilon 1e-5, MultiHeadAttention with key_dim = width /
heads, Dense, the exact gelu), then LayerNormalization, the mean over the tokens and a Dense head.
dualtrain's weight map splits torch's packed in_proj_weight into the query, key and value kernels.

``transformer_packed`` is the same port with the attention written out by hand (one Dense of 3 x
width, split into q, k, v, heads, softmax(q k^T / sqrt(head_dim)) v), as ports often do. The other
factories are ports with one classic mistake each, paired with the faithful torch side
(``--set model.keras=transformer_keras:<factory>``); docs/own-models.md lists them with the fix
the locator names.
"""

import math

import keras
from keras import layers, ops


@keras.saving.register_keras_serializable(package="transformer_keras")
class Position(layers.Layer):
    """A learned position parameter added to the tokens (torch's ``self.pos``)."""

    def build(self, input_shape):
        self.pos = self.add_weight(
            shape=(1, *input_shape[1:]), initializer="zeros", name="pos", trainable=True
        )

    def call(self, x):
        return x + ops.cast(self.pos, x.dtype)


@keras.saving.register_keras_serializable(package="transformer_keras")
def tanh_gelu(x):
    return keras.activations.gelu(x, approximate=True)


def _attention(x, width, heads, name, mistake, mask):
    """Self-attention: Keras's MultiHeadAttention, or written out by hand (``mistake`` "packed"
    and the mistakes of a hand-written attention)."""
    if mistake in ("keras", "key_dim", "mask_polarity"):
        key_dim = width if mistake == "key_dim" else width // heads
        mha = layers.MultiHeadAttention(heads, key_dim, name=f"{name}_attn")
        if mask is None:
            return mha(x, x)
        # Keras's polarity: True = attend; torch's mask (True = masked) copied over inverts it
        keep = mask if mistake == "mask_polarity" else ops.logical_not(mask)
        return mha(x, x, attention_mask=keep)
    d = width // heads
    qkv = layers.Dense(3 * width, name=f"{name}_qkv")(x)
    q, k, v = ops.split(qkv, 3, axis=-1)
    if mistake == "qkv_order":  # the packed projection read as key, query, value
        k, q, v = q, k, v

    def split_heads(t):
        if mistake == "heads_dh":  # (D, H): each head takes every H-th feature
            return ops.transpose(ops.reshape(t, (-1, t.shape[1], d, heads)), (0, 3, 1, 2))
        return ops.transpose(ops.reshape(t, (-1, t.shape[1], heads, d)), (0, 2, 1, 3))

    q, k, v = split_heads(q), split_heads(k), split_heads(v)
    scale = {"scale_none": 1.0, "scale_twice": 1.0 / d, "scale_width": 1.0 / math.sqrt(width)}
    scale = scale.get(mistake, 1.0 / math.sqrt(d))
    scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) * scale
    weights = ops.softmax(scores, axis=-2 if mistake == "softmax_axis" else -1)
    out = ops.reshape(ops.transpose(ops.matmul(weights, v), (0, 2, 1, 3)), (-1, x.shape[1], width))
    return layers.Dense(width, name=f"{name}_proj")(out)


def _block(x, width, heads, mlp, name, eps, approximate, norm_first, mistake, mask):
    def norm(i, y):
        return layers.LayerNormalization(epsilon=eps, name=f"{name}_norm{i}")(y)

    def ff(y):
        y = layers.Dense(mlp * width, name=f"{name}_linear1")(y)
        y = layers.Activation(tanh_gelu if approximate else "gelu", name=f"{name}_act")(y)
        return layers.Dense(width, name=f"{name}_linear2")(y)

    if mistake == "no_residual":  # the attention's residual add left out
        x = _attention(norm(1, x), width, heads, name, "keras", mask)
        return layers.Add(name=f"{name}_add2")([x, ff(norm(2, x))])
    if norm_first:  # x + sa(norm1(x)); x + ff(norm2(x))
        x = layers.Add(name=f"{name}_add1")(
            [x, _attention(norm(1, x), width, heads, name, mistake, mask)]
        )
        return layers.Add(name=f"{name}_add2")([x, ff(norm(2, x))])
    # post-LN: norm1(x + sa(x)); norm2(x + ff(x))
    x = norm(
        1, layers.Add(name=f"{name}_add1")([x, _attention(x, width, heads, name, mistake, mask)])
    )
    return norm(2, layers.Add(name=f"{name}_add2")([x, ff(x)]))


def transformer(
    width=32,
    heads=4,
    depth=1,
    classes=10,
    side=28,
    patch=7,
    mlp=2,
    causal=False,
    norm_first=True,
    approximate="none",
    eps=1e-5,
    mistake="keras",
):
    tokens = (side // patch) ** 2
    inp = keras.Input((side, side, 1), name="x")
    x = layers.Conv2D(width, patch, strides=patch, name="embed")(inp)
    x = layers.Reshape((tokens, width), name="tokens")(x)
    x = Position(name="pos")(x)
    mask = None
    if causal:  # torch's mask, True = masked (the port turns it into Keras's True = attend)
        mask = ops.triu(ops.ones((tokens, tokens), dtype="bool"), 1)
    for i in range(depth):
        x = _block(
            x, width, heads, mlp, f"block{i}", eps, approximate == "tanh", norm_first, mistake, mask
        )
    x = layers.LayerNormalization(epsilon=1e-5, name="norm")(x)
    if mistake == "first_token":  # a ViT's class-token habit, where torch averages the tokens
        x = layers.Lambda(lambda t: t[:, 0], name="mean")(x)
    else:
        x = layers.GlobalAveragePooling1D(name="mean")(x)
    x = layers.Dense(classes, name="head")(x)
    return keras.Model(inp, x, name="transformer")


def transformer_packed(**kw):
    """The faithful port with the attention written out by hand (one Dense of 3 x width)."""
    return transformer(**kw, mistake="packed")


def _mistake(what, doc):
    def factory(**kw):
        return transformer(**{**kw, **what})

    factory.__doc__ = doc
    return factory


keras_eps = _mistake({"eps": 1e-3}, "LayerNormalization's own epsilon (1e-3), torch's is 1e-5.")
gelu_tanh = _mistake({"approximate": "tanh"}, "gelu's tanh approximation, torch's is exact.")
key_dim_width = _mistake({"mistake": "key_dim"}, "key_dim = width, not width / heads.")
post_ln = _mistake({"norm_first": False}, "post-LN blocks where torch's are pre-LN (norm_first).")
qkv_order = _mistake({"mistake": "qkv_order"}, "the packed projection split as k, q, v.")
heads_dh = _mistake({"mistake": "heads_dh"}, "heads split as (head_dim, heads).")
softmax_axis = _mistake({"mistake": "softmax_axis"}, "softmax over the queries.")
scale_twice = _mistake({"mistake": "scale_twice"}, "scores scaled by 1/head_dim.")
first_token = _mistake({"mistake": "first_token"}, "the first token, where torch averages them.")
mask_missing = _mistake({"causal": False}, "no attention mask where torch's is causal.")
scale_width = _mistake({"mistake": "scale_width"}, "scores scaled by 1/sqrt(width).")
no_residual = _mistake({"mistake": "no_residual"}, "the attention's residual add left out.")
scale_none = _mistake({"mistake": "scale_none"}, "scores not scaled.")


def mask_polarity(**kw):
    """torch's causal mask (True = masked) given as Keras's attention_mask (True = attend)."""
    return transformer(**{**kw, "causal": True, "mistake": "mask_polarity"})

"""dualtrain's token layers in Keras (dualtrain.spec.layers declares them): Position,
SelfAttention and TokenPool in training, each the function of its torch namesake
(backends/torch/tokens.py) with the same parameters in the same layout; and, for the exported model
(Keras's own layers only), the targets that load the packed attention weights into
keras.layers.MultiHeadAttention's per-projection kernels.

Mixed precision follows autocast op by op: the projections and both attention matmuls in the
compute dtype, the scale and the softmax computed in float32 and rounded once (torch's opmath; CPU
autocast keeps softmax's output in the low dtype). Where torch's type promotion makes the token
stream float32 (a float32 position embedding added, an embedding lookup, a residual add with a
float32 side) the model builder gives those layers a float32 policy (model.py)."""

from __future__ import annotations

import math
from typing import Any, Protocol, TypeVar

import keras
import numpy as np
import tensorflow as tf

from dualtrain.backends.tf.layers import Conv2D, Variable, scaled
from dualtrain.core.model import ResolvedLayer


class Position(keras.layers.Layer):
    """Tokens (N, T, D) plus a learned (T, D) embedding ``weight``."""

    def __init__(self, tokens: int, dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.weight = self.add_weight(shape=(tokens, dim), initializer="zeros", name="weight")

    def call(self, x: tf.Tensor) -> tf.Tensor:
        return x + tf.cast(self.weight, x.dtype)


class TokenPool(keras.layers.Layer):
    """(N, T, D) -> (N, D): the mean over the tokens, or the first token."""

    def __init__(self, first: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.first = first

    def call(self, x: tf.Tensor) -> tf.Tensor:
        return x[:, 0] if self.first else tf.reduce_mean(x, axis=1)


class Embedding(keras.layers.Layer):
    """Ids (N, T), whole numbers in any dtype, -> (N, T, D) rows of ``embeddings`` (V, D), with a
    dense gradient: the rows' gradients summed per id (tf.gather's own gradient is IndexedSlices,
    which the all-reduce and the update rule do not take)."""

    def __init__(self, vocab: int, dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.vocab = vocab
        self.embeddings = self.add_weight(shape=(vocab, dim), name="embeddings")

    def call(self, x: tf.Tensor) -> tf.Tensor:
        ids = tf.cast(x, tf.int32)
        vocab = self.vocab

        @tf.custom_gradient
        def lookup(w: tf.Tensor) -> Any:
            def grad(g: tf.Tensor) -> tf.Tensor:
                flat = tf.reshape(g, [-1, tf.shape(g)[-1]])
                return tf.math.unsorted_segment_sum(flat, tf.reshape(ids, [-1]), vocab)

            return tf.gather(w, ids), grad

        return lookup(tf.cast(self.embeddings, self.compute_dtype))


def _wide(dtype: tf.DType) -> tf.DType:
    return tf.float32 if dtype in (tf.float16, tf.bfloat16) else dtype


class SelfAttention(keras.layers.Layer):
    """Multi-head self-attention on (N, T, D) with torch's parameters: ``in_proj_weight``
    (3D, D) and ``in_proj_bias`` as torch stores them, the output projection as a Dense's kernel
    (D, D) (out_proj.weight transposed) and bias."""

    def __init__(
        self, dim: int, heads: int, causal: bool = False, bias: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.dim, self.heads, self.causal = dim, heads, causal
        self.in_proj_weight = self.add_weight(shape=(3 * dim, dim), name="in_proj_weight")
        self.out_kernel = self.add_weight(shape=(dim, dim), name="out_proj_kernel")
        self.in_proj_bias = self.out_bias = None
        if bias:
            self.in_proj_bias = self.add_weight(shape=(3 * dim,), name="in_proj_bias")
            self.out_bias = self.add_weight(shape=(dim,), name="out_proj_bias")

    @staticmethod
    def split_heads(a: tf.Tensor, n: Any, t: Any, h: int, hd: int) -> tf.Tensor:
        """(N, T, D) -> (N, heads, T, head_dim): head j is features j*head_dim.. (torch's)."""
        return tf.transpose(tf.reshape(a, [n, t, h, hd]), [0, 2, 1, 3])

    @property
    def variables_in_canonical_order(self) -> list[keras.Variable]:
        both = (self.in_proj_weight, self.in_proj_bias, self.out_kernel, self.out_bias)
        return [v for v in both if v is not None]

    def call(self, x: tf.Tensor) -> tf.Tensor:
        c = x.dtype
        n, t = tf.shape(x)[0], tf.shape(x)[1]
        d, h = self.dim, self.heads
        qkv = tf.matmul(x, tf.cast(self.in_proj_weight, c), transpose_b=True)
        if self.in_proj_bias is not None:  # without the key's (torch's tokens.SelfAttention)
            b = self.in_proj_bias
            qkv = qkv + tf.cast(tf.concat([b[:d], tf.zeros([d], b.dtype), b[2 * d :]], 0), c)
        q, k, v = (self.split_heads(a, n, t, h, d // h) for a in tf.split(qkv, 3, axis=-1))
        scores = scaled(tf.matmul(q, k, transpose_b=True), 1.0 / math.sqrt(d // h))
        if self.causal:
            # a later token (torch's True = masked): not in the lower triangle with the diagonal
            later = tf.logical_not(tf.cast(tf.linalg.band_part(tf.ones([t, t]), -1, 0), tf.bool))
            scores = tf.where(later, tf.constant(-np.inf, c), scores)
        p = tf.cast(tf.nn.softmax(tf.cast(scores, _wide(c)), axis=-1), c)
        out = tf.reshape(tf.transpose(tf.matmul(p, v), [0, 2, 1, 3]), [n, t, d])
        out = tf.matmul(out, tf.cast(self.out_kernel, c))
        return out if self.out_bias is None else out + tf.cast(self.out_bias, c)


class PackedTarget:
    """Where the exported model loads a canonical attention array: ``assign`` takes the array in
    the canonical layout (``shape``) and fills keras.layers.MultiHeadAttention's variables
    (dualtrain.backends.tf.model.load_canonical calls it as it calls a variable's)."""

    def __init__(self, shape: tuple[int, ...], dtype: str, fill: Any) -> None:
        self.shape, self.dtype, self._fill = shape, dtype, fill

    def assign(self, value: np.ndarray) -> None:
        self._fill(np.asarray(value))


def export_targets(
    mha: keras.layers.MultiHeadAttention, dim: int, heads: int, bias: bool, dtype: str
) -> list[PackedTarget]:
    """The targets of SelfAttention's canonical arrays (in_proj_weight, in_proj_bias,
    out_proj.weight as a kernel (D, D), out_proj.bias) in mha: the packed projection's thirds are
    query, key and value; head h is rows h*head_dim.. of each, Keras's (D, heads, head_dim)."""
    hd = dim // heads
    projections = (mha.query_dense, mha.key_dense, mha.value_dense)

    def in_weight(w: np.ndarray) -> None:
        for j, dense in enumerate(projections):
            dense.kernel.assign(w[j * dim : (j + 1) * dim].T.reshape(dim, heads, hd))

    def in_bias(b: np.ndarray) -> None:
        for j, dense in enumerate(projections):
            dense.bias.assign(b[j * dim : (j + 1) * dim].reshape(heads, hd))

    out = mha.output_dense
    targets = [PackedTarget((3 * dim, dim), dtype, in_weight)]
    targets += [PackedTarget((3 * dim,), dtype, in_bias)] if bias else []
    targets += [
        PackedTarget((dim, dim), dtype, lambda k: out.kernel.assign(k.reshape(heads, hd, dim)))
    ]
    targets += [PackedTarget((dim,), dtype, lambda b: out.bias.assign(b))] if bias else []
    return targets


T = TypeVar("T")


def given(value: T | None, field: str) -> T:
    """A layer field the resolved spec always fills for this layer type (core.model.resolve)."""
    assert value is not None, f"{field} unresolved"
    return value


class Builder(Protocol):
    """What the token layers' entries use of the model builder (backends/tf/model.py's, which
    imports this module)."""

    inference: bool
    policy: str
    mixed: bool
    wide: bool
    named: list[tuple[str, Variable]]

    def dtype(self) -> str: ...

    def weighted(
        self, r: ResolvedLayer, layer: keras.layers.Layer, x: keras.KerasTensor
    ) -> keras.KerasTensor: ...


# ---- the model builder's entries (model.LAYERS) for the token layer types: (builder, resolved
# layer, Keras name, input) -> output; ``b.dtype()`` is the token stream's policy (float32 where
# torch's promotion makes the stream float32 under autocast, ``b.wide``).


def patches(b: Builder, r: ResolvedLayer, name: str, x: keras.KerasTensor) -> keras.KerasTensor:
    """A stride = kernel convolution, its NHWC output read row by row as tokens (torch's
    flatten(2).transpose(1, 2) of NCHW: the same order)."""
    s = r.spec
    conv = (keras.layers.Conv2D if b.inference else Conv2D)(
        s.dim, s.size, strides=s.size, padding="valid", use_bias=s.bias, name=name, dtype=b.policy
    )
    x = b.weighted(r, conv, x)
    b.wide = False
    return keras.layers.Reshape(r.out_shape, name=f"{name}_tokens", dtype=b.policy)(x)


def position(b: Builder, r: ResolvedLayer, name: str, x: keras.KerasTensor) -> keras.KerasTensor:
    b.wide = b.mixed  # a float32 parameter added: float32 tokens under autocast
    if b.inference:  # Keras's own layers: x * ones + bias, the bias the embedding (T, D)
        layer = keras.layers.EinsumDense(
            "btd,d->btd", r.out_shape, bias_axes="td", name=name, dtype=b.dtype()
        )
        x = layer(x)
        layer.kernel.assign(np.ones(layer.kernel.shape, layer.kernel.dtype))
        b.named.append((r.params[0][0], layer.bias))
        return x
    pos = Position(*r.out_shape, name=name, dtype=b.dtype())
    x = pos(x)
    b.named.append((r.params[0][0], pos.weight))
    return x


def attention(b: Builder, r: ResolvedLayer, name: str, x: keras.KerasTensor) -> keras.KerasTensor:
    s = r.spec
    dim, heads, causal = r.in_shape[1], given(s.heads, "attention.heads"), bool(s.causal)
    b.wide = False
    if b.inference:
        mha = keras.layers.MultiHeadAttention(
            heads, dim // heads, use_bias=s.bias, name=name, dtype=b.policy
        )
        x = mha(x, x, use_causal_mask=causal)
        targets = export_targets(mha, dim, heads, s.bias, b.policy)
        b.named += list(zip([n for n, _ in r.params], targets, strict=True))
        return x
    layer = SelfAttention(dim, heads, causal, s.bias, name=name, dtype=b.policy)
    x = layer(x)
    b.named += list(zip([n for n, _ in r.params], layer.variables_in_canonical_order, strict=True))
    return x


def token_pool(b: Builder, r: ResolvedLayer, name: str, x: keras.KerasTensor) -> keras.KerasTensor:
    first = given(r.spec.pool, "token_pool.pool").value == "first"
    if not b.inference:
        return TokenPool(first, name=name, dtype=b.dtype())(x)
    if not first:
        return keras.layers.GlobalAveragePooling1D(name=name, dtype=b.dtype())(x)
    t = r.in_shape[0]
    x = keras.layers.Cropping1D((0, t - 1), name=f"{name}_first", dtype=b.dtype())(x)
    return keras.layers.Flatten(name=name, dtype=b.dtype())(x)


def embedding(b: Builder, r: ResolvedLayer, name: str, x: keras.KerasTensor) -> keras.KerasTensor:
    """Embedding (Keras's own in the export; it casts the ids to int32); float32 tokens under
    mixed precision, as torch's embedding lookup (no autocast) gives."""
    b.wide = b.mixed
    kind = keras.layers.Embedding if b.inference else Embedding
    vocab, dim = given(r.spec.vocab, "embedding.vocab"), given(r.spec.dim, "embedding.dim")
    layer = kind(vocab, dim, name=name, dtype=b.dtype())
    x = layer(x)
    b.named.append((r.params[0][0], layer.embeddings))
    return x

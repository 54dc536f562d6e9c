"""The token layers' precision-path mutants (:data:`TOKEN_PRECISION_MUTANTS`), measured on
:data:`TOKEN_SPEC`: a ViT-like model whose LayerNorms, attention and position embedding the MLP of
PRECISION_SPEC does not have."""

from __future__ import annotations

import math

import numpy as np

from dualtrain.core.kernels import round_to
from tools.mutants.patching import active, tf_engine, torch_engine
from tools.mutants.precision import PrecisionMutant

#: Precision-path mutants of the token layers (issue 33), measured on TOKEN_SPEC: a ViT-like model
#: whose LayerNorms, attention and position embedding the MLP of PRECISION_SPEC does not have.
TOKEN_PRECISION_MUTANTS = {
    m.name: m
    for m in [
        PrecisionMutant(
            "layernorm_grad_low",
            "the LayerNorms' gamma and beta gradients (each element a sum over the N x T token "
            "rows) summed in bfloat16 in an fp32 run: each row's term rounded to bfloat16 and "
            "added in row order, rounded to bfloat16 after every addition (the class of TF's "
            "BiasAddGrad summed in a lower dtype than the run's; the same arithmetic on both "
            "backends, whatever kernels the CPU has: bf16_row_sum)",
            "fp32",
            None,
        ),
        PrecisionMutant(
            "position_grad_low",
            "the position embedding's gradient (each element a sum over the batch) summed in "
            "bfloat16 in an fp32 run, in sample order (bf16_row_sum)",
            "fp32",
            None,
        ),
        PrecisionMutant(
            "patches_bias_grad_low",
            "the patch embedding's bias (a stride = kernel convolution's) with its gradient (a "
            "sum over the N x T patches) summed in bfloat16 in an fp32 run, in row order "
            "(bf16_row_sum; on tf every Conv2D's, of which TOKEN_SPEC has only the patches)",
            "fp32",
            None,
        ),
        PrecisionMutant(
            "attention_bias_grad_low",
            "the attention's packed q/k/v projection bias (in_proj_bias) with its gradient (a "
            "sum over the N x T token rows) summed in bfloat16 in an fp32 run, in row order "
            "(bf16_row_sum): TF's BiasAddGrad class in a token layer",
            "fp32",
            None,
        ),
    ]
}

#: The token spec the token mutants are measured on: parity_tests/test_new_layers_optimizers.py's
#: tokens-w2 (patches 7x7 -> 16 tokens of 16, a position embedding, a pre-LN block of 2-head
#: self-attention with dropout and an MLP block, a final LayerNorm, the first token), AdamW, world
#: 2, 1,001 samples for 2 epochs (16 steps, a partial last batch).
TOKEN_BLOCK = (
    "{type: residual, body: [{type: layernorm}, {type: attention, heads: 2}, "
    "{type: dropout, rate: 0.1}]}, {type: residual, body: [{type: layernorm}, "
    "{type: dense, units: 32}, {type: gelu, approximate: tanh}, {type: dense, units: 16}]}"
)
TOKEN_SPEC = (
    "data.train_limit=1001",
    "data.batch_size=128",
    "data.test_limit=500",
    "train.epochs=2",
    "model.preset=null",
    f"model.layers=[{{type: patches, size: 7, dim: 16}}, {{type: position}}, {TOKEN_BLOCK}, "
    "{type: layernorm}, {type: token_pool, pool: first}, {type: silu}, {type: dense, units: 10}]",
    "optimizer.name=adamw",
    "optimizer.lr=0.003",
    "distribution.world_size=2",
)


# ---- the token layers' precision-path mutants (TOKEN_PRECISION_MUTANTS) --------------------------


def bf16_row_sum(rows: np.ndarray) -> np.ndarray:
    """The token mutants' reduction, stated once in NumPy (both backends' mutants compute exactly
    this): ``rows`` (R, K) of float32 terms, each rounded to bfloat16 (to nearest), summed in row
    order with a rounding to bfloat16 after every addition; (K,). Its error depends on the values
    only, not on which kernels the CPU runs."""
    total = np.zeros(rows.shape[-1], np.float32)
    for r in round_to(np.asarray(rows, np.float32), "bf16"):
        total = round_to(total + r, "bf16")
    return total


def _torch_low():
    """(low_sum, low_add) in torch: bf16_row_sum's arithmetic, and ``x + p`` (p broadcast over
    x's leading axes) whose gradient for p is that sum over the leading axes."""
    import torch  # lazy: framework

    def low_sum(rows):
        total = torch.zeros(rows.shape[-1], dtype=torch.bfloat16, device=rows.device)
        for r in rows.to(torch.bfloat16):
            total = total + r
        return total

    class LowAdd(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, p):
            ctx.shape, ctx.dtype = p.shape, p.dtype
            return x + p

        @staticmethod
        def backward(ctx, g):
            rows = g.reshape(-1, int(np.prod(ctx.shape)))
            return g, low_sum(rows).to(ctx.dtype).reshape(ctx.shape)

    return low_sum, LowAdd.apply


def _tf_low():
    """(low_sum, low_add) in TensorFlow, the same arithmetic as :func:`_torch_low`'s."""
    import tensorflow as tf  # lazy: framework

    def low_sum(rows):
        return tf.foldl(
            lambda acc, r: acc + r,
            tf.cast(rows, tf.bfloat16),
            initializer=tf.zeros([rows.shape[-1]], tf.bfloat16),
        )

    @tf.custom_gradient
    def low_add(x, p):
        def grad(g):
            rows = tf.reshape(g, [-1, int(np.prod(p.shape))])
            return g, tf.reshape(tf.cast(low_sum(rows), p.dtype), p.shape)

        return x + p, grad

    return low_sum, low_add


def _on_init(cls, path: str, patch) -> None:
    """Run ``patch()`` when an engine of ``cls`` is made for a run of precision ``path``, before it
    builds its model (and, on TF, traces its step)."""
    init = cls.__init__

    def mutated_init(self, spec, *args, **kwargs):
        if active(spec, path):
            patch()
        init(self, spec, *args, **kwargs)

    cls.__init__ = mutated_init


def torch_layernorm_grad_low(path: str, size: float) -> None:
    import torch  # lazy: framework
    import torch.nn.functional as F  # lazy: framework
    from torch import nn  # lazy: framework

    low_sum, _ = _torch_low()

    class Affine(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x_hat, gamma, beta):
            ctx.save_for_backward(x_hat, gamma)
            return x_hat * gamma + beta

        @staticmethod
        def backward(ctx, g):
            x_hat, gamma = ctx.saved_tensors
            d = g.shape[-1]
            dgamma = low_sum((x_hat * g).reshape(-1, d)).to(gamma.dtype)
            return g * gamma, dgamma, low_sum(g.reshape(-1, d)).to(gamma.dtype)

    forward = nn.LayerNorm.forward

    def mutated(self, x):
        if self.weight is None or self.bias is None:
            return forward(self, x)
        x_hat = F.layer_norm(x, self.normalized_shape, None, None, self.eps)
        return Affine.apply(x_hat, self.weight, self.bias)

    _on_init(torch_engine().TorchEngine, path, lambda: setattr(nn.LayerNorm, "forward", mutated))


def tf_layernorm_grad_low(path: str, size: float) -> None:
    import keras  # lazy: framework
    import tensorflow as tf  # lazy: framework

    low_sum, _ = _tf_low()

    def mutated(self, inputs):
        x = tf.cast(inputs, self.dtype)  # the variable dtype: float32 in an fp32 run
        x_hat = keras.ops.layer_normalization(x, None, None, self.axis, self.epsilon)

        @tf.custom_gradient
        def affine(x_hat, gamma, beta):
            def grad(g):
                d = g.shape[-1]
                dgamma = tf.cast(low_sum(tf.reshape(x_hat * g, [-1, d])), gamma.dtype)
                return g * gamma, dgamma, tf.cast(low_sum(tf.reshape(g, [-1, d])), beta.dtype)

            return x_hat * gamma + beta, grad

        out = affine(x_hat, tf.convert_to_tensor(self.gamma), tf.convert_to_tensor(self.beta))
        return tf.cast(out, self.compute_dtype)

    cls = keras.layers.LayerNormalization
    _on_init(tf_engine(), path, lambda: setattr(cls, "call", mutated))


def torch_position_grad_low(path: str, size: float) -> None:
    from dualtrain.backends.torch import tokens  # lazy: framework

    _, low_add = _torch_low()

    def mutated(self, x):
        return low_add(x, self.weight)

    _on_init(torch_engine().TorchEngine, path, lambda: setattr(tokens.Position, "forward", mutated))


def tf_position_grad_low(path: str, size: float) -> None:
    import tensorflow as tf  # lazy: framework

    from dualtrain.backends.tf import tokens  # lazy: framework

    _, low_add = _tf_low()

    def mutated(self, x):
        return low_add(x, tf.cast(self.weight, x.dtype))

    _on_init(tf_engine(), path, lambda: setattr(tokens.Position, "call", mutated))


def torch_patches_bias_grad_low(path: str, size: float) -> None:
    import torch.nn.functional as F  # lazy: framework

    from dualtrain.backends.torch import tokens  # lazy: framework

    _, low_add = _torch_low()
    forward = tokens.Patches.forward

    def mutated(self, x):  # tokens.Patches.forward, its bias added by low_add
        if self.bias is None:
            return forward(self, x)
        out = F.conv2d(x, self.weight, None, self.stride, self.padding, self.dilation, self.groups)
        return low_add(out.flatten(2).transpose(1, 2), self.bias)

    cls = tokens.Patches
    _on_init(torch_engine().TorchEngine, path, lambda: setattr(cls, "forward", mutated))


def tf_patches_bias_grad_low(path: str, size: float) -> None:
    import tensorflow as tf  # lazy: framework

    from dualtrain.backends.tf import layers  # lazy: framework

    _, low_add = _tf_low()

    def mutated(self, inputs):  # layers.Conv2D.call, its bias added by low_add (NHWC rows: the
        out = self.convolution_op(inputs, self.kernel)  # order of torch's tokens)
        return low_add(out, tf.cast(self.bias, out.dtype)) if self.use_bias else out

    _on_init(tf_engine(), path, lambda: setattr(layers.Conv2D, "call", mutated))


def torch_attention_bias_grad_low(path: str, size: float) -> None:
    import torch  # lazy: framework
    import torch.nn.functional as F  # lazy: framework

    from dualtrain.backends.torch import tokens  # lazy: framework

    _, low_add = _torch_low()

    def mutated(self, x):  # tokens.SelfAttention.forward, its bias added by low_add
        n, t, d = x.shape
        h, b = self.heads, self.in_proj_bias
        qkv = F.linear(x, self.in_proj_weight)
        if b is not None:
            qkv = low_add(qkv, torch.cat([b[:d], b.new_zeros(d), b[2 * d :]]))
        if self.tap is not None:
            self.tap(x, qkv)
        q, k, v = (a.reshape(n, t, h, d // h).transpose(1, 2) for a in qkv.split(d, dim=-1))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        if self.causal:
            scores = scores.masked_fill(tokens.causal_mask(t, x.device), float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
        return self.out_proj(out.transpose(1, 2).reshape(n, t, d))

    cls = tokens.SelfAttention
    _on_init(torch_engine().TorchEngine, path, lambda: setattr(cls, "forward", mutated))


def tf_attention_bias_grad_low(path: str, size: float) -> None:
    import tensorflow as tf  # lazy: framework

    from dualtrain.backends.tf import tokens  # lazy: framework
    from dualtrain.backends.tf.layers import scaled  # lazy: framework

    _, low_add = _tf_low()

    def mutated(self, x):  # tokens.SelfAttention.call, its bias added by low_add
        c = x.dtype
        n, t = tf.shape(x)[0], tf.shape(x)[1]
        d, h = self.dim, self.heads
        qkv = tf.matmul(x, tf.cast(self.in_proj_weight, c), transpose_b=True)
        if self.in_proj_bias is not None:
            b = self.in_proj_bias
            qkv = low_add(
                qkv, tf.cast(tf.concat([b[:d], tf.zeros([d], b.dtype), b[2 * d :]], 0), c)
            )
        q, k, v = (self.split_heads(a, n, t, h, d // h) for a in tf.split(qkv, 3, axis=-1))
        scores = scaled(tf.matmul(q, k, transpose_b=True), 1.0 / math.sqrt(d // h))
        if self.causal:
            later = tf.logical_not(tf.cast(tf.linalg.band_part(tf.ones([t, t]), -1, 0), tf.bool))
            scores = tf.where(later, tf.constant(-np.inf, c), scores)
        p = tf.cast(tf.nn.softmax(tf.cast(scores, tf.float32 if c != tf.float64 else c), -1), c)
        out = tf.reshape(tf.transpose(tf.matmul(p, v), [0, 2, 1, 3]), [n, t, d])
        out = tf.matmul(out, tf.cast(self.out_kernel, c))
        return out if self.out_bias is None else out + tf.cast(self.out_bias, c)

    cls = tokens.SelfAttention
    _on_init(tf_engine(), path, lambda: setattr(cls, "call", mutated))

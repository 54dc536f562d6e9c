"""dualtrain's token layers in torch (dualtrain.spec.layers declares them): Patches, Position,
SelfAttention, TokenPool, Embedding; and SelfAttentionExport, the same attention on torch's own
nn.MultiheadAttention for the exported model. Every class here uses torch only: the export copies
its source (backends/torch/export.py).

SelfAttention is nn.MultiheadAttention's function (its parameters, names and layout; the packed
projection split q, k, v; head h the rows h*head_dim.. of each; scores scaled by 1/sqrt(head_dim);
tests/backends/torch/test_tokens.py holds the two within 1e-12 in float64). One difference by
design: the key's bias (in_proj_bias[D:2D]) adds q.b_k to every score of a query alike, which the
softmax cancels, so its exact gradient is zero; torch computes rounding noise there, which Adam
turns into updates that differ between any two implementations (the fp64 pair saw 1e-12 on a
tensor of 1e-13). dualtrain leaves it out of the arithmetic: the same function, a gradient of
exactly zero on both backends written as the ops
autocast sees one by one, so the TF backend can run the same ops in the same dtypes: the
projections and both matmuls in the autocast dtype, the softmax on its output (CPU autocast keeps
softmax in the low dtype, computing inside in float32)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class Patches(nn.Conv2d):
    """(N, C, H, W) -> (N, T, D): a stride = kernel = size convolution, its (D, H/size, W/size)
    output read row by row as T = H/size * W/size tokens."""

    def __init__(self, channels: int, dim: int, size: int, bias: bool = True):
        super().__init__(channels, dim, size, stride=size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).flatten(2).transpose(1, 2)


class Position(nn.Module):
    """Tokens (N, T, D) plus a learned (T, D) position embedding (a float32 parameter: under
    autocast the sum is float32, torch's type promotion)."""

    def __init__(self, tokens: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(tokens, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.weight


class TokenPool(nn.Module):
    """(N, T, D) -> (N, D): the mean over the tokens, or the first token."""

    def __init__(self, first: bool = False):
        super().__init__()
        self.first = first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, 0] if self.first else x.mean(dim=1)


class Embedding(nn.Embedding):
    """Ids (N, T), as whole numbers in any dtype, -> (N, T, D)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.long())


def causal_mask(tokens: int, device: torch.device | None = None) -> torch.Tensor:
    """True where a token may not look (a later token): torch's polarity, True = masked."""
    return torch.ones(tokens, tokens, dtype=torch.bool, device=device).triu(1)


class SelfAttention(nn.Module):
    """Multi-head self-attention on (N, T, D), nn.MultiheadAttention(D, heads, bias,
    batch_first=True)'s parameters under its names."""

    def __init__(self, dim: int, heads: int, causal: bool = False, bias: bool = True):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dim)) if bias else None
        self.out_proj = nn.Linear(dim, dim, bias=bias)
        #: called with the packed projection's input and output (backends/torch/condition.py)
        self.tap: Callable[[torch.Tensor, torch.Tensor], None] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        h = self.heads
        b = self.in_proj_bias
        # the key's bias left out: it shifts a query's scores alike
        bias = None if b is None else torch.cat([b[:d], b.new_zeros(d), b[2 * d :]])
        qkv = F.linear(x, self.in_proj_weight, bias)
        if self.tap is not None:
            self.tap(x, qkv)
        q, k, v = qkv.split(d, dim=-1)
        q, k, v = (a.reshape(n, t, h, d // h).transpose(1, 2) for a in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        if self.causal:
            scores = scores.masked_fill(causal_mask(t, x.device), float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
        return self.out_proj(out.transpose(1, 2).reshape(n, t, d))


class SelfAttentionExport(nn.MultiheadAttention):
    """The exported model's attention: torch's own nn.MultiheadAttention on (N, T, D), self
    attention (query = key = value), the same state dict as SelfAttention."""

    def __init__(self, dim: int, heads: int, causal: bool = False, bias: bool = True):
        super().__init__(dim, heads, bias=bias, batch_first=True)
        self.causal = causal

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]  # self-attention: one input
        mask = causal_mask(x.shape[1], x.device) if self.causal else None
        return super().forward(x, x, x, need_weights=False, attn_mask=mask)[0]

"""A small vision transformer written in PyTorch the way a team writes one: the 28x28 image cut
into 7x7 patches by a stride-7 convolution (16 tokens), a learned position parameter added to
the tokens, ``depth`` blocks of ``nn.TransformerEncoderLayer`` (pre-LN, GELU, batch first), a
final LayerNorm, the mean over the tokens and a linear head. Its Keras port is
transformer_keras.py (Keras's own MultiHeadAttention and LayerNormalization).

    dualtrain compare --config configs/port_transformer.yaml

``causal=True`` gives every block torch's boolean attention mask of a causal model (True = the
position is masked), as a language model's blocks take it. ``norm_first=False`` builds the
post-LN blocks (the original Transformer's), to pair with a port that has them.
"""

import torch
from torch import nn


class PatchTransformer(nn.Module):
    def __init__(
        self, width, heads, depth, classes, side, patch, mlp, causal, norm_first, approximate
    ):
        super().__init__()
        tokens = (side // patch) ** 2
        self.embed = nn.Conv2d(1, width, patch, stride=patch)
        self.pos = nn.Parameter(0.02 * torch.randn(1, tokens, width))
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                width,
                heads,
                mlp * width,
                dropout=0.0,
                activation=nn.GELU(approximate=approximate),
                batch_first=True,
                norm_first=norm_first,
            )
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)
        # torch's polarity: True = this key position is masked (not attended to)
        mask = torch.triu(torch.ones(tokens, tokens, dtype=torch.bool), 1) if causal else None
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2) + self.pos  # (N, tokens, width), row-major
        for block in self.blocks:
            x = block(x, src_mask=self.mask)
        return self.head(self.norm(x).mean(dim=1))


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
):
    return PatchTransformer(
        width, heads, depth, classes, side, patch, mlp, causal, norm_first, approximate
    )

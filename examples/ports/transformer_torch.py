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
        self,
        width,
        heads,
        depth,
        classes,
        side,
        patch,
        mlp,
        causal,
        norm_first,
        approximate,
        eps=1e-5,
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
                layer_norm_eps=eps,
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


def _mistake(what, doc):
    def factory(**kw):
        return PatchTransformer(**_settings(kw, what))

    factory.__doc__ = doc
    return factory


def _settings(kw, what):
    """transformer()'s defaults, the model.args given, then the mistake's own settings."""
    defaults = dict(width=32, heads=4, depth=1, classes=10, side=28, patch=7, mlp=2)
    defaults.update(causal=False, norm_first=True, approximate="none")
    return {**defaults, **kw, **what}


# Ports made the other way round (a Keras model written again in torch): the mistake on the
# torch side, paired with the faithful Keras port (--set model.torch=transformer_torch:<factory>)
keras_eps = _mistake({"eps": 1e-3}, "Keras's LayerNormalization epsilon (1e-3) copied over.")
gelu_tanh = _mistake({"approximate": "tanh"}, "nn.GELU(approximate='tanh') against exact.")
post_ln = _mistake({"norm_first": False}, "post-LN blocks (norm_first=False) against pre-LN.")

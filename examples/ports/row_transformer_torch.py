"""A transformer pair as a newcomer writes one, for the fp64 pair's sweep over sizes (issue 46):
each of digits' 8 image rows is a token of 8 pixels, a learned position parameter that starts at
zero, ``depth`` pre-LN blocks of ``nn.TransformerEncoderLayer`` left at its defaults (relu, feed
forward 4 x width), a final LayerNorm, the mean over the tokens and a linear head. Its Keras port is
row_transformer_keras.py (Keras's MultiHeadAttention).

    python -m tools.rounding_twin --config tools/row_transformer.yaml \\
        --set model.args.width=384 --set optimizer.name=sgd --set optimizer.lr=0.05
"""

import torch
from torch import nn


class RowTransformer(nn.Module):
    def __init__(self, width, heads, depth, classes=10):
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.pos = nn.Parameter(torch.zeros(1, 8, width))
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                width,
                heads,
                dim_feedforward=4 * width,
                dropout=0.0,
                batch_first=True,
                norm_first=True,
            )
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = self.embed(x.reshape(x.shape[0], 8, 8)) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))


def model(width=64, heads=4, depth=2):
    return RowTransformer(width, heads, depth)

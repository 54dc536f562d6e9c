"""An MLP written in PyTorch the way a team writes one (Linear, LayerNorm, GELU, two hidden
layers); its Keras port is gelu_mlp_keras.py, with Keras's own gelu and LayerNormalization.

    dualtrain compare --config configs/port_resnet.yaml \
        --set model.torch=gelu_mlp_torch:gelu_mlp --set model.keras=gelu_mlp_keras:gelu_mlp

Inputs (N, 1, H, W) images or (N, F) features, flattened; one logit per class.
"""

from torch import nn


class GeluMLP(nn.Module):
    def __init__(self, features, hidden, classes, approximate="none", eps=1e-5):
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(features, hidden)
        self.norm1 = nn.LayerNorm(hidden, eps=eps)
        self.act1 = nn.GELU(approximate=approximate)
        self.fc2 = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden, eps=eps)
        self.act2 = nn.GELU(approximate=approximate)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        x = self.act1(self.norm1(self.fc1(self.flatten(x))))
        x = self.act2(self.norm2(self.fc2(x)))
        return self.head(x)


def gelu_mlp(width=64, classes=10, features=64):
    return GeluMLP(features, width, classes)


def gelu_mlp_tanh(width=64, classes=10, features=64):
    """A porting mistake: the tanh approximation of gelu where the Keras side has the exact form."""
    return GeluMLP(features, width, classes, approximate="tanh")

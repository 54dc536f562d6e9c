"""PyTorch sides that carry a classic porting mistake each, against the faithful Keras port
small_resnet_keras.py (the mistake made when porting from Keras to torch):

    --set model.torch=mistaken_torch:flatten_hwc
"""

from small_resnet_torch import ACTIVATIONS, SmallResNet
from torch import nn


class FlattenHWC(nn.Module):
    """Flattens N,C,H,W in H,W,C order (Keras's), where the weights of the dense layer after it
    are laid out for torch's C,H,W."""

    def forward(self, x):
        return x.permute(0, 2, 3, 1).flatten(1)


def flatten_hwc(width=8, classes=10, side=8, channels=1, act="relu", blocks=1):
    return SmallResNet(
        width, classes, side, channels, act=ACTIVATIONS[act], flatten=FlattenHWC, blocks=blocks
    )


def no_bias(width=8, classes=10, side=8, channels=1, act="relu", blocks=1):
    """block1.conv1 without its bias, where the Keras port has one."""
    return SmallResNet(
        width, classes, side, channels, act=ACTIVATIONS[act], bias=False, blocks=blocks
    )


def gelu_tanh(width=8, classes=10, side=8, channels=1, act="gelu", blocks=1):
    """nn.GELU(approximate="tanh") where Keras's gelu is the exact erf form."""
    return SmallResNet(width, classes, side, channels, act=lambda: nn.GELU(approximate="tanh"))

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


def flatten_hwc(width=8, classes=10, side=8, channels=1, act="relu", blocks=1, bn=False):
    return SmallResNet(
        width, classes, side, channels, act=ACTIVATIONS[act], flatten=FlattenHWC, blocks=blocks
    )


def no_bias(width=8, classes=10, side=8, channels=1, act="relu", blocks=1, bn=False):
    """block1.conv1 without its bias, where the Keras port has one."""
    return SmallResNet(
        width, classes, side, channels, act=ACTIVATIONS[act], bias=False, blocks=blocks
    )


def gelu_tanh(width=8, classes=10, side=8, channels=1, act="gelu", blocks=1, bn=False):
    """nn.GELU(approximate="tanh") where Keras's gelu is the exact erf form."""
    return SmallResNet(width, classes, side, channels, act=lambda: nn.GELU(approximate="tanh"))


def keras_numbers_batchnorm(width=8, classes=10, side=8, channels=1, act="relu", blocks=1, bn=True):
    """A torch port of a Keras model that copied Keras's BatchNormalization numbers
    (momentum=0.99, epsilon=1e-3) into nn.BatchNorm2d, whose momentum is the weight of the new
    batch statistic (Keras's 0.99 is torch's 0.01)."""
    model = SmallResNet(width, classes, side, channels, act=ACTIVATIONS[act], blocks=blocks, bn=bn)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.momentum, m.eps = 0.99, 1e-3
    return model


def with_dropout(width=8, classes=10, side=8, channels=1, act="relu", blocks=1, bn=False):
    """nn.Dropout before the last layer where the Keras side has none: refused before launch (the
    two sides' dropouts are matched in forward order)."""
    model = SmallResNet(width, classes, side, channels, act=ACTIVATIONS[act], blocks=blocks, bn=bn)
    model.flatten = nn.Sequential(nn.Flatten(), nn.Dropout(0.1))
    return model

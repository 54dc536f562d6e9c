"""A small residual CNN written in PyTorch, as a team would write it (the torch side of
configs/port_resnet.yaml; its Keras port is small_resnet_keras.py).

stem conv 3x3 -> residual block -> strided residual block (1x1 stride-2 shortcut) -> flatten ->
dense. Inputs NCHW, outputs one logit per class. With ``drop`` > 0: nn.Dropout(drop) after the
first block (nn.Dropout2d with ``spatial``: whole channels) and before the dense layer.
"""

from torch import nn


class Block(nn.Module):
    """relu(conv(relu(conv(x))) + shortcut(x)); with stride 2 the shortcut is a 1x1 stride-2
    conv."""

    def __init__(self, c_in, c_out, stride=1, act=nn.ReLU, bias=True, bn=False, bn_bias=False):
        super().__init__()
        # with bn: a BatchNorm2d after the first conv (torch's defaults: momentum 0.1, eps 1e-5),
        # and that conv without a bias (the batchnorm subtracts it again: it has no gradient),
        # unless bn_bias
        self.conv1 = nn.Conv2d(
            c_in, c_out, 3, stride=stride, padding=1, bias=bias and (not bn or bn_bias)
        )
        self.bn1 = nn.BatchNorm2d(c_out) if bn else nn.Identity()
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.shortcut = (
            nn.Conv2d(c_in, c_out, 1, stride=stride) if stride != 1 or c_in != c_out else None
        )
        self.act = act()

    def forward(self, x):
        y = self.conv2(self.act(self.bn1(self.conv1(x))))
        skip = x if self.shortcut is None else self.shortcut(x)
        return self.act(y + skip)


ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}  # nn.GELU: the exact erf form


class SmallResNet(nn.Module):
    def __init__(
        self,
        width=8,
        classes=10,
        side=8,
        channels=1,
        act=nn.ReLU,
        bias=True,
        flatten=nn.Flatten,
        blocks=1,
        bn=False,
        bn_bias=False,
        drop=0.0,
        spatial=False,
    ):
        super().__init__()
        self.stem = nn.Conv2d(channels, width, 3, padding=1)
        self.act = act()
        self.block1 = Block(width, width, act=act, bias=bias, bn=bn, bn_bias=bn_bias)
        # blocks - 1 more stride-1 blocks (a deeper model for the locator's timing)
        self.more = nn.Sequential(
            *[Block(width, width, act=act, bn=bn, bn_bias=bn_bias) for _ in range(blocks - 1)]
        )
        self.block2 = Block(width, 2 * width, stride=2, act=act, bn=bn, bn_bias=bn_bias)
        self.flatten = flatten()
        # dropout (drop > 0): on the first block's feature maps, and on the dense layer's input
        self.drop_maps = (nn.Dropout2d if spatial else nn.Dropout)(drop) if drop else None
        self.drop_fc = nn.Dropout(drop) if drop else None
        self.fc = nn.Linear(2 * width * (side // 2) ** 2, classes)

    def forward(self, x):
        x = self.block1(self.act(self.stem(x)))
        if self.drop_maps is not None:
            x = self.drop_maps(x)
        x = self.flatten(self.block2(self.more(x)))
        return self.fc(x if self.drop_fc is None else self.drop_fc(x))


def small_resnet(
    width=8,
    classes=10,
    side=8,
    channels=1,
    act="relu",
    blocks=1,
    bn=False,
    bn_bias=False,
    drop=0.0,
    spatial=False,
):
    return SmallResNet(
        width,
        classes,
        side,
        channels,
        act=ACTIVATIONS[act],
        blocks=blocks,
        bn=bn,
        bn_bias=bn_bias,
        drop=drop,
        spatial=spatial,
    )

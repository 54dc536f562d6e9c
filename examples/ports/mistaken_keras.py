"""Keras ports of small_resnet_torch.py that carry a classic porting mistake each (tests and
docs/own-models.md): pair one with the faithful torch side and ``dualtrain compare`` fails with
"semantics differ".

    --set model.keras=mistaken_keras:same_padding_strided
"""

from small_resnet_keras import build


def same_padding_strided(width=8, classes=10, side=8, channels=1, act="relu", blocks=1):
    """The stride-2 convolution as padding="same": Keras pads (0, 1) rows and columns there, torch's
    padding=1 pads (1, 1)."""
    return build(width, classes, side, channels, act, same_strided=True, blocks=blocks)


def softmax_inside(width=8, classes=10, side=8, channels=1, act="relu", blocks=1):
    """A softmax on the last layer, while the loss (torch's cross_entropy, dualtrain's) takes
    logits."""
    return build(width, classes, side, channels, act, head="softmax", blocks=blocks)


def gelu_approximate(width=8, classes=10, side=8, channels=1, act="gelu", blocks=1):
    """gelu's tanh approximation where torch's nn.GELU() is the exact erf form."""
    import keras

    def approx(x):
        return keras.activations.gelu(x, approximate=True)

    return build(width, classes, side, channels, approx, blocks=blocks)

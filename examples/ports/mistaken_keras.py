"""Keras ports of small_resnet_torch.py that carry a classic porting mistake each (tests and
docs/own-models.md): pair one with the faithful torch side and ``dualtrain compare`` fails with
"semantics differ".

    --set model.keras=mistaken_keras:same_padding_strided
"""

from small_resnet_keras import build


def same_padding_strided(width=8, classes=10, side=8, channels=1, act="relu", blocks=1, bn=False):
    """The stride-2 convolution as padding="same": Keras pads (0, 1) rows and columns there, torch's
    padding=1 pads (1, 1)."""
    return build(width, classes, side, channels, act, same_strided=True, blocks=blocks)


def softmax_inside(width=8, classes=10, side=8, channels=1, act="relu", blocks=1, bn=False):
    """A softmax on the last layer, while the loss (torch's cross_entropy, dualtrain's) takes
    logits."""
    return build(width, classes, side, channels, act, head="softmax", blocks=blocks)


def gelu_approximate(width=8, classes=10, side=8, channels=1, act="gelu", blocks=1, bn=False):
    """gelu's tanh approximation where torch's nn.GELU() is the exact erf form."""
    import keras

    def approx(x):
        return keras.activations.gelu(x, approximate=True)

    return build(width, classes, side, channels, approx, blocks=blocks)


def keras_batchnorm(width=8, classes=10, side=8, channels=1, act="relu", blocks=1, bn=True):
    """Keras's own BatchNormalization with torch's numbers translated (momentum 0.9 = torch's 0.1,
    epsilon 1e-5): still not torch's, since Keras keeps the biased batch variance in its moving
    variance where torch keeps the unbiased one."""
    import keras

    def norm(name):
        return keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name=name)

    return build(width, classes, side, channels, act, blocks=blocks, bn=norm)


def keras_batchnorm_defaults(
    width=8, classes=10, side=8, channels=1, act="relu", blocks=1, bn=True
):
    """Keras's BatchNormalization with its defaults (momentum 0.99, epsilon 1e-3) for torch's
    BatchNorm2d (momentum 0.1 = Keras's 0.9, eps 1e-5)."""
    import keras

    def norm(name):
        return keras.layers.BatchNormalization(name=name)

    return build(width, classes, side, channels, act, blocks=blocks, bn=norm)


def with_dropout(width=8, classes=10, side=8, channels=1, act="relu", blocks=1, bn=False):
    """keras.layers.Dropout before the last layer where the torch side has none: refused before
    launch (the two sides' dropouts are matched in forward order)."""
    import keras

    base = build(width, classes, side, channels, act, blocks=blocks)
    x = keras.layers.Dropout(0.1, name="drop")(base.get_layer("flatten").output)
    return keras.Model(base.inputs, base.get_layer("fc")(x))


def dropout_rate(width=8, classes=10, side=8, channels=1, act="relu", blocks=1, drop=0.25):
    """The dense layer's dropout at another rate than torch's (a number mistyped in the port):
    refused before launch, naming both layers."""
    import keras

    base = build(width, classes, side, channels, act, blocks=blocks, drop=drop)
    x = keras.layers.Dropout(drop / 2, name="drop_fc")(base.get_layer("flatten").output)
    return keras.Model(base.inputs, base.get_layer("fc")(x))


def dropout_misplaced(width=8, classes=10, side=8, channels=1, act="relu", blocks=1, drop=0.25):
    """The feature-map dropout before the first residual block where torch has it after: the same
    shape there, so the pair is accepted, and the fp64 pair fails at step 1."""
    return build(
        width, classes, side, channels, act, blocks=blocks, drop=drop, drop_before_block1=True
    )

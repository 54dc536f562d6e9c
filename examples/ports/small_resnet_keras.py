"""The Keras 3 port of small_resnet_torch.py (the Keras side of configs/port_resnet.yaml), a
faithful one: inputs NHWC; torch's ``padding=1`` is Keras's ``padding="same"`` for the stride-1
3x3 convolutions, and an explicit ZeroPadding2D(1) before a ``valid`` convolution for the
stride-2 one (Keras's ``same`` pads a strided convolution on the bottom/right only); the
residual add takes (body, shortcut) in the order torch computes them, so the layers'
order matches the torch forward's and the automatic weight map pairs them.
"""

import keras
from keras import layers


def _block(x, c_out: int, stride: int, name: str, act: str = "relu", same_strided: bool = False):
    c_in = x.shape[-1]
    if stride == 1:
        y = layers.Conv2D(c_out, 3, padding="same", name=f"{name}_conv1")(x)
    elif same_strided:  # what a port often does, and what differs: Keras pads bottom/right only
        y = layers.Conv2D(c_out, 3, strides=stride, padding="same", name=f"{name}_conv1")(x)
    else:
        y = layers.ZeroPadding2D(1, name=f"{name}_pad")(x)
        y = layers.Conv2D(c_out, 3, strides=stride, name=f"{name}_conv1")(y)
    y = layers.Activation(act, name=f"{name}_act1")(y)
    y = layers.Conv2D(c_out, 3, padding="same", name=f"{name}_conv2")(y)
    skip = x
    if stride != 1 or c_in != c_out:
        skip = layers.Conv2D(c_out, 1, strides=stride, name=f"{name}_shortcut")(x)
    y = layers.Add(name=f"{name}_add")([y, skip])
    return layers.Activation(act, name=f"{name}_out")(y)


def build(
    width=8, classes=10, side=8, channels=1, act="relu", same_strided=False, head=None, blocks=1
):
    # Keras's "gelu" is the exact erf form by default (approximate=False), as torch's nn.GELU
    inp = keras.Input((side, side, channels), name="x")
    x = layers.Conv2D(width, 3, padding="same", name="stem")(inp)
    x = layers.Activation(act, name="stem_act")(x)
    x = _block(x, width, 1, "block1", act)
    for j in range(blocks - 1):
        x = _block(x, width, 1, f"more{j}", act)
    x = _block(x, 2 * width, 2, "block2", act, same_strided)
    x = layers.Flatten(name="flatten")(x)
    x = layers.Dense(classes, activation=head, name="fc")(x)
    return keras.Model(inp, x, name="small_resnet")


def small_resnet(width=8, classes=10, side=8, channels=1, act="relu", blocks=1):
    return build(width, classes, side, channels, act, blocks=blocks)

"""The Keras 3 port of small_resnet_torch.py (the Keras side of configs/port_resnet.yaml), a
faithful one: inputs NHWC; torch's ``padding=1`` is Keras's ``padding="same"`` for the stride-1
3x3 convolutions, and an explicit ZeroPadding2D(1) before a ``valid`` convolution for the
stride-2 one (Keras's ``same`` pads a strided convolution on the bottom/right only); the
residual add takes (body, shortcut) in the order torch computes them, so the layers'
order matches the torch forward's and the automatic weight map pairs them. Dropout (``drop`` >
0) where the torch side has it: Keras's Dropout (SpatialDropout2D with ``spatial``), which
dualtrain gives the torch side's masks in training.
"""

import keras
from keras import layers


def _block(x, c_out, stride, name, act="relu", same_strided=False, bn=None, bn_bias=False):
    c_in = x.shape[-1]
    bias = bn is None or bn_bias  # no bias before a batchnorm, as on the torch side
    if stride == 1:
        y = layers.Conv2D(c_out, 3, padding="same", use_bias=bias, name=f"{name}_conv1")(x)
    elif same_strided:  # what a port often does, and what differs: Keras pads bottom/right only
        y = layers.Conv2D(
            c_out, 3, strides=stride, padding="same", use_bias=bias, name=f"{name}_conv1"
        )(x)
    else:
        y = layers.ZeroPadding2D(1, name=f"{name}_pad")(x)
        y = layers.Conv2D(c_out, 3, strides=stride, use_bias=bias, name=f"{name}_conv1")(y)
    if bn is not None:  # a factory of the batchnorm layer: the port's choice
        y = bn(name=f"{name}_bn1")(y)
    y = layers.Activation(act, name=f"{name}_act1")(y)
    y = layers.Conv2D(c_out, 3, padding="same", name=f"{name}_conv2")(y)
    skip = x
    if stride != 1 or c_in != c_out:
        skip = layers.Conv2D(c_out, 1, strides=stride, name=f"{name}_shortcut")(x)
    y = layers.Add(name=f"{name}_add")([y, skip])
    return layers.Activation(act, name=f"{name}_out")(y)


def build(
    width=8,
    classes=10,
    side=8,
    channels=1,
    act="relu",
    same_strided=False,
    head=None,
    blocks=1,
    bn=None,
    bn_bias=False,
    drop=0.0,
    spatial=False,
    drop_before_block1=False,
):
    # Keras's "gelu" is the exact erf form by default (approximate=False), as torch's nn.GELU
    inp = keras.Input((side, side, channels), name="x")
    x = layers.Conv2D(width, 3, padding="same", name="stem")(inp)
    x = layers.Activation(act, name="stem_act")(x)
    drop_maps = (layers.SpatialDropout2D if spatial else layers.Dropout)(drop, name="drop_maps")
    if drop_before_block1:  # mistaken_keras.dropout_misplaced
        x = drop_maps(x)
    x = _block(x, width, 1, "block1", act, bn=bn, bn_bias=bn_bias)
    if drop and not drop_before_block1:
        x = drop_maps(x)
    for j in range(blocks - 1):
        x = _block(x, width, 1, f"more{j}", act, bn=bn, bn_bias=bn_bias)
    x = _block(x, 2 * width, 2, "block2", act, same_strided, bn=bn, bn_bias=bn_bias)
    x = layers.Flatten(name="flatten")(x)
    if drop:
        x = layers.Dropout(drop, name="drop_fc")(x)
    x = layers.Dense(classes, activation=head, name="fc")(x)
    return keras.Model(inp, x, name="small_resnet")


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
    # torch's BatchNorm2d as a Keras layer: torch's momentum convention and its unbiased running
    # variance (Keras's BatchNormalization has neither: mistaken_keras.keras_batchnorm)
    from dualtrain.backends.tf.port import TorchBatchNormalization

    norm = (lambda name: TorchBatchNormalization(momentum=0.1, eps=1e-5, name=name)) if bn else None
    return build(
        width,
        classes,
        side,
        channels,
        act,
        blocks=blocks,
        bn=norm,
        bn_bias=bn_bias,
        drop=drop,
        spatial=spatial,
    )

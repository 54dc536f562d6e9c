"""The Keras port of gelu_mlp_torch.py, written with Keras's own layers: Dense, LayerNormalization
(epsilon set to torch's 1e-5: Keras's default is 1e-3) and Activation("gelu") (Keras's gelu is
the exact erf form by default, as torch's nn.GELU()).
"""

import keras
from keras import layers


def gelu_mlp(width=64, classes=10, side=8, eps=1e-5):
    inp = keras.Input((side, side, 1), name="x")
    x = layers.Flatten(name="flatten")(inp)
    for i in (1, 2):
        x = layers.Dense(width, name=f"fc{i}")(x)
        x = layers.LayerNormalization(epsilon=eps, name=f"norm{i}")(x)
        x = layers.Activation("gelu", name=f"act{i}")(x)
    x = layers.Dense(classes, name="head")(x)
    return keras.Model(inp, x, name="gelu_mlp")


def gelu_mlp_keras_eps(width=64, classes=10, side=8):
    """A porting mistake: LayerNormalization's own epsilon (1e-3) where torch's is 1e-5."""
    return gelu_mlp(width, classes, side, eps=1e-3)


def erf_gelu(x):
    """gelu written out by hand, as teams do for an exact port (the constant in float64)."""
    return x * 0.5 * (1.0 + keras.ops.erf(x * 0.7071067811865476))


def gelu_mlp_own_activation(width=64, classes=10, side=8):
    """The port with the team's own activation function (Activation(erf_gelu)): its export needs
    this module to load."""
    inp = keras.Input((side, side, 1), name="x")
    x = layers.Flatten(name="flatten")(inp)
    for i in (1, 2):
        x = layers.Dense(width, name=f"fc{i}")(x)
        x = layers.LayerNormalization(epsilon=1e-5, name=f"norm{i}")(x)
        x = layers.Activation(erf_gelu, name=f"act{i}")(x)
    x = layers.Dense(classes, name="head")(x)
    return keras.Model(inp, x, name="gelu_mlp")

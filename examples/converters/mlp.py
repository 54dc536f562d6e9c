"""A PyTorch MLP and a team's own converter to Keras (configs/converted_mlp.yaml): the converter
takes the torch module dualtrain built and returns the Keras model it makes of it, as converters
do (nobuco, KerasHub's, a team's script). dualtrain learns the weight map from what it does.

    dualtrain compare --config configs/converted_mlp.yaml
"""

import numpy as np
from torch import nn


class Mlp(nn.Module):
    """8x8 digits -> flatten -> dense -> relu -> dense."""

    def __init__(self, width=32, classes=10):
        super().__init__()
        self.hidden = nn.Linear(64, width)
        self.out = nn.Linear(width, classes)

    def forward(self, x):
        return self.out(self.hidden(x.flatten(1)).relu())


def mlp(width=32, classes=10):
    return Mlp(width, classes)


def to_keras(module, transpose=True):
    """The Keras port of ``module``, its weights copied (Linear (out, in) -> Dense (in, out))."""
    import keras  # the converter brings Keras itself

    state = {k: v.detach().numpy() for k, v in module.state_dict().items()}
    width, classes = state["hidden.weight"].shape[0], state["out.weight"].shape[0]
    net = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(width, activation="relu", name="hidden"),
            keras.layers.Dense(classes, name="out"),
        ]
    )
    for name in ("hidden", "out"):
        w = state[f"{name}.weight"]
        net.get_layer(name).set_weights(
            [w.T if transpose else w.reshape(w.T.shape), state[f"{name}.bias"]]
        )
    return net


def to_keras_untransposed(module):
    """A converter with a classic mistake: the weights reshaped, not transposed."""
    return to_keras(module, transpose=False)


def to_keras_rescaled(module):
    """A converter that changes values (it halves the output layer's bias)."""
    net = to_keras(module)
    kernel, bias = net.get_layer("out").get_weights()
    net.get_layer("out").set_weights([kernel, bias * np.float32(0.5)])
    return net


def to_keras_raises(module):
    raise RuntimeError("this converter does not know the module")


def to_keras_not_a_model(module):
    return {"hidden": module.hidden.weight.detach().numpy()}

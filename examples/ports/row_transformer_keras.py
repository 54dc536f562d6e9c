"""The Keras 3 port of row_transformer_torch.py, faithful: the rows as 8 tokens, a Dense embedding,
``Pos`` (the position parameter, zeros), pre-LN blocks of Keras's LayerNormalization (torch's
epsilon 1e-5), MultiHeadAttention (key_dim = width / heads) and a relu feed forward, then
LayerNormalization, the mean over the tokens and a Dense head.

``eps_keras`` and ``gelu_act`` are the same port with one planted mistake each (LayerNormalization's
own epsilon 1e-3; gelu where torch's blocks use relu): the sweep's defects, which must FAIL at every
size (``--set model.keras=row_transformer_keras:eps_keras``).
"""

import keras
from keras import layers


@keras.saving.register_keras_serializable(package="row_transformer_keras")
class Pos(layers.Layer):
    """A learned position parameter added to the tokens (torch's ``self.pos``)."""

    def build(self, input_shape):
        self.pos = self.add_weight(shape=(1, *input_shape[1:]), initializer="zeros", name="pos")

    def call(self, x):
        return x + self.pos


def _port(eps=1e-5, act="relu"):
    def factory(width=64, heads=4, depth=2):
        inp = keras.Input((8, 8, 1), name="x")
        x = layers.Reshape((8, 8))(inp)
        x = layers.Dense(width)(x)
        x = Pos()(x)
        for _ in range(depth):
            h = layers.LayerNormalization(epsilon=eps)(x)
            x = layers.Add()([x, layers.MultiHeadAttention(heads, width // heads)(h, h)])
            h = layers.LayerNormalization(epsilon=eps)(x)
            h = layers.Dense(width)(layers.Dense(4 * width, activation=act)(h))
            x = layers.Add()([x, h])
        x = layers.GlobalAveragePooling1D()(layers.LayerNormalization(epsilon=eps)(x))
        return keras.Model(inp, layers.Dense(10)(x))

    return factory


model = _port()
eps_keras = _port(eps=1e-3)
gelu_act = _port(act="gelu")

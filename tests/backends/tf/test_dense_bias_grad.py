"""dualtrain's Dense on TF sums its bias's gradient as accurately as torch does under bf16
autocast (float32 accumulation, rounded once): its bias add is AddV2, whose gradient is a
reduce_sum. Keras's own Dense adds the bias with tf.nn.bias_add, whose BiasAddGrad in bfloat16 put
a vision transformer's dense-bias gradients 5-35x further from the exact step than torch's (the
local gradient check at 0.74 of its cross bound; 0.08 with this layer)."""

import numpy as np
import pytest


@pytest.mark.parametrize("shape", [(64, 16, 32), (1024, 32)])
def test_bias_gradient_sums_rows_in_float32(shape):
    import keras
    import tensorflow as tf

    from dualtrain.backends.tf.layers import Dense

    g = tf.cast(tf.random.stateless_normal(shape, seed=(3, 4)), tf.bfloat16)
    rows = tuple(range(len(shape) - 1))
    exact = np.asarray(tf.reduce_sum(tf.cast(g, tf.float64), rows))
    scale = np.asarray(tf.reduce_sum(tf.abs(tf.cast(g, tf.float64)), rows))
    x = tf.cast(tf.random.stateless_normal((*shape[:-1], 8), seed=(5, 6)), tf.bfloat16)

    def bias_grad(kind):
        layer = kind(shape[-1], dtype="mixed_bfloat16")
        layer.build(x.shape)
        with tf.GradientTape() as tape:
            y = layer(x)
        grad = tape.gradient(y, layer.bias, output_gradients=g)
        return np.median(np.abs(np.asarray(grad, np.float64) - exact) / scale) / 2.0**-8

    ours, keras_own = bias_grad(Dense), bias_grad(keras.layers.Dense)
    print(
        f"bias gradient error, median over features: ours {ours:.3g} u, Keras's {keras_own:.3g} u"
    )
    assert ours <= 0.05  # one rounding of the float32 sum to bfloat16: <= 0.5 u of |sum| <= scale
    # the check can fail: Keras's own Dense (BiasAddGrad) is off by more
    assert keras_own > 4 * ours


def test_conv_bias_gradient_sums_positions_in_float32():
    # the same for Conv2D (a ViT's patch embedding, any conv layer): Keras's own adds its bias
    # with tf.nn.bias_add too
    import keras
    import tensorflow as tf

    from dualtrain.backends.tf.layers import Conv2D

    x = tf.cast(tf.random.stateless_normal((64, 28, 28, 1), seed=(5, 6)), tf.bfloat16)
    g = tf.cast(tf.random.stateless_normal((64, 4, 4, 32), seed=(3, 4)), tf.bfloat16)
    exact = np.asarray(tf.reduce_sum(tf.cast(g, tf.float64), [0, 1, 2]))
    scale = np.asarray(tf.reduce_sum(tf.abs(tf.cast(g, tf.float64)), [0, 1, 2]))

    def bias_grad(kind):
        layer = kind(32, 7, strides=7, dtype="mixed_bfloat16")
        layer.build(x.shape)
        with tf.GradientTape() as tape:
            y = layer(x)
        grad = tape.gradient(y, layer.bias, output_gradients=g)
        return np.median(np.abs(np.asarray(grad, np.float64) - exact) / scale) / 2.0**-8

    ours, keras_own = bias_grad(Conv2D), bias_grad(keras.layers.Conv2D)
    print(f"conv bias gradient error: ours {ours:.3g} u, Keras's {keras_own:.3g} u")
    assert ours <= 0.05
    assert keras_own > 4 * ours

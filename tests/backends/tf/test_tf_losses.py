"""TensorFlow's loss kernels (backends/tf/ops.py) against each loss's NumPy reference, in
float64; Huber's is Keras's Huber() at its default delta."""

import numpy as np
import pytest

from dualtrain.core import losses
from dualtrain.core.losses import LOSSES, reference
from dualtrain.spec import Loss
from testkit.synth import loss_batch


@pytest.mark.parametrize("loss", list(Loss))
def test_tf_kernels_compute_the_reference(loss):
    import tensorflow as tf

    from dualtrain.backends.tf.ops import LOSS_OPS

    out, y = loss_batch(loss, 1, 32, 4)
    if LOSSES[loss].labels:  # TF's sparse cross-entropy takes int32 labels
        y = y.astype(np.int32)
    per, metric = reference(loss, out, y)
    o, t = tf.constant(out), tf.constant(y)
    assert np.isclose(float(losses.loss_sum(LOSS_OPS, loss, o, t)), per.sum(), rtol=1e-13)
    assert np.isclose(float(losses.metric_sum(LOSS_OPS, loss, o, t)), metric.sum(), rtol=1e-13)


def test_huber_is_keras_huber_at_its_default_delta():
    import keras
    import tensorflow as tf

    from dualtrain.backends.tf.ops import LOSS_OPS

    rng = np.random.default_rng(2)
    o, t = rng.standard_normal((64, 3)) * 2, rng.standard_normal((64, 3))
    got = np.asarray(tf.reduce_mean(LOSS_OPS.huber(tf.constant(o), tf.constant(t)), axis=1))
    want = np.asarray(keras.losses.Huber(reduction=None)(t, o))
    assert np.allclose(got, want, rtol=1e-6)  # Keras computes in the floatx, float32

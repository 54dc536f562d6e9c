"""dualtrain's own dropout layer on TF scales the kept units as torch does: in float32 for float16
and bfloat16 inputs, rounded once (torch's opmath for a tensor times a Python float); the scale
rounded to the input's dtype first would make every kept unit of a bf16 run 0.2% off at rate 0.25.
"""

import numpy as np
import pytest


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_kept_units_are_scaled_in_float32(dtype):
    import tensorflow as tf

    from dualtrain.backends.tf.layers import HashDropout

    rate = 0.25
    layer = HashDropout(rate, 0, (64,), seed=0, dtype=f"mixed_{dtype}")
    x = tf.cast(tf.random.stateless_normal((32, 64), seed=(1, 2)), dtype)
    ids = tf.range(32, dtype=tf.int64)
    out = layer([x, ids, tf.constant(1, tf.int64)], training=True)
    kept = np.asarray(tf.cast(out, tf.float32)) != 0
    wide = tf.cast(tf.cast(x, tf.float32) * (1.0 / (1.0 - rate)), dtype)  # torch's rule
    narrow = x * tf.constant(1.0 / (1.0 - rate), dtype)  # the scale in the input's dtype
    got, want = np.asarray(tf.cast(out, tf.float32)), np.asarray(tf.cast(wide, tf.float32))
    assert np.array_equal(got[kept], want[kept])
    # the check can fail: the two rules differ on these inputs
    assert not np.array_equal(np.asarray(tf.cast(narrow, tf.float32))[kept], want[kept])

"""The TF backend's dropout: masks bit-identical to dualtrain.core.dropout's (and so to torch's),
computed in canonical C,H,W element order on NHWC activations, and different for different samples
on the same replica or across replicas (Keras's own Dropout under tf.distribute gives every replica
the same mask)."""

from testkit.tf_runs import run_python

SCRIPT = r"""
import numpy as np
import tensorflow as tf
tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
from dualtrain.core.dropout import NUMPY, keep
from dualtrain.backends.tf.layers import INT_OPS, HashDropout

ids = np.arange(3, 3000, 11, dtype=np.int64)
el = np.arange(8 * 13 * 13, dtype=np.int64)
for seed, step, layer, rate in [(0, 1, 2, 0.5), (7, 123456, 5, 0.25), (2**32 - 1, 2**31, 9, 0.1)]:
    ref = keep(NUMPY, seed, np.int64(step), ids, layer, el, rate)
    got = keep(INT_OPS, seed, tf.fill([len(ids)], tf.constant(step, tf.int64)), tf.constant(ids),
               layer, tf.constant(el), rate).numpy()
    assert np.array_equal(got, ref), (seed, step)
print("ok masks")

# NHWC activations get the canonical (C, H, W) mask, transposed
layer = HashDropout(0.25, 2, (8, 13, 13), 0, dtype="float64")
x = tf.ones([3, 13, 13, 8], tf.float64)
sample_ids = tf.constant([5, 6, 5], tf.int64)   # the same sample twice, another in between
y = layer([x, sample_ids, tf.fill([3], tf.constant(7, tf.int64))], training=True).numpy()
mask = keep(NUMPY, 0, np.int64(7), np.array([5, 6, 5]), 2, el, 0.25).reshape(3, 8, 13, 13)
assert np.array_equal(y != 0, mask.transpose(0, 2, 3, 1))
assert np.array_equal(y[0], y[2]) and not np.array_equal(y[0], y[1])  # per sample, not per batch
assert np.array_equal(layer([x, sample_ids, tf.zeros([3], tf.int64)], training=False).numpy(),
                      x.numpy())
print("ok layer")

# Two replicas of a MirroredStrategy feeding different samples get different masks; the same sample
# gets the same mask on either replica.
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    drop = HashDropout(0.5, 1, (16,), 0, dtype="float64")

def replica(per_replica_ids):
    i = tf.distribute.get_replica_context().replica_id_in_sync_group
    sid = tf.reshape(tf.gather(per_replica_ids, i), [1])
    return drop([tf.ones([1, 16], tf.float64), sid, tf.constant([3], tf.int64)], training=True)

for pair, same in (([10, 11], False), ([10, 10], True)):
    out = strategy.experimental_local_results(
        strategy.run(replica, args=(tf.constant(pair, tf.int64),)))
    a, b = (o.numpy() for o in out)
    assert np.array_equal(a, b) == same, (pair, a, b)
print("ok replicas")
"""


def test_tf_dropout_masks():
    proc = run_python("-c", SCRIPT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("ok") == 3, proc.stdout

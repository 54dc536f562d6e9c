"""The TF array namespace dualtrain.core.update_rules runs on (tensors and variables of the
parameter dtype, inside the step's tf.function)."""

from __future__ import annotations

import tensorflow as tf

from dualtrain.core.losses import HUBER_DELTA, LossOps
from dualtrain.core.ops import Ops


def fma(a: tf.Tensor, alpha: float | tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """``a + alpha * b`` rounded once to float32, as torch's ``a.add(b, alpha=alpha)`` computes it
    on CPU (a fused multiply-add; alpha is rounded to float32 first). Writing it as two float32 ops
    rounds twice: measured, that alone made 1-3% of the weights differ by one ulp after every SGD
    step, and plain SGD drifted 1e-3 apart in loss over an epoch. The float64 product of two float32
    values is exact, so one float64 add and one rounding reproduce the fused result.

    On float64 tensors (fp64 runs) ``alpha`` is used as the Python double it is (torch does the
    same) and the result is rounded twice; there is no wider type to fuse in, and one fp64 ulp per
    update is far below what the fp64 reference bound allows (docs/parity.md)."""
    f64 = tf.float64
    if a.dtype == f64:
        # tf.cast(0.9, f64) would go through a float32 constant first (0.899999976): a Python
        # number becomes a float64 constant directly. (The fp64 reference pair caught that
        # rounding: 2.5e-10 after two Nesterov steps, 1.6e-9 in the weights after 150 Adam steps
        # with weight decay.)
        return a + _to(alpha, f64) * b
    alpha32 = tf.cast(tf.cast(alpha, tf.float32), f64)
    return tf.cast(tf.cast(a, f64) + alpha32 * tf.cast(b, f64), tf.float32)


def _to(x: float | tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """A Python number becomes a constant of ``dtype`` directly (tf.cast would round it to float32
    first, see fma); a tensor is cast."""
    return tf.constant(x, dtype) if isinstance(x, (int, float)) else tf.cast(x, dtype)


OPS = Ops(
    # torch.nn.utils.clip_grad_norm_'s per-tensor norms, each over the flattened tensor
    norm=lambda x: tf.norm(tf.reshape(x, [-1])),
    stack=tf.stack,
    fma=fma,
    sqrt=tf.sqrt,
    where=tf.where,
    minimum=tf.minimum,
    maximum=tf.maximum,
    equal=tf.equal,
    logical_and=tf.logical_and,
    zeros_like=tf.zeros_like,
    cast=lambda x, like: _to(x, like.dtype),
    float64=lambda x: _to(x, tf.float64),
    power=tf.pow,
)


#: TensorFlow's own loss kernels for dualtrain.core.losses.
def huber_elementwise(d: tf.Tensor) -> tf.Tensor:
    """Huber's loss of the differences ``d``, elementwise (Keras's ``Huber``, torch's
    ``F.huber_loss``): d²/2 within delta, delta (|d| - delta/2) beyond."""
    a = tf.abs(d)
    return tf.where(a <= HUBER_DELTA, 0.5 * a * a, HUBER_DELTA * (a - 0.5 * HUBER_DELTA))


LOSS_OPS = LossOps(
    cross_entropy_sum=lambda out, y: tf.reduce_sum(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=out)
    ),
    binary_cross_entropy=lambda out, t: tf.nn.sigmoid_cross_entropy_with_logits(
        labels=t, logits=out
    ),
    squared_difference=tf.math.squared_difference,
    huber=lambda out, t: huber_elementwise(out - t),
    like=lambda y, out: tf.cast(y, out.dtype),
    mean_columns=lambda x: tf.reduce_mean(x, axis=1),
    total=tf.reduce_sum,
    equal=tf.equal,
    argmax=lambda out: tf.argmax(out, axis=1, output_type=tf.int32),
    count=lambda hit: tf.reduce_sum(tf.cast(hit, tf.float64)),
    fraction=lambda hit, out: tf.cast(hit, out.dtype),
    to_float64=lambda x: tf.cast(x, tf.float64),
)

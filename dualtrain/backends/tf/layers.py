"""dualtrain's own layers in Keras: Dense (its bias gradient summed as torch sums it), BatchNorm
(dualtrain.core.batchnorm on keras.ops, sync over the strategy's replicas), HashDropout
(dualtrain.core.dropout's masks), the exact gelu, and the conv2d with torch's padding. The model
builder (model.py) places them. pair_dropout_call: a model pair's dropout layers in training
(dualtrain.core.pair.dropout; pair.py puts it in place)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import keras
import tensorflow as tf

from dualtrain.core import batchnorm, dropout
from dualtrain.core.dropout import IntOps, canonical_elements
from dualtrain.core.pair import dropout as pair_dropout
from dualtrain.spec import Approximate, LayerSpec

# What the backend's annotations name. keras and tensorflow carry no type information (mypy reads
# them as Any, pyproject.toml), so these aliases check nothing; they tell the reader what a value
# is where ``Any`` would not.
Layer: TypeAlias = keras.layers.Layer
Model: TypeAlias = keras.Model
Variable: TypeAlias = keras.Variable
Tensor: TypeAlias = tf.Tensor


def batchnorm_ops(x: tf.Tensor) -> batchnorm.Ops:
    axes = list(range(len(x.shape) - 1))  # NHWC or (N, F): the channel is the last axis
    dtype = x.dtype

    # The per-channel sums accumulate in float64 (the contract of batchnorm.Ops.channel_sum): TF's
    # CPU reduce_sum over the outer axes adds sequentially, measured 28 u off on the 50,176 values
    # per channel of configs/mnist_resnet_bn.yaml's first batchnorm (torch's cascade sum: 0.7 u),
    # which made every fp32 gradient of that model 5e-3 off the exact step. The broadcast back to
    # x's shape happens in float64 too, so its gradient (a sum over the same axes) does as well.
    def channel_sum(t: tf.Tensor) -> tf.Tensor:
        return tf.cast(tf.reduce_sum(tf.cast(t, tf.float64), axis=axes), dtype)

    def expand(v: tf.Tensor) -> tf.Tensor:
        return tf.cast(tf.broadcast_to(tf.cast(v, tf.float64), tf.shape(x)), dtype)

    def count(t: tf.Tensor) -> tf.Tensor:
        shape = tf.shape(t)
        return tf.cast(tf.reduce_prod(shape[:-1]), t.dtype)

    # differentiable: ReplicaContext.all_reduce's gradient is an all-reduce
    def all_reduce(ts: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        return list(tf.distribute.get_replica_context().all_reduce(SUM, list(ts)))

    return batchnorm.Ops(
        channel_sum=channel_sum, count=count, expand=expand, all_reduce=all_reduce, sqrt=tf.sqrt
    )


SUM = tf.distribute.ReduceOp.SUM


class BatchNorm(keras.layers.Layer):
    """dualtrain.core.batchnorm on TF tensors (torch semantics; the channel is the last axis).
    Returns ``(y, mean, var)``: the batch mean and unbiased variance in training (global with
    ``sync`` when more than one replica is in sync), the running statistics in evaluation. It never
    assigns its running statistics: the engine does, from these outputs, on every replica alike."""

    def __init__(self, momentum: float, eps: float, sync: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.momentum, self.eps, self.sync = momentum, eps, sync

    def build(self, input_shape: tuple[Any, ...]) -> None:
        c = (int(input_shape[-1]),)
        add = lambda name, init, trainable: self.add_weight(  # noqa: E731
            shape=c, name=name, initializer=init, trainable=trainable, autocast=False
        )
        self.weight, self.bias = add("weight", "ones", True), add("bias", "zeros", True)
        self.running_mean = add("running_mean", "zeros", False)
        self.running_var = add("running_var", "ones", False)

    def compute_output_spec(
        self, x: keras.KerasTensor
    ) -> tuple[keras.KerasTensor, keras.KerasTensor, keras.KerasTensor]:
        c = (x.shape[-1],)
        stats = keras.KerasTensor(c, dtype=self.variable_dtype)
        return (
            keras.KerasTensor(x.shape, dtype=self.compute_dtype),
            stats,
            keras.KerasTensor(c, dtype=self.variable_dtype),
        )

    def call(
        self, x: tf.Tensor, training: bool | None = None
    ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        dtype = self.weight.value.dtype
        xs = tf.cast(x, dtype)  # the stats dtype, also under mixed precision
        ops = batchnorm_ops(xs)
        if training:
            ctx = tf.distribute.get_replica_context()
            sync = self.sync and ctx is not None and ctx.num_replicas_in_sync > 1
            mean, var, unbiased = batchnorm.batch_stats(ops, xs, sync)
            out_mean, out_var = mean, unbiased
        else:
            mean = out_mean = tf.convert_to_tensor(self.running_mean.value)
            var = out_var = tf.convert_to_tensor(self.running_var.value)
        y = batchnorm.normalize(ops, xs, mean, var, self.weight.value, self.bias.value, self.eps)
        return tf.cast(y, self.compute_dtype), out_mean, out_var


def _i64(v: int | tf.Tensor) -> tf.Tensor:
    return v if tf.is_tensor(v) else tf.constant(v, tf.int64)


INT_OPS = IntOps(
    xor=lambda a, b: tf.bitwise.bitwise_xor(_i64(a), _i64(b)),
    shr=lambda a, n: tf.bitwise.right_shift(a, _i64(n)),
    and_=lambda a, b: tf.bitwise.bitwise_and(_i64(a), _i64(b)),
)


class HashDropout(keras.layers.Layer):
    """Inverted dropout whose mask is dualtrain.core.dropout.keep, bit-identical to the torch
    backend's: element indices count the layer input in canonical (C, H, W) order, so an NHWC
    activation gets the mask computed for NCHW and transposed. Identity outside training."""

    def __init__(
        self, rate: float, layer: int, in_shape: tuple[int, ...], seed: int, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.rate, self.layer, self.in_shape, self.seed = rate, layer, tuple(in_shape), seed
        self.elements = canonical_elements(in_shape)

    def call(self, inputs: Sequence[tf.Tensor], training: bool | None = None) -> tf.Tensor:
        x, ids, steps = inputs
        if not training or self.rate == 0.0:
            return x
        keep = dropout.keep(
            INT_OPS, self.seed, steps, ids, self.layer, tf.constant(self.elements), self.rate
        )
        if len(self.in_shape) == 3:  # (N, C*H*W) canonical -> (N, H, W, C)
            keep = tf.transpose(tf.reshape(keep, [-1, *self.in_shape]), [0, 2, 3, 1])
        else:  # features (N, F) or tokens (N, T, D): the canonical order is the layout
            keep = tf.reshape(keep, [-1, *self.in_shape])
        # scaled as torch scales (in float32 for fp16/bf16; scaled)
        return tf.where(keep, scaled(x, 1.0 / (1.0 - self.rate)), tf.zeros_like(x))


def pair_mask(x: tf.Tensor, mask: pair_dropout.Mask) -> tf.Tensor:
    """A model pair's dropout of ``x`` with ``mask`` (dualtrain.core.pair.dropout): the torch
    side's mask, bit for bit, laid out as the Keras activation is (an NHWC activation takes the
    NCHW mask transposed, a Flatten's output of one that mask flattened as Keras flattens; a
    channel's mask covers its feature map, its channel first or last)."""
    e = mask.entry
    elements = tf.constant(pair_dropout.elements(e))
    keep = dropout.keep(INT_OPS, mask.seed, mask.step, mask.ids, mask.layer, elements, e.rate)
    rank, last = len(e.shape), e.keras_layout == pair_dropout.CHANNELS_LAST
    if e.kind == pair_dropout.CHANNEL:
        ones = [1] * (rank - 1)
        keep = tf.reshape(keep, [-1, *ones, e.shape[0]] if last else [-1, e.shape[0], *ones])
    elif last:  # (N, C*H*W) canonical -> (N, H, W, C)
        keep = tf.transpose(tf.reshape(keep, [-1, *e.shape]), [0, *range(2, rank + 1), 1])
    elif e.keras_layout == pair_dropout.FLATTEN_HWC and e.chw is not None:  # flattened H, W, C
        keep = tf.reshape(tf.transpose(tf.reshape(keep, [-1, *e.chw]), [0, 2, 3, 1]), tf.shape(x))
    else:
        keep = tf.reshape(keep, tf.shape(x))
    return tf.where(keep, scaled(x, 1.0 / (1.0 - e.rate)), tf.zeros_like(x))


def scaled(x: tf.Tensor, scale: float) -> tf.Tensor:
    """``x * scale`` as torch computes a tensor times a Python float: float16 and bfloat16 in
    float32, rounded once (torch's opmath; the scale in x's own dtype would be 4/3 -> 1.336 in
    bfloat16, every kept unit 0.2% high). tf.constant, not tf.cast: a Python float cast to
    float64 goes through float32 first."""
    wide = x.dtype if x.dtype in (tf.float32, tf.float64) else tf.float32
    return tf.cast(tf.cast(x, wide) * tf.constant(scale, wide), x.dtype)


def pair_dropout_call(
    layer: Layer, path: Callable[[], str], on_call: Callable[[tf.Tensor], None]
) -> Callable[..., tf.Tensor]:
    """The ``call`` a model pair's Keras dropout layer runs instead of its own: the pair's mask
    inside a training forward (dualtrain.core.pair.dropout.training_forward), the identity
    otherwise; ``on_call`` sees every input (the describe child records the calls)."""

    def call(inputs: tf.Tensor, training: bool | None = None) -> tf.Tensor:
        on_call(inputs)
        mask = pair_dropout.mask_for("keras", path(), float(layer.rate)) if training else None
        return inputs if mask is None else pair_mask(inputs, mask)

    return call


class Dense(keras.layers.Dense):
    """Keras's Dense, its bias added by TF's AddV2 instead of the tf.nn.bias_add Keras's ops.add
    picks for a bias-shaped second operand: BiasAddGrad sums the bias's gradient in the compute
    dtype, measured 5-35x torch's error in bfloat16 on a transformer's dense biases (1,024 rows of
    tokens summed), where AddV2's gradient (a reduce_sum) is as accurate as torch's
    float32-accumulated sum. The same function and variables; training only (the export keeps
    Keras's Dense)."""

    def call(self, inputs: tf.Tensor, training: bool | None = None) -> tf.Tensor:
        x = keras.ops.matmul(inputs, self.kernel)
        if self.bias is not None:
            x = tf.add(x, tf.cast(self.bias, x.dtype))
        return x


class Conv2D(keras.layers.Conv2D):
    """Keras's Conv2D (NHWC), its bias added by AddV2 as :class:`Dense`'s: under the avx2 setting
    (Eigen's BiasAddGrad) a ViT patch embedding's bias gradient in bfloat16 was 15-50x torch's
    error. Training only."""

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        out = self.convolution_op(inputs, self.kernel)
        if self.use_bias:
            out = tf.add(out, tf.cast(self.bias, out.dtype))
        return out


def silu(x: tf.Tensor) -> tf.Tensor:
    """x * sigmoid(x), in float32 for float16 and bfloat16 inputs and rounded once (torch's
    opmath); tf.nn.silu rounds the sigmoid and the product separately."""
    wide = tf.float32 if x.dtype in (tf.float16, tf.bfloat16) else x.dtype
    w = tf.cast(x, wide)
    return tf.cast(w * tf.sigmoid(w), x.dtype)


def tanh_gelu(x: tf.Tensor) -> tf.Tensor:
    """gelu's tanh form as torch's kernel computes it: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x +
    0.044715 * x^3))), the constants in the compute dtype (tf.nn.gelu's own tanh form casts
    0.044715 through float32: core.limits)."""
    beta = keras.ops.convert_to_tensor(0.7978845608028654, dtype=x.dtype)
    kappa = keras.ops.convert_to_tensor(0.044715, dtype=x.dtype)
    half = keras.ops.convert_to_tensor(0.5, dtype=x.dtype)
    return half * x * (1.0 + keras.ops.tanh(beta * (x + kappa * x * x * x)))


def exact_gelu(x: tf.Tensor) -> tf.Tensor:
    """The exact erf form, written as torch's CPU kernel computes it:
    x * 0.5 * (1 + erf(x * sqrt(1/2))), the constant in the compute dtype. Not
    keras/tf.nn.gelu(approximate=False): in float64 it is only float32-accurate (5e-9 absolute error
    against erfc, torch's 9e-16), which the fp64 reference pair reports as 6e-12 apart at step 1
    (docs/parity.md §5)."""
    half_sqrt = keras.ops.convert_to_tensor(0.7071067811865476, dtype=x.dtype)
    return x * 0.5 * (1.0 + keras.ops.erf(x * half_sqrt))


def conv2d(
    x: keras.KerasTensor, s: LayerSpec, name: str, policy: str, inference: bool = False
) -> tuple[keras.KerasTensor, keras.layers.Conv2D]:
    """(input, Conv2D layer) for a conv2d spec. An integer padding P is torch's: P zeros on every
    side (a ZeroPadding2D, then a 'valid' convolution), whatever the stride; Keras's own 'same' pads
    strided convolutions asymmetrically (extra row and column at the bottom and right), so dualtrain
    uses it only with stride 1, where both frameworks agree."""
    padding: Any = s.padding  # Padding | int, then Keras's padding string
    if isinstance(padding, int):
        if padding:
            x = keras.layers.ZeroPadding2D(padding, name=f"{name}_pad", dtype=policy)(x)
        padding = "valid"
    else:
        padding = padding.value
    return x, (keras.layers.Conv2D if inference else Conv2D)(
        s.filters,
        s.kernel_size,
        strides=s.stride or 1,
        padding=padding,
        use_bias=s.bias,
        name=name,
        dtype=policy,
    )


# the model builder's entry for gelu (model.LAYERS; b: its builder, r: the resolved layer)
def gelu_layer(b: Any, r: Any, name: str, x: keras.KerasTensor) -> keras.KerasTensor:
    """training: torch's formula (exact_gelu, tanh_gelu); inference (the export, which loads
    without dualtrain): Keras's own layers, its gelu for the erf form, the tanh form spelled out in
    Multiply, Rescaling and tanh (Keras has no tanh-gelu by name)."""
    tanh = r.spec.approximate is Approximate.TANH
    if not b.inference:
        fn = tanh_gelu if tanh else exact_gelu
        return keras.layers.Activation(fn, name=name, dtype=b.dtype())(x)
    if not tanh:
        return keras.layers.Activation("gelu", name=name, dtype=b.policy)(x)
    L, p = keras.layers, b.policy
    x3 = L.Multiply(name=f"{name}_x3", dtype=p)([x, x, x])
    inner = L.Add(name=f"{name}_in", dtype=p)(
        [x, L.Rescaling(0.044715, name=f"{name}_k", dtype=p)(x3)]
    )
    t = L.Activation("tanh", name=f"{name}_tanh", dtype=p)(
        L.Rescaling(0.7978845608028654, name=f"{name}_b", dtype=p)(inner)
    )
    half = L.Rescaling(0.5, offset=0.5, name=f"{name}_half", dtype=p)(t)
    return L.Multiply(name=name, dtype=p)([x, half])

"""Keras 3 model built from the framework-free layer list, with canonical <-> Keras weight
conversion.

Layouts (dualtrain.core.model): canonical dense weight (out, in) -> Keras kernel (in, out);
canonical conv weight OIHW -> Keras HWIO. Inputs are NHWC (the canonical NCHW batch transposed). A
flatten that receives a C,H,W tensor with C > 1 gets a ``Permute((3, 1, 2))`` in front of it, so
Keras flattens in torch's C,H,W order and the next dense kernel is just the transposed canonical
weight.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import keras
import numpy as np
import tensorflow as tf

from dualtrain.backends.tf import tokens
from dualtrain.backends.tf.layers import (
    BatchNorm,
    Dense,
    HashDropout,
    conv2d,
    gelu_layer,
    silu,
)
from dualtrain.core.model import (
    ResolvedLayer,
    conv_flatten_shape,
    has_layer,
    keras_layouts,
    resolve,
)
from dualtrain.core.weights import Weights
from dualtrain.spec import LayerType, ModelSpec

#: every layer's output tensor by its canonical prefix (build_model's taps: debug.dump_layers)
Taps = dict[str, keras.KerasTensor]


def keras_inputs(spec: ModelSpec, dtype: str) -> list[keras.KerasTensor]:
    """One keras.Input per model input: images (C, H, W) as NHWC, features as (F,)."""
    return [
        keras.Input(
            shape=(i.shape[1], i.shape[2], i.shape[0]) if len(i.shape) == 3 else i.shape,
            name=f"{i.name}_nhwc" if len(i.shape) == 3 else i.name,
            dtype=dtype,
        )
        for i in spec.inputs
    ]


def has_dropout(spec: ModelSpec) -> bool:
    return has_layer(spec, LayerType.DROPOUT)


def build_model(
    spec: ModelSpec, policy: str = "float32", seed: int = 0, taps: Taps | None = None
) -> tuple[keras.Model, list[tuple[str, keras.Variable]]]:
    """The Keras model and [(canonical name, Keras variable)] in canonical order: trainable
    parameters and batchnorm running statistics (``variable.trainable`` tells them apart).

    A model with dropout takes its inputs then two more, ``[*inputs, sample_ids, steps]`` (both
    int64, one per sample): its masks are a hash of them (dualtrain.core.dropout); without dropout
    it takes the inputs (one tensor for a one-input model). A model with batchnorm outputs
    ``[logits, mean_0, var_0, mean_1, ...]``: each batchnorm
    layer's batch mean and unbiased variance in training (the engine updates the running statistics
    from them, docs/parity.md §9), its running ones in evaluation. ``taps``, where given, is
    filled with every layer's output tensor by its canonical prefix (debug.dump_layers)."""
    reorder = conv_flatten_shape(spec)
    compute = keras.DTypePolicy(policy).compute_dtype
    inputs = keras_inputs(spec, "float64" if compute == "float64" else "float32")
    ids = steps = None
    if has_dropout(spec):
        ids = keras.Input(shape=(), name="sample_ids", dtype="int64")
        steps = keras.Input(shape=(), name="steps", dtype="int64")
    b = Builder(policy, seed, reorder, ids, steps)
    b.taps = taps
    x = b.model(resolve(spec), inputs)
    model = keras.Model(
        [*inputs, ids, steps] if ids is not None else (inputs if len(inputs) > 1 else inputs[0]),
        [x, *b.stats] if b.stats else x,
        name="dualtrain",
    )
    return model, b.named


def call_model(
    model: keras.Model,
    xs: list[tf.Tensor],
    *,
    dropout: bool,
    ids: tf.Tensor | None = None,
    step: tf.Tensor | int | None = None,
    training: bool = False,
) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """(logits, batchnorm statistics) of ``model`` on the batch ``xs`` (one tensor per model input,
    images NHWC). A model with dropout also gets each sample's id and the step (zeros outside
    training, where dropout is off)."""
    if dropout:
        n = tf.shape(xs[0])[:1]
        ids = tf.zeros(n, tf.int64) if ids is None else tf.cast(ids, tf.int64)
        steps = tf.zeros(n, tf.int64) if step is None else tf.fill(n, step)
        out = model([*xs, ids, steps], training=training)
    else:
        out = model(xs if len(xs) > 1 else xs[0], training=training)
    return (out[0], list(out[1:])) if isinstance(out, (list, tuple)) else (out, [])


class Builder:
    """Applies resolved layers to a Keras tensor, recording variables, batchnorm outputs and (where
    given ``taps``) every layer's output (the shape tokens.Builder describes). ``inference``:
    Keras's own layers where dualtrain has its own (backends/tf/export.py)."""

    def __init__(
        self,
        policy: str,
        seed: int,
        reorder: dict[str, tuple[int, int, int]],
        ids: keras.KerasTensor | None,
        steps: keras.KerasTensor | None,
        inference: bool = False,
    ) -> None:
        self.policy, self.seed, self.reorder, self.ids, self.steps = (
            policy,
            seed,
            reorder,
            ids,
            steps,
        )
        self.inference = inference
        self.named: list[tuple[str, keras.Variable]] = []
        self.stats: list[keras.KerasTensor] = []
        self.taps: Taps | None = None
        self.mixed = policy.startswith("mixed_")
        #: the token stream is float32 where torch's autocast leaves it float32 (backends/tf/tokens)
        self.wide = False

    def dtype(self) -> str:  # a layer computing in its input's dtype: float32 on a float32 stream
        return "float32" if self.wide and self.mixed else self.policy

    def model(
        self, layers: Sequence[ResolvedLayer], inputs: Sequence[keras.KerasTensor]
    ) -> keras.KerasTensor:
        """The model's layers on its inputs: with several, each input's branch, then the concat
        (layers[0]) of the branches' outputs, then the rest."""
        if len(inputs) == 1:
            return self.apply(layers, inputs[0])
        outs = [self.apply(branch, x) for branch, x in zip(layers[0].branches, inputs, strict=True)]
        x = keras.layers.Concatenate(axis=-1, name="l0_concat", dtype=self.policy)(outs)
        if self.taps is not None:
            self.taps[layers[0].prefix] = x
        return self.apply(layers[1:], x)

    def apply(self, layers: Sequence[ResolvedLayer], x: keras.KerasTensor) -> keras.KerasTensor:
        for r in layers:
            x = LAYERS[r.spec.type](
                self, r, f"l{r.prefix.replace('.', '_')}_{r.spec.type.value}", x
            )
            if self.taps is not None:
                self.taps[r.prefix] = x
        return x

    def weighted(
        self, r: ResolvedLayer, layer: keras.layers.Layer, x: keras.KerasTensor
    ) -> keras.KerasTensor:
        """``layer(x)``; the layer's kernel (and bias, if it has one) named as the canonical
        ones."""
        x = layer(x)
        self.wide = False  # a matmul's output: the compute dtype
        if r.params:
            # without a bias, r.params names the kernel only (and layer.bias is None)
            self.named += list(
                zip([n for n, _ in r.params], (layer.kernel, layer.bias), strict=False)
            )
        return x


# ---- the layer registry: one function per layer type, training and inference (export) alike ------
# Each takes (builder, resolved layer, Keras name, input) and returns the output. A new layer type
# adds one entry here (and one in backends/torch/model.py's LAYERS).


def _residual(b: Builder, r: ResolvedLayer, name: str, x: keras.KerasTensor) -> keras.KerasTensor:
    wide = b.wide
    body = b.apply(r.body, x)
    wide, b.wide = b.wide, wide
    skip = b.apply(r.shortcut, x)
    b.wide = b.wide or wide  # torch's add promotes to the wider side
    return keras.layers.Add(name=name, dtype=b.dtype())([body, skip])


def _conv(b: Builder, r: ResolvedLayer, name: str, x: keras.KerasTensor) -> keras.KerasTensor:
    x, layer = conv2d(x, r.spec, name, b.policy, b.inference)
    return b.weighted(r, layer, x)


def _flatten(b: Builder, r: ResolvedLayer, name: str, x: keras.KerasTensor) -> keras.KerasTensor:
    if r.prefix in b.reorder:  # NHWC -> NCHW first: flatten in torch's C,H,W order
        x = keras.layers.Permute(
            (3, 1, 2), name=f"l{r.prefix.replace('.', '_')}_to_chw", dtype=b.policy
        )(x)
    return keras.layers.Flatten(name=name, dtype=b.policy)(x)


def _dropout(b: Builder, r: ResolvedLayer, name: str, x: keras.KerasTensor) -> keras.KerasTensor:
    if b.inference:  # Keras's Dropout: the identity in inference
        return keras.layers.Dropout(r.spec.rate, name=name, dtype=b.policy)(x)
    rate = r.spec.rate
    assert rate is not None  # a dropout's rate is required (LayerSpec)
    return HashDropout(rate, r.uid, r.in_shape, b.seed, name=name, dtype=b.dtype())(
        [x, b.ids, b.steps]
    )


def _layernorm(b: Builder, r: ResolvedLayer, name: str, x: keras.KerasTensor) -> keras.KerasTensor:
    """Keras's LayerNormalization with torch's eps: the same function (in float32 for fp16/bf16
    inputs, as torch's autocast runs layer_norm; Keras casts the output back to the compute dtype,
    which the next dense layer's autocast does on torch)."""
    layer = keras.layers.LayerNormalization(axis=-1, epsilon=r.spec.eps, name=name, dtype=b.dtype())
    x = layer(x)
    b.named += list(zip([n for n, _ in r.params], (layer.gamma, layer.beta), strict=True))
    return x


def _batchnorm(b: Builder, r: ResolvedLayer, name: str, x: keras.KerasTensor) -> keras.KerasTensor:
    s = r.spec
    # LayerSpec fills a batchnorm's defaults (spec/layers.py)
    assert s.momentum is not None and s.eps is not None and s.sync is not None
    if b.inference:  # Keras's BatchNormalization with torch's eps and momentum convention
        layer = keras.layers.BatchNormalization(
            epsilon=s.eps,
            momentum=1.0 - s.momentum,
            name=name,
            dtype=b.policy,
        )
        x = layer(x)
        b.named += [
            (n, v)
            for (n, _), v in zip(
                r.arrays,
                (layer.gamma, layer.beta, layer.moving_mean, layer.moving_variance),
                strict=True,
            )
        ]
        return x
    layer = BatchNorm(s.momentum, s.eps, s.sync, name=name, dtype=b.policy)
    x, mean, var = layer(x)
    b.stats += [mean, var]
    b.named += [
        (n, v)
        for (n, _), v in zip(
            r.arrays,
            (layer.weight, layer.bias, layer.running_mean, layer.running_var),
            strict=True,
        )
    ]
    return x


def _concat(b: Builder, r: ResolvedLayer, name: str, x: keras.KerasTensor) -> keras.KerasTensor:
    # a concat has several inputs: Builder.model applies it, never Builder.apply
    raise RuntimeError(f"{name}: a concat layer is applied by the model builder")


def _pool(
    kind: type[keras.layers.Layer],
) -> Callable[[Builder, ResolvedLayer, str, keras.KerasTensor], keras.KerasTensor]:
    def apply(b: Builder, r: ResolvedLayer, name: str, x: keras.KerasTensor) -> keras.KerasTensor:
        s = r.spec
        return kind(
            s.pool_size, strides=s.stride or s.pool_size, padding="valid", name=name, dtype=b.policy
        )(x)

    return apply


def _activation(
    fn: str,
) -> Callable[[Builder, ResolvedLayer, str, keras.KerasTensor], keras.KerasTensor]:
    def apply(b: Builder, r: ResolvedLayer, name: str, x: keras.KerasTensor) -> keras.KerasTensor:
        return keras.layers.Activation(fn, name=name, dtype=b.dtype())(x)

    return apply


LAYERS = {
    LayerType.RESIDUAL: _residual,
    LayerType.DENSE: lambda b, r, name, x: b.weighted(
        r,
        (keras.layers.Dense if b.inference else Dense)(
            r.spec.units, use_bias=r.spec.bias, name=name, dtype=b.policy
        ),
        x,
    ),
    LayerType.CONV2D: _conv,
    LayerType.MAXPOOL2D: _pool(keras.layers.MaxPooling2D),
    LayerType.AVGPOOL2D: _pool(keras.layers.AveragePooling2D),
    # NHWC -> (N, C): torch's channel order
    LayerType.GLOBAL_AVGPOOL: lambda b, r, name, x: keras.layers.GlobalAveragePooling2D(
        name=name, dtype=b.policy
    )(x),
    LayerType.FLATTEN: _flatten,
    LayerType.RELU: lambda b, r, name, x: keras.layers.ReLU(name=name, dtype=b.dtype())(x),
    LayerType.TANH: _activation("tanh"),
    LayerType.SIGMOID: _activation("sigmoid"),
    # x * sigmoid(x) computed in float32 for fp16/bf16 and rounded once, as torch's kernel;
    # Keras's own silu in the export
    LayerType.SILU: lambda b, r, name, x: keras.layers.Activation(
        "silu" if b.inference else silu, name=name, dtype=b.dtype()
    )(x),
    LayerType.GELU: gelu_layer,
    LayerType.DROPOUT: _dropout,
    LayerType.BATCHNORM: _batchnorm,
    LayerType.LAYERNORM: _layernorm,
    LayerType.CONCAT: _concat,
    LayerType.PATCHES: tokens.patches,
    LayerType.POSITION: tokens.position,
    LayerType.ATTENTION: tokens.attention,
    LayerType.TOKEN_POOL: tokens.token_pool,
    LayerType.EMBEDDING: tokens.embedding,
}


def to_keras(layout: str, array: np.ndarray, dtype: str = "float32") -> np.ndarray:
    """Canonical array -> Keras ``layout`` (dualtrain.spec.layers: ``transpose`` a dense weight
    (out,in) -> (in,out); ``oihw_hwio`` a convolution's OIHW -> HWIO; ``identity``), as
    ``dtype``."""
    a = np.asarray(array, dtype=dtype)
    if layout == "transpose":
        a = a.T
    elif layout == "oihw_hwio":
        a = a.transpose(2, 3, 1, 0)
    return np.ascontiguousarray(a)


def to_canonical(layout: str, array: np.ndarray) -> np.ndarray:  # to_keras's inverse; float64 kept
    a = np.asarray(array)
    a = a if a.dtype == np.float64 else a.astype(np.float32, copy=False)
    if layout == "transpose":
        a = a.T
    elif layout == "oihw_hwio":
        a = a.transpose(3, 2, 0, 1)
    return np.ascontiguousarray(a)


class Conversion:
    """Canonical <-> Keras layout of every array by its canonical name (weights, gradients,
    optimizer slots): dualtrain's own layers as their types declare (``layouts``,
    dualtrain.core.model.keras_layouts); a model pair by its weight map
    (dualtrain.backends.tf.pair.PairConversion)."""

    def __init__(self, layouts: dict[str, str]) -> None:
        self.layouts = layouts

    @classmethod
    def of(cls, model: ModelSpec) -> Conversion:  # dualtrain's own layers, as declared
        return cls(keras_layouts(model))

    def to_keras(self, name: str, array: np.ndarray, dtype: str = "float32") -> np.ndarray:
        return to_keras(self.layouts[name], array, dtype)

    def to_canonical(self, name: str, array: np.ndarray) -> np.ndarray:
        return to_canonical(self.layouts[name], array)


def load_canonical(
    named: list[tuple[str, keras.Variable]], weights: Weights, layouts: dict[str, str]
) -> None:
    missing = [n for n, _ in named if n not in weights]
    if missing or len(weights) != len(named):
        raise ValueError(
            f"weights do not match the model: need {[n for n, _ in named]}, got {sorted(weights)}"
        )
    for name, var in named:
        value = to_keras(layouts[name], weights[name], var.dtype)
        if tuple(var.shape) != value.shape:
            raise ValueError(f"{name}: Keras shape {tuple(var.shape)} != converted {value.shape}")
        var.assign(value)


def export_canonical(named: list[tuple[str, keras.Variable]], layouts: dict[str, str]) -> Weights:
    return {
        name: to_canonical(layouts[name], keras.ops.convert_to_numpy(var.value))
        for name, var in named
    }


def to_nhwc(images_nchw: np.ndarray, dtype: str = "float32") -> np.ndarray:
    return np.ascontiguousarray(np.asarray(images_nchw, dtype=dtype).transpose(0, 2, 3, 1))

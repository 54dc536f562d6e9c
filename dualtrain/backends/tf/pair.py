"""The Keras side of a model pair (dualtrain.core.pair): the user's Keras 3 model, built from
``model.keras`` with ``model.args`` under the run's dtype policy, its variables in the canonical
(torch) names through the run's weight map, and its description for the driver's map."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from dualtrain.core import pair
from dualtrain.core.weights import Weights
from dualtrain.errors import UserError
from dualtrain.spec import Experiment, ModelSpec

from .model import Conversion

_KINDS = (
    (keras.layers.Dense, "dense"),
    (keras.layers.Conv2D, "conv2d"),
    (keras.layers.BatchNormalization, "batchnorm"),
)
_REFUSED = ((keras.layers.Dropout, "dropout"),)


def kind(layer: Any) -> str:
    return next((k for cls, k in _KINDS if isinstance(layer, cls)), "other")


def nhwc(shape: tuple[int, ...]) -> tuple[int, ...]:
    """One sample's Keras input shape: images (C, H, W) -> (H, W, C); features unchanged."""
    return (shape[1], shape[2], shape[0]) if len(shape) == 3 else tuple(shape)


def leaves(model: Any) -> list[Any]:
    """The model's leaf layers (no sublayers), in the model's own layer order."""
    out = []
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if not list(layer._flatten_layers(include_self=False, recursive=False)):
            out.append(layer)
    return out


def build_keras(model: ModelSpec, policy: str) -> Any:
    """The user's Keras model under ``policy`` (the run's: float64 for fp64, mixed_float16, ...),
    built on a zero batch of the data's input shapes."""
    assert model.keras is not None
    factory = pair.import_factory(model.keras, model.path, "model.keras")
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        net = pair.call_factory(factory, model.args, "model.keras")
    finally:
        keras.config.set_dtype_policy(previous)
    if not isinstance(net, keras.Model):
        raise UserError(
            f"model.keras: {model.keras} must return a keras.Model (Keras 3). Received: "
            f"{type(net).__module__}.{type(net).__name__}"
        )
    for layer in leaves(net):
        for cls, what in _REFUSED:
            if isinstance(layer, cls):
                raise UserError(
                    f"model.keras: layer {layer.name!r} is a {type(layer).__name__}: {what} "
                    f"layers are not supported in model pairs yet (Keras and torch draw their "
                    f"own masks, so the two sides would drop different units; "
                    f"docs/own-models.md); use dualtrain's own layers (model.layers) for a "
                    f"model with {what}. Received: {type(layer).__name__}"
                )
    xs = [np.zeros((2, *nhwc(i.shape)), "float32") for i in model.inputs]
    try:
        out = net(xs if len(xs) > 1 else xs[0], training=False)
    except Exception as exc:  # the user's model on the spec's input shapes
        shapes = ", ".join(
            f"{i.name} (N, {', '.join(map(str, nhwc(i.shape)))})" for i in model.inputs
        )
        raise UserError(
            f"model.keras: {type(net).__name__} fails on the data's inputs {shapes} (images "
            f"NHWC): {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}. "
            f"Received: model.inputs {[list(i.shape) for i in model.inputs]}"
        ) from None
    if isinstance(out, (list, tuple, dict)):
        raise UserError(
            f"model.keras: {type(net).__name__} must return one tensor (N, outputs). Received: "
            f"{type(out).__name__}"
        )
    pair.check_output(tuple(out.shape[1:]), "keras", type(net).__name__)
    return net


def _path(layer: Any) -> str:
    """A layer's name in the model (Keras 3's path where it has one)."""
    return getattr(layer, "path", None) or layer.name


def _plain(v: Any) -> Any:
    """A layer setting as JSON: tuples as lists, an activation function by its name."""
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, dict):  # a serialised function or object
        return str(v.get("config", v.get("class_name", v)))
    return getattr(v, "__name__", type(v).__name__)


def _flatten_hwc(layer: Any) -> list[int] | None:
    """A Dense layer fed by a Flatten of an (N, H, W, C) tensor: that (H, W, C)."""
    try:
        parents = layer._inbound_nodes[0].parent_nodes
    except (AttributeError, IndexError):
        return None
    if len(parents) != 1 or not isinstance(parents[0].operation, keras.layers.Flatten):
        return None
    shape = parents[0].input_tensors[0].shape
    before = parents[0].parent_nodes
    if (
        len(before) == 1
        and isinstance(before[0].operation, keras.layers.Permute)
        and tuple(before[0].operation.dims) == (3, 1, 2)
    ):
        return None  # permuted to C,H,W first: flattened in torch's order
    return [int(d) for d in shape[1:]] if len(shape) == 4 else None


def describe(spec: Experiment) -> dict[str, Any]:
    net = build_keras(spec.model, "float32")
    variables = []
    for layer in leaves(net):
        hwc = _flatten_hwc(layer) if kind(layer) == "dense" else None
        for v in layer.weights:
            variables.append(
                {
                    "path": v.path,
                    "shape": [int(d) for d in v.shape],
                    "trainable": bool(v.trainable),
                    "layer": _path(layer),
                    "kind": kind(layer),
                    "role": v.name,
                    "cls": type(layer).__name__,
                    "flatten_hwc": hwc,
                }
            )
    seen = {v["path"] for v in variables}
    stray = [v.path for v in net.weights if v.path not in seen]
    if stray:
        raise UserError(
            f"model.keras: variables outside any layer's weights: {stray[:3]}. Received: "
            f"{len(stray)} stray variable(s)"
        )
    layers = [
        {
            "name": _path(layer),
            "cls": type(layer).__name__,
            "kind": kind(layer),
            **{
                k: _plain(v)
                for k, v in layer.get_config().items()
                if k
                in ("strides", "padding", "use_bias", "activation", "momentum", "epsilon", "eps")
            },
        }
        for layer in leaves(net)
    ]
    out = net(
        [np.zeros((1, *nhwc(i.shape)), "float32") for i in spec.model.inputs]
        if len(spec.model.inputs) > 1
        else np.zeros((1, *nhwc(spec.model.inputs[0].shape)), "float32")
    )
    return {
        "factory": spec.model.keras,
        "cls": f"{type(net).__module__}.{type(net).__name__}",
        "output": [int(d) for d in out.shape[1:]],
        "keras": variables,
        "layers": layers,
        "digest": pair.source_digest(type(net)),
    }


def named_variables(net: Any, layout: pair.Layout) -> list[tuple[str, Any]]:
    """[(canonical name, Keras variable)] in the canonical (torch state dict) order."""
    by_path = {v.path: v for v in net.weights}
    entries = layout.by_torch()
    return [(a.name, by_path[entries[a.name].keras]) for a in layout.torch.torch]


def load_canonical(named: list[tuple[str, Any]], layout: pair.Layout, weights: Weights) -> None:
    entries = layout.by_torch()
    if set(weights) != {n for n, _ in named}:
        raise ValueError(f"weights do not match the pair: {sorted(weights)}")
    for name, var in named:
        value = pair.to_keras(entries[name], weights[name]).astype(var.dtype)
        if tuple(var.shape) != value.shape:
            raise ValueError(f"{name}: Keras shape {tuple(var.shape)} != mapped {value.shape}")
        var.assign(value)


def export_canonical(named: list[tuple[str, Any]], layout: pair.Layout) -> Weights:
    entries = layout.by_torch()
    out = {}
    for name, var in named:
        a = np.asarray(keras.ops.convert_to_numpy(var.value))
        a = a if a.dtype == np.float64 else a.astype(np.float32, copy=False)
        out[name] = pair.to_canonical(entries[name], a)
    return out


class PairConversion(Conversion):
    """A model pair's canonical <-> Keras layout, by its weight map's transforms."""

    def __init__(self, layout: pair.Layout):
        self.entries = layout.by_torch()

    def to_keras(self, name: str, array: np.ndarray, dtype: str = "float32") -> np.ndarray:
        return pair.to_keras(self.entries[name], np.asarray(array, dtype=dtype))

    def to_canonical(self, name: str, array: np.ndarray) -> np.ndarray:
        a = np.asarray(array)
        a = a if a.dtype == np.float64 else a.astype(np.float32, copy=False)
        return pair.to_canonical(self.entries[name], a)


#: one probe vector; an activation is told by what it makes of it (dualtrain.core.locate)
PROBE = np.linspace(-4.0, 4.0, 81)


def _to_torch_layout(a: np.ndarray, chw: tuple[int, int, int] | None = None) -> np.ndarray:
    """A Keras activation in torch's layout: NHWC -> NCHW; a flat H,W,C vector (a dense layer's
    input after a Flatten) -> C,H,W order."""
    a = np.asarray(a, np.float64)
    if a.ndim == 4:
        return np.ascontiguousarray(a.transpose(0, 3, 1, 2))
    if chw is not None and a.ndim == 2:
        c, h, w = chw
        return np.ascontiguousarray(
            a.reshape(-1, h, w, c).transpose(0, 3, 1, 2).reshape(len(a), -1)
        )
    return a


def _to_keras_layout(a: np.ndarray, chw: tuple[int, int, int] | None = None) -> np.ndarray:
    a = np.asarray(a, np.float64)
    if a.ndim == 4:
        return np.ascontiguousarray(a.transpose(0, 2, 3, 1))
    if chw is not None and a.ndim == 2:
        c, h, w = chw
        return np.ascontiguousarray(
            a.reshape(-1, c, h, w).transpose(0, 2, 3, 1).reshape(len(a), -1)
        )
    return a


def _padding_chain(layer: Any) -> list[Any]:
    """``layer`` with the ZeroPadding2D layers right before it (torch's padding=P is one of those
    and a 'valid' conv in a faithful port): what one torch module corresponds to."""
    chain = [layer]
    while True:
        try:
            parents = chain[0]._inbound_nodes[0].parent_nodes
        except (AttributeError, IndexError):
            return chain
        if len(parents) != 1 or not isinstance(parents[0].operation, keras.layers.ZeroPadding2D):
            return chain
        chain.insert(0, parents[0].operation)


def probe_layers(
    spec: Experiment,
    weights: Weights,
    layout: pair.Layout,
    inputs: list[np.ndarray],
    y: np.ndarray,
    torch_side: dict[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """The locator's Keras side, in float64, in torch's layouts: for each mapped layer, its input
    and output in the Keras forward (``kin/``, ``kout/``) and its output when fed the torch
    module's input (``fed/``: what the layer itself does); the activation every leaf layer applies
    to :data:`PROBE` (``act/``); each batchnorm's training-mode output and running statistics when
    fed the torch module's training-mode input (``tfed/``, ``fedrun/``); the model's output in
    inference and in training; the running statistics after the training forward; each
    parameter's gradient (training mode) in canonical names and layouts."""
    import tensorflow as tf

    from dualtrain.spec import Loss

    net = build_keras(spec.model, "float64")
    named = named_variables(net, layout)
    load_canonical(named, layout, weights)
    xs = [_to_keras_layout(a) for a in inputs]
    feed = xs if len(xs) > 1 else xs[0]
    out: dict[str, np.ndarray] = {}
    by_path = {_path(layer): layer for layer in leaves(net)}
    modules: dict[str, tuple[Any, tuple[int, int, int] | None]] = {}
    entries = layout.by_torch()
    for a in layout.torch.torch:
        e = entries[a.name]
        kv = next(v for v in layout.keras.keras if v.path == e.keras)
        modules.setdefault(a.module, (by_path[kv.layer], e.chw))
    chains = {m: _padding_chain(layer) for m, (layer, _) in modules.items()}
    try:  # a functional or Sequential model exposes each layer's input and output
        probes = [
            t for m, (layer, _) in modules.items() for t in (chains[m][0].input, layer.output)
        ]
        values = keras.Model(net.inputs, probes)(feed)
        for k, (module, (_, chw)) in enumerate(modules.items()):
            out[f"kin/{module}"] = _to_torch_layout(values[2 * k], chw)
            out[f"kout/{module}"] = _to_torch_layout(values[2 * k + 1])
    except (AttributeError, ValueError, TypeError):
        pass  # a subclassed model: no intermediate tensors (only what each layer does, below)
    for module, (_, chw) in modules.items():
        x = torch_side.get(f"in/{module}")
        if x is not None:
            v = _to_keras_layout(x, chw)
            for op in chains[module]:  # the padding before a 'valid' conv is part of it
                v = op(v)
            out[f"fed/{module}"] = _to_torch_layout(np.asarray(v))
    for path, layer in by_path.items():
        fn = getattr(layer, "activation", None)
        if fn is not None and not isinstance(layer, keras.layers.Activation):
            v = fn(PROBE[None, :])  # Dense/Conv2D's own activation argument
        elif not layer.weights:
            try:
                v = layer(PROBE[None, :])
            except Exception:  # a layer that is no activation (flatten, add, padding, ...)
                continue
        else:
            continue
        out[f"act/{path}"] = np.asarray(v, np.float64).reshape(-1)
    # training mode: what each batchnorm computes from the torch module's training-mode input
    # (``tfed/``) and the running statistics that one call leaves (``fedrun/``), from the same
    # starting values (restored after each call)
    norms: dict[str, list[str]] = {
        a.module: [] for a in layout.torch.torch if a.kind == "batchnorm"
    }
    for a in layout.torch.torch:
        if a.module in norms and not a.trainable:
            norms[a.module].append(a.name)
    variables = dict(named)
    for module, running in norms.items():
        x = torch_side.get(f"tin/{module}")
        if x is None or module not in modules:
            continue
        saved = [np.asarray(keras.ops.convert_to_numpy(variables[n].value)) for n in running]
        v = _to_keras_layout(x, modules[module][1])
        for op in chains[module]:
            v = op(v, training=True)
        out[f"tfed/{module}"] = _to_torch_layout(np.asarray(v))
        for n, value in zip(running, saved, strict=True):
            out[f"fedrun/{n}"] = np.asarray(keras.ops.convert_to_numpy(variables[n].value))
            variables[n].assign(value)
    out["output/eval"] = np.asarray(net(feed, training=False), np.float64)
    ys = tf.constant(y)
    with tf.GradientTape() as tape:
        logits = net(feed, training=True)
        if spec.model.loss is Loss.CROSS_ENTROPY:
            loss = tf.reduce_sum(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ys, logits=logits)
            )
        elif spec.model.loss is Loss.BINARY_CROSS_ENTROPY:
            t = tf.cast(ys, tf.float64)
            per = tf.nn.sigmoid_cross_entropy_with_logits(labels=t, logits=logits)
            loss = tf.reduce_sum(tf.reduce_mean(per, axis=1))
        else:
            loss = tf.reduce_sum(tf.reduce_mean(tf.square(logits - tf.cast(ys, tf.float64)), 1))
        loss = loss / len(y)
    grads = tape.gradient(loss, [v.value for _, v in named])
    # the training forward above updated each batchnorm's moving statistics by its own rule
    for name, v in named:
        if not v.trainable:
            out[f"running/{name}"] = np.asarray(keras.ops.convert_to_numpy(v.value), np.float64)
    out["output"] = np.asarray(logits, np.float64)
    conv = PairConversion(layout)
    for (name, _), g in zip(named, grads, strict=True):
        if g is not None:
            out[f"grad/{name}"] = conv.to_canonical(name, np.asarray(g))
    return out


def keras_only(net: Any) -> Any:
    """``net`` with dualtrain's port layers (TorchBatchNormalization) replaced by Keras's own,
    which are the same in inference, so the saved model opens without dualtrain; a model that is
    not functional is saved as it is."""
    from .port import TorchBatchNormalization

    if not any(isinstance(layer, TorchBatchNormalization) for layer in leaves(net)):
        return net

    def clone(layer: Any) -> Any:
        if isinstance(layer, TorchBatchNormalization):
            return layer.as_keras()
        return layer.__class__.from_config(layer.get_config())

    try:
        copy = keras.models.clone_model(net, clone_function=clone)
    except (ValueError, TypeError):  # a subclassed model: no graph to clone
        return net
    copy.set_weights(net.get_weights())
    return copy

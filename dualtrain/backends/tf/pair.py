"""The Keras side of a model pair (dualtrain.core.pair): the user's Keras 3 model, built from
``model.keras`` with ``model.args`` under the run's dtype policy, its variables in the canonical
(torch) names through the run's weight map, and its description for the driver's map."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import keras
import numpy as np

from dualtrain.core import pair
from dualtrain.core.pair import dropout as pair_dropout
from dualtrain.core.weights import Weights
from dualtrain.errors import UserError
from dualtrain.spec import Experiment, ModelSpec

from . import exact
from .layers import Layer, Model, Tensor, Variable, pair_dropout_call
from .model import Conversion
from .port import TorchBatchNormalization

_KINDS = (
    (keras.layers.Dense, "dense"),
    (keras.layers.Conv2D, "conv2d"),
    (keras.layers.BatchNormalization, "batchnorm"),
)
#: the dropout calls of the forwards inside dropout_calls() (describe), innermost last
_CALLS: list[list[dict[str, Any]]] = []


def kind(layer: Layer) -> str:
    return next((k for cls, k in _KINDS if isinstance(layer, cls)), "other")


def attention_parts(net: Layer) -> dict[int, tuple[Layer, int]]:
    """Each MultiHeadAttention projection sublayer of ``net`` (by id): (its attention layer, its
    place in query, key, value, attention_output)."""
    out: dict[int, tuple[Layer, int]] = {}
    for layer in net._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, keras.layers.MultiHeadAttention):
            subs = (layer._query_dense, layer._key_dense, layer._value_dense, layer._output_dense)
            for i, sub in enumerate(subs):
                out[id(sub)] = (layer, i)
    return out


def weighted_leaves(net: Layer) -> list[Layer]:
    """:func:`leaves`, each MultiHeadAttention's projections in the order it applies them (query,
    key, value, attention_output; Keras tracks them the other way round), where its first one
    was."""
    parts = attention_parts(net)
    ordered = leaves(net)
    first: dict[int, int] = {}
    for i, layer in enumerate(ordered):
        if id(layer) in parts:
            first.setdefault(id(parts[id(layer)][0]), i)

    def key(item: tuple[int, Layer]) -> tuple[int, int]:
        i, layer = item
        if id(layer) in parts:
            mha, place = parts[id(layer)]
            return (first[id(mha)], place)
        return (i, 0)

    return [layer for _, layer in sorted(enumerate(ordered), key=key)]


def nhwc(shape: tuple[int, ...]) -> tuple[int, ...]:
    """One sample's Keras input shape: images (C, H, W) -> (H, W, C); features unchanged."""
    return (shape[1], shape[2], shape[0]) if len(shape) == 3 else tuple(shape)


def leaves(model: Layer) -> list[Layer]:
    """The model's leaf layers (no sublayers), in the model's own layer order."""
    out = []
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if not list(layer._flatten_layers(include_self=False, recursive=False)):
            out.append(layer)
    return out


def build_keras(model: ModelSpec, policy: str) -> Model:
    """The user's Keras model under ``policy`` (the run's: float64 for fp64, mixed_float16, ...),
    built on a zero batch of the data's input shapes. In float64, Keras's float32-accurate ops run
    exactly (exact.py, core.limits): the fp64 runs and the locator compute them alike."""
    assert model.keras is not None
    if policy == "float64":
        exact.install()
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
    install_dropouts(net)
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


def install_dropouts(net: Model) -> None:
    """Each dropout layer of ``net`` takes the pair's masks (:func:`_install_dropout`)."""
    for layer in leaves(net):
        _install_dropout(layer)


def _install_dropout(layer: Layer) -> None:
    """A dropout layer of the user's model takes the pair's masks in a training forward
    (dualtrain.core.pair.dropout; its own ``call`` replaced on this instance only: the class, its
    config and a saved model are Keras's); a random layer the pair cannot carry is one line."""
    names = [c.__name__ for c in type(layer).__mro__ if c.__module__.startswith("keras")]
    kind, why = pair_dropout.classify("keras", names)
    if why is not None or (kind == pair_dropout.ELEMENT and layer.noise_shape is not None):
        why = why or f"a noise_shape ({layer.noise_shape}) has no torch counterpart"
        raise UserError(
            f"model.keras: layer {layer.name!r} is a {type(layer).__name__}, which a model pair "
            f"does not carry ({why}; docs/own-models.md). Received: {type(layer).__name__}"
        )
    if kind is None:
        return
    last = kind == pair_dropout.CHANNEL and (
        getattr(layer, "data_format", "channels_last") == "channels_last"
    )

    def record(x: Tensor) -> None:
        if _CALLS:
            path = layer_path(layer)
            node = sum(c["name"] == path for c in _CALLS[-1])  # this call's node, in call order
            _CALLS[-1].append(
                pair_dropout.call_record(
                    path,
                    type(layer).__name__,
                    kind,
                    float(layer.rate),
                    [int(d) for d in x.shape[1:]],
                    channels_last=last,
                    flatten_hwc=_flatten_hwc(layer, node),
                )
            )

    layer.call = pair_dropout_call(layer, lambda: layer_path(layer), record)


@contextmanager
def dropout_calls() -> Iterator[list[dict[str, Any]]]:
    """The dropout calls of the forwards run inside, in order (describe)."""
    calls: list[dict[str, Any]] = []
    _CALLS.append(calls)
    try:
        yield calls
    finally:
        _CALLS.pop()


def layer_path(layer: Layer) -> str:
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


def _flatten_hwc(layer: Layer, node: int = 0) -> list[int] | None:
    """A Dense (or dropout) layer fed by a Flatten of an (N, H, W, C) tensor (its ``node``-th
    call): that (H, W, C). A dropout between them keeps each feature in its place."""
    try:
        parents = layer._inbound_nodes[node].parent_nodes
        while len(parents) == 1 and isinstance(parents[0].operation, keras.layers.Dropout):
            parents = parents[0].parent_nodes
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
    parts = attention_parts(net)
    for layer in weighted_leaves(net):
        hwc = _flatten_hwc(layer) if kind(layer) == "dense" else None
        for v in layer.weights:
            variables.append(
                {
                    "path": v.path,
                    "shape": [int(d) for d in v.shape],
                    "trainable": bool(v.trainable),
                    "layer": layer_path(layer),
                    "kind": "attention" if id(layer) in parts else kind(layer),
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
            "name": layer_path(layer),
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
    with dropout_calls() as drops:  # inference: each dropout's call, in forward order
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
        **({"dropouts": drops} if drops else {}),
    }


def named_variables(net: Model, layout: pair.Layout) -> list[tuple[str, Variable]]:
    """[(name, Keras variable)] in the canonical (torch state dict) order: the canonical name, or
    for an array split across several variables (torch's packed in_proj_weight onto the query,
    key and value kernels) each part's name (``MapEntry.part``), whose canonical form is its
    rows of the array (:class:`PairConversion`)."""
    by_path = {v.path: v for v in net.weights}
    entries = layout.by_torch()
    out = []
    for a in layout.torch.torch:
        e = entries[a.name]
        if len(e.targets) == 1:
            out.append((a.name, by_path[e.targets[0]]))
        else:
            out += [(e.part(i), by_path[k]) for i, k in enumerate(e.targets)]
    return out


def load_canonical(
    named: list[tuple[str, Variable]], layout: pair.Layout, weights: Weights
) -> None:
    conv = PairConversion(layout)
    if set(weights) != set(layout.shapes()):
        raise ValueError(f"weights do not match the pair: {sorted(weights)}")
    parts = conv.split(weights)
    for name, var in named:
        value = conv.to_keras(name, parts[name], var.dtype)
        if tuple(var.shape) != value.shape:
            raise ValueError(f"{name}: Keras shape {tuple(var.shape)} != mapped {value.shape}")
        var.assign(value)


def export_canonical(named: list[tuple[str, Variable]], layout: pair.Layout) -> Weights:
    conv = PairConversion(layout)
    return conv.join(
        (name, conv.to_canonical(name, keras.ops.convert_to_numpy(var.value)))
        for name, var in named
    )


class PairConversion(Conversion):
    """A model pair's canonical <-> Keras layout, by its weight map's transforms. A part's name
    (an array split across several variables: ``MapEntry.part``) converts its own rows of the
    canonical array; :meth:`join` and :meth:`split` go between the parts and the array."""

    def __init__(self, layout: pair.Layout):
        self.entries = layout.by_torch()

    def _entry(self, name: str) -> pair.MapEntry:
        base, sep, _ = name.rpartition(pair.PART)
        if sep and base in self.entries:
            return pair.part_entry(self.entries[base])
        return self.entries[name]

    def to_keras(self, name: str, array: np.ndarray, dtype: str = "float32") -> np.ndarray:
        return pair.to_keras(self._entry(name), np.asarray(array, dtype=dtype))

    def to_canonical(self, name: str, array: np.ndarray) -> np.ndarray:
        a = np.asarray(array)
        a = a if a.dtype == np.float64 else a.astype(np.float32, copy=False)
        return pair.to_canonical(self._entry(name), a)

    def join(self, items: Iterable[tuple[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """Canonical arrays by name from canonical arrays and parts (in part order)."""
        out: dict[str, np.ndarray] = {}
        parts: dict[str, list[np.ndarray]] = {}
        for name, a in items:
            base, sep, _ = name.rpartition(pair.PART)
            if sep and base in self.entries:
                parts.setdefault(base, []).append(a)
                out.setdefault(base, a)  # its place in the order
            else:
                out[name] = a
        for base, arrays in parts.items():
            out[base] = pair.join_canonical(arrays)
        return out

    def split(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The inverse of :meth:`join`: a split entry's array as its parts' rows."""
        out: dict[str, np.ndarray] = {}
        for name, a in arrays.items():
            e = self.entries.get(name)
            if e is not None and len(e.targets) > 1:
                for i, p in enumerate(pair.split_canonical(e, a)):
                    out[e.part(i)] = p
            else:
                out[name] = a
        return out


def canonical(conversion: Conversion, items: Iterable[tuple[str, Any]]) -> dict[str, np.ndarray]:
    """Arrays in the Keras layout by the engine's names (weights, gradients, optimizer slots) as
    canonical arrays by canonical name: a pair's split parts joined."""
    converted = ((n, conversion.to_canonical(n, np.asarray(a))) for n, a in items)
    if isinstance(conversion, PairConversion):
        return conversion.join(converted)
    return dict(converted)


def engine_names(conversion: Conversion, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Canonical arrays by the engine's names (a pair's split arrays as their parts), still in the
    canonical layout (the inverse of :func:`canonical`'s join)."""
    return conversion.split(arrays) if isinstance(conversion, PairConversion) else arrays


def keras_only(net: Model) -> Model:
    """``net`` with dualtrain's port layers (TorchBatchNormalization) replaced by Keras's own,
    which are the same in inference, so the saved model opens without dualtrain; a model that is
    not functional is saved as it is."""
    if not any(isinstance(layer, TorchBatchNormalization) for layer in leaves(net)):
        return net

    def clone(layer: Layer) -> Layer:
        if isinstance(layer, TorchBatchNormalization):
            return layer.as_keras()
        return layer.__class__.from_config(layer.get_config())

    try:
        copy = keras.models.clone_model(net, clone_function=clone)
    except (ValueError, TypeError):  # a subclassed model: no graph to clone
        return net
    copy.set_weights(net.get_weights())
    return copy

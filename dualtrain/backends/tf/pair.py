"""The Keras side of a model pair (dualtrain.core.pair): the user's Keras 3 model, built from
``model.keras`` with ``model.args`` under the run's dtype policy, its variables in the canonical
(torch) names through the run's weight map, and its description for the driver's map."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import keras
import numpy as np

from dualtrain.core import pair
from dualtrain.core.pair import dropout as pair_dropout
from dualtrain.errors import UserError
from dualtrain.spec import Experiment, ModelSpec

from . import exact
from .layers import Layer, Model, Tensor, Variable, pair_dropout_call
from .port import TorchBatchNormalization

_KINDS = (
    (keras.layers.Dense, "dense"),
    (keras.layers.Conv2D, "conv2d"),
    (keras.layers.BatchNormalization, "batchnorm"),
)
#: Keras's dtype policy classes, as a config names them
_POLICIES = ("DTypePolicy", "FloatDTypePolicy")
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


def build_keras(model: ModelSpec, policy: str, config: str = "") -> Model:
    """The user's Keras model under ``policy`` (the run's: float64 for fp64, mixed_float16, ...),
    built on a zero batch of the data's input shapes: ``model.keras``'s factory called, or a
    converted pair's port (``config``: its JSON, :class:`pair.Side` ``config``) built again. In
    float64, Keras's float32-accurate ops run exactly (exact.py, core.limits): the fp64 runs and
    the locator compute them alike."""
    if policy == "float64":
        exact.install()
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        net = _from_config(model, config, policy) if model.convert else _from_factory(model)
    finally:
        keras.config.set_dtype_policy(previous)
    install_dropouts(net)
    return _checked(net, model)


def _from_factory(model: ModelSpec) -> Model:
    assert model.keras is not None
    factory = pair.import_factory(model.keras, model.path, "model.keras")
    net = pair.call_factory(factory, model.args, "model.keras")
    if not isinstance(net, keras.Model):
        raise UserError(
            f"model.keras: {model.keras} must return a keras.Model (Keras 3). Received: "
            f"{type(net).__module__}.{type(net).__name__}"
        )
    return net


def _from_config(model: ModelSpec, config: str, policy: str) -> Model:
    """A converted pair's port built from its JSON, each float32 dtype policy in it (the one the
    converter built it under) replaced by the run's; the user's folder (model.path) first on
    sys.path for the modules of their own layers."""
    if not config:
        raise ValueError("a converted pair's Keras side needs its config (model_pair.json)")
    pair.import_path(model.path)
    doc = json.loads(config)
    _retype(doc, policy)
    try:
        net = keras.models.model_from_json(json.dumps(doc))
    except Exception as exc:  # the port's config: what Keras cannot build from it
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise UserError(
            f"model.convert: the Keras model it returns cannot be built again from its config: "
            f"{type(exc).__name__}: {first}. Received: model.convert={model.convert!r}"
        ) from None
    assert isinstance(net, keras.Model)
    return net


def _retype(doc: object, policy: str) -> None:
    """Every float32 dtype policy of a Keras config as ``policy``, in place."""
    if isinstance(doc, dict):
        cfg = doc.get("config")
        if doc.get("class_name") in _POLICIES and isinstance(cfg, dict):
            if cfg.get("name") == "float32":
                cfg["name"] = policy
        for v in doc.values():
            _retype(v, policy)
    elif isinstance(doc, list):
        for v in doc:
            _retype(v, policy)


def _checked(net: Model, model: ModelSpec) -> Model:
    """``net`` run on a zero batch of the data's inputs: one tensor (N, outputs) out."""
    xs = [np.zeros((2, *nhwc(i.shape)), "float32") for i in model.inputs]
    field = "model.convert" if model.convert else "model.keras"
    try:
        out = net(xs if len(xs) > 1 else xs[0], training=False)
    except Exception as exc:  # the user's model on the spec's input shapes
        shapes = ", ".join(
            f"{i.name} (N, {', '.join(map(str, nhwc(i.shape)))})" for i in model.inputs
        )
        raise UserError(
            f"{field}: {type(net).__name__} fails on the data's inputs {shapes} (images "
            f"NHWC): {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}. "
            f"Received: model.inputs {[list(i.shape) for i in model.inputs]}"
        ) from None
    if isinstance(out, (list, tuple, dict)):
        raise UserError(
            f"{field}: {type(net).__name__} must return one tensor (N, outputs). Received: "
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


def var_path(net: Model, v: Variable, converted: bool) -> str:
    """A variable's name in the pair: its path; a converted port's less the model's own name
    (the torch side's convert.py learns the map under these names)."""
    return v.path.removeprefix(f"{net.name}/") if converted else v.path


def _owned_weights(net: Model, seen: set[str]) -> list[dict[str, object]]:
    """The variables of ``net`` no leaf layer holds, each described with the innermost layer that
    holds it (a converter's port: a layer's own weight beside its sublayers)."""
    out = []
    layers = list(net._flatten_layers(include_self=False, recursive=True))
    for v in net.weights:
        path = var_path(net, v, True)
        if path in seen:  # a leaf's: described already
            continue
        owners = [la for la in layers if any(w is v for w in la.weights)]
        if not owners:
            continue
        layer = min(owners, key=lambda la: len(la.weights))
        out.append(
            {
                "path": path,
                "shape": [int(d) for d in v.shape],
                "trainable": bool(v.trainable),
                "layer": layer_path(layer),
                "kind": "other",
                "role": v.name,
                "cls": type(layer).__name__,
                "flatten_hwc": None,
            }
        )
    return out


def describe(spec: Experiment, converted: str | None = None) -> dict[str, Any]:
    """The Keras side's description (``converted``: a converted pair's converted.json, written by
    the torch side's ``convert``, which holds the port's config)."""
    config = json.loads(Path(converted).read_text())["keras"] if converted else ""
    net = build_keras(spec.model, "float32", config)
    variables = []
    parts = attention_parts(net)
    for layer in weighted_leaves(net):
        hwc = _flatten_hwc(layer) if kind(layer) == "dense" else None
        for v in layer.weights:
            variables.append(
                {
                    "path": var_path(net, v, bool(converted)),
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
    if converted:  # a port's own weights of a layer that holds layers (ViT's class token)
        variables += _owned_weights(net, seen)
        seen = {v["path"] for v in variables}
    stray = [v.path for v in net.weights if var_path(net, v, bool(converted)) not in seen]
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
        "factory": spec.model.keras or spec.model.convert,
        "cls": f"{type(net).__module__}.{type(net).__name__}",
        "output": [int(d) for d in out.shape[1:]],
        "keras": variables,
        "layers": layers,
        "digest": pair.source_digest(type(net)),
        **({"dropouts": drops} if drops else {}),
        **({"config": config} if config else {}),
    }


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

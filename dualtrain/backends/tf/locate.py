"""The locator's Keras side (dualtrain.core.locate): a model pair's Keras model probed on one
batch in float64, in torch's layouts, layer by layer (what each layer takes and makes, what each
does fed the torch module's input, its activation, each batchnorm in training mode, the
gradients), for the driver to find where the two sides first part."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from dualtrain.core import losses, pair
from dualtrain.core.locate.mistakes import ACTIVATION_PROBE
from dualtrain.core.weights import Weights
from dualtrain.spec import Experiment

from .layers import Layer, Model, Tensor, Variable
from .mapping import PairConversion, canonical, load_canonical, named_variables
from .ops import LOSS_OPS
from .pair import attention_parts, build_keras, layer_path, leaves

#: a model's input: one array, or one per input
Feed = np.ndarray | list[np.ndarray]


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


def _padding_chain(layer: Layer) -> list[Layer]:
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
    to ACTIVATION_PROBE (``act/``); each batchnorm's training-mode output and running statistics
    when fed the torch module's training-mode input (``tfed/``, ``fedrun/``); the model's output in
    inference and in training; the running statistics after the training forward; each
    parameter's gradient (training mode) in canonical names and layouts."""
    net = build_keras(spec.model, "float64", layout.keras.config)
    named = named_variables(net, layout)
    load_canonical(named, layout, weights)
    xs = [_to_keras_layout(a) for a in inputs]
    feed = xs if len(xs) > 1 else xs[0]
    out: dict[str, np.ndarray] = {}
    parts = attention_parts(net)
    by_path = {layer_path(layer): layer for layer in leaves(net) if id(layer) not in parts}
    by_path.update({layer_path(layer): layer for layer in leaves(net) if id(layer) in parts})
    modules: dict[str, tuple[Layer, tuple[int, int, int] | None]] = {}
    attention: dict[str, Layer] = {}  # torch MultiheadAttention -> the Keras MultiHeadAttention
    entries = layout.by_torch()
    mhas = {a.module for a in layout.torch.torch if a.kind == "attention"}
    for a in layout.torch.torch:
        e = entries[a.name]
        kv = next(v for v in layout.keras.keras if v.path == e.targets[0])
        layer = by_path.get(kv.layer)
        if layer is None:  # a port's own weight of a layer that holds layers (ViT's class token)
            continue
        if id(layer) in parts and (a.module in mhas or a.module.rsplit(".", 1)[0] in mhas):
            mha, place = parts[id(layer)]  # the whole attention is the unit (its output
            # projection inside), against nn.MultiheadAttention (a converter's MultiHeadAttention
            # against Hugging Face's projections is compared projection by projection)
            # its query, key or value projection (an explicit map may list them in any order)
            if place < 3:
                attention.setdefault(a.module, mha)
            continue
        modules.setdefault(a.module, (layer, e.chw))
    chains = {m: _padding_chain(layer) for m, (layer, _) in modules.items()}
    _record_intermediates(net, feed, modules, chains, out)
    for module, (_, chw) in modules.items():
        x = torch_side.get(f"in/{module}")
        if x is not None:
            v = _to_keras_layout(x, chw)
            try:
                for op in chains[module]:  # the padding before a 'valid' conv is part of it
                    v = op(v)
            except Exception:  # a layer that takes another input than its torch module (a
                continue  # converter's position embedding takes the tokens, torch's the ids)
            out[f"fed/{module}"] = _like(np.asarray(v), torch_side.get(f"out/{module}"))
    _record_attention(net, feed, attention, torch_side, out)
    _record_activations({p: la for p, la in by_path.items() if id(la) not in parts}, out)
    _record_batchnorms_fed(layout, named, modules, chains, torch_side, out)
    out["output/eval"] = np.asarray(net(feed, training=False), np.float64)
    ys = tf.constant(y)
    with tf.GradientTape() as tape:
        logits = net(feed, training=True)
        loss = losses.loss_sum(LOSS_OPS, spec.model.loss, logits, ys)  # float64: exact form
        loss = loss / len(y)
    grads = tape.gradient(loss, [v.value for _, v in named])
    # the training forward above updated each batchnorm's moving statistics by its own rule
    for name, v in named:
        if not v.trainable:
            out[f"running/{name}"] = np.asarray(keras.ops.convert_to_numpy(v.value), np.float64)
    out["output"] = np.asarray(logits, np.float64)
    present = [  # a Keras Embedding's gradient is IndexedSlices: dense, as torch's
        (n, np.asarray(tf.convert_to_tensor(g)))
        for (n, _), g in zip(named, grads, strict=True)
        if g is not None
    ]
    for name, g in canonical(PairConversion(layout), present).items():
        out[f"grad/{name}"] = g
    return out


def _like(value: np.ndarray, torch: np.ndarray | None) -> np.ndarray:
    """A Keras layer's output in torch's layout (NHWC images as NCHW), or in its torch module's
    shape where the two have other ranks and the same size (a converter's EinsumDense projection
    (N, T, heads, head_dim) against a Linear's (N, T, E))."""
    if torch is not None and value.ndim != torch.ndim and value.size == torch.size:
        return value.reshape(torch.shape)
    return _to_torch_layout(value)


def _record_attention(
    net: Model,
    feed: Feed,
    attention: dict[str, Layer],
    torch_side: dict[str, np.ndarray],
    out: dict[str, np.ndarray],
) -> None:
    """probe_layers' ``kin/``, ``kout/`` and ``fed/`` of each MultiHeadAttention paired with a
    torch MultiheadAttention: its query and output in the Keras forward (its own ``call`` wrapped
    on this instance for that forward), and its output fed the torch module's input as query,
    key and value, with the mask the Keras forward gave it."""
    calls: dict[str, tuple[Tensor, dict[str, Any], Any]] = {}

    def wrap(module: str, mha: Layer) -> Callable[..., Any]:
        def call(query: Tensor, value: Tensor, key: Tensor | None = None, **kwargs: Any) -> Any:
            result = type(mha).call(mha, query, value, key, **kwargs)
            calls.setdefault(module, (query, kwargs, result))
            return result

        return call

    for module, mha in attention.items():
        mha.call = wrap(module, mha)
    try:
        net(feed, training=False)
    finally:
        for mha in {id(m): m for m in attention.values()}.values():
            del mha.call  # the class's own again
    for module, mha in attention.items():
        if module not in calls:
            continue
        query, kwargs, result = calls[module]
        out[f"kin/{module}"] = np.asarray(query, np.float64)
        out[f"kout/{module}"] = np.asarray(result[0] if isinstance(result, tuple) else result)
        x = torch_side.get(f"in/{module}")
        if x is not None:
            mask = {k: kwargs[k] for k in ("attention_mask", "use_causal_mask") if k in kwargs}
            out[f"fed/{module}"] = np.asarray(mha(x, x, **mask), np.float64)


def _record_intermediates(
    net: Model,
    feed: Feed,
    modules: dict[str, tuple[Layer, tuple[int, int, int] | None]],
    chains: dict[str, list[Layer]],
    out: dict[str, np.ndarray],
) -> None:
    """probe_layers' ``kin/`` and ``kout/``: each mapped layer's input and output in the Keras
    forward, where the model exposes them."""
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


def _record_activations(by_path: dict[str, Layer], out: dict[str, np.ndarray]) -> None:
    """probe_layers' ``act/``: what every leaf layer's activation makes of ACTIVATION_PROBE."""
    for path, layer in by_path.items():
        fn = getattr(layer, "activation", None)
        if fn is not None and not isinstance(layer, keras.layers.Activation):
            v = fn(ACTIVATION_PROBE[None, :])  # Dense/Conv2D's own activation argument
        elif not layer.weights:
            try:
                v = layer(ACTIVATION_PROBE[None, :])
            except Exception:  # a layer that is no activation (flatten, add, padding, ...)
                continue
        else:
            continue
        out[f"act/{path}"] = np.asarray(v, np.float64).reshape(-1)


def _record_batchnorms_fed(
    layout: pair.Layout,
    named: list[tuple[str, Variable]],
    modules: dict[str, tuple[Layer, tuple[int, int, int] | None]],
    chains: dict[str, list[Layer]],
    torch_side: dict[str, np.ndarray],
    out: dict[str, np.ndarray],
) -> None:
    """probe_layers' ``tfed/`` and ``fedrun/``: each batchnorm in training mode, fed the torch
    module's training-mode input."""
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

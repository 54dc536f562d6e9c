"""A converted model pair's torch side (``model.convert``): the user's converter run on the torch
module, which dualtrain builds and fills with distinct values, and the weight map learned from what
it made of them (dualtrain.core.pair.learn).

The converter takes the ``nn.Module`` and returns its Keras port (KerasHub's ``from_preset`` on a
``save_pretrained`` folder, nobuco, a team's own); it brings Keras into this process itself.
dualtrain reads the port through Keras's public model API only (its ``weights``, each variable's
``path`` and ``numpy()``, ``to_json()``), so this module imports no Keras: the TF workers build
the port again from its JSON under each run's dtype policy and load the run's weights into it
through the learned map.
"""

from __future__ import annotations

import json
from typing import Any, Protocol, TypeGuard

import numpy as np
import torch

from dualtrain.backends.torch.pair import canonical_state, describe, user_module
from dualtrain.core import pair
from dualtrain.core.pair import learn
from dualtrain.errors import UserError
from dualtrain.spec import Experiment


class PortVariable(Protocol):
    """A Keras variable, as this module reads it."""

    path: str

    def numpy(self) -> np.ndarray: ...


class Port(Protocol):
    """A Keras model, as this module reads it (Keras's public model API; no Keras import)."""

    name: str
    weights: list[PortVariable]

    def to_json(self) -> str: ...


def is_keras_model(net: object) -> TypeGuard[Port]:
    """A Keras 3 model (keras.Model or a subclass), known without importing Keras."""
    return any(
        c.__name__ == "Model" and c.__module__.startswith("keras.") for c in type(net).__mro__
    )


def convert(spec: Experiment) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, Any]]:
    """(the torch side's description, its initial weights, the converted side: ``map``, the
    entries; ``keras``, the port's JSON; ``learned``, the map in words)."""
    model = spec.model
    assert model.convert is not None
    module = user_module(model, spec.seed)
    side, weights = describe(spec, module)  # the same module the converter takes: built once
    converter = pair.import_factory(model.convert, model.path, "model.convert")
    state = canonical_state(module)
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    made: list[Port] = []

    def run(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with torch.no_grad():
            for k, t in state.items():
                t.copy_(torch.from_numpy(np.ascontiguousarray(arrays[k])).to(t.dtype))
        net = converter(module)
        if not is_keras_model(net):
            raise UserError(
                f"model.convert: {model.convert} must return a Keras 3 model (keras.Model). "
                f"Received: {type(net).__module__}.{type(net).__name__}"
            )
        made[:] = [net]
        return {_own(net, v.path): np.asarray(v.numpy()) for v in net.weights}

    module.eval()
    learned = learn.learn(shapes, run, real=weights)
    entries = learn.entries(learned, shapes)
    return (
        side,
        weights,
        {
            "map": pair.map_json(entries),
            "keras": _config(made[0], model.convert),
            "learned": learned.describe(),
        },
    )


def _own(net: Port, path: str) -> str:
    """A variable's path less the model's own name, where it starts with it: each conversion's
    model has a name of its own (sequential, sequential_1, ...), and a model built again from its
    JSON may leave it out (backends/tf/pair.py names a converted port's variables alike)."""
    return path.removeprefix(f"{net.name}/")


def _config(net: Port, name: str) -> str:
    """The port as Keras's JSON, which the TF workers build again; one line where it cannot be
    written (a subclassed model without get_config)."""
    try:
        text = net.to_json()
        json.loads(text)
    except Exception as exc:  # the user's model: why Keras cannot write it, in one line
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise UserError(
            f"model.convert: the Keras model {name} returns cannot be written as its config "
            f"(dualtrain builds it again in each TF worker from model.to_json()): "
            f"{type(exc).__name__}: {first}. Received: {type(net).__name__}"
        ) from None
    return str(text)

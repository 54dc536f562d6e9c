"""``dualtrain export --format keras``: the run's inference model as a ``.keras`` file, built from
Keras's own layers only (:func:`build_inference_model`), so ``keras.saving.load_model`` opens it
without dualtrain. Run by ``python -m dualtrain.backends.tf.tools export``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dualtrain.core import pair
from dualtrain.core.model import conv_flatten_shape, keras_layouts, resolve
from dualtrain.core.weights import Weights
from dualtrain.spec import Experiment, ModelSpec

if TYPE_CHECKING:  # keras is imported by the functions that build (this module loads without it)
    from dualtrain.backends.tf.layers import Model, Variable


def _own(obj: Any) -> bool:
    module = getattr(obj, "__module__", "") or ""
    return not module.startswith(("keras", "tensorflow", "dualtrain", "builtins", "numpy"))


def custom_objects(net: Any) -> dict[str, list[str]]:
    """The user's own layer classes and activation functions in ``net`` (defined outside Keras,
    TensorFlow and dualtrain), which keras.saving.load_model must be given unless the user's code
    registered them: {name: [module, attribute]}."""
    found: dict[str, list[str]] = {}
    for layer in net._flatten_layers(include_self=True, recursive=True):
        for obj in (type(layer), getattr(layer, "activation", None)):
            if obj is not None and callable(obj) and _own(obj):
                name = getattr(obj, "__name__", "")
                if name and "<" not in name:  # a lambda has no name to load it by
                    found[name] = [obj.__module__, getattr(obj, "__qualname__", name)]
    return found


def export_keras(
    spec: Experiment, weights: Weights, out: str, layout: pair.Layout | None = None
) -> None:
    """Write model.keras into the folder ``out`` (dualtrain.driver.export). A model pair's: the
    user's own Keras model with the run's weights through the map (it opens without dualtrain
    where the model's layers are Keras's own or registered by the user's code)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from .model import load_canonical  # lazy: framework

    dtype = "float64" if next(iter(weights.values())).dtype == np.float64 else "float32"
    if layout is not None:
        from . import mapping as pair_map  # lazy: framework
        from . import pair as pair_tf  # lazy: framework

        net = pair_tf.build_keras(spec.model, dtype, layout.keras.config)
        pair_map.load_canonical(pair_map.named_variables(net, layout), layout, weights)
        pair_tf.keras_only(net).save(str(Path(out) / "model.keras"))
        custom = custom_objects(net)
        if custom:  # what load_model needs from the user's code (dualtrain.driver.export_check)
            (Path(out) / pair.CUSTOM_OBJECTS_FILE).write_text(json.dumps(custom, indent=1) + "\n")
        return
    model, named = build_inference_model(spec.model, dtype)
    load_canonical(named, weights, keras_layouts(spec.model))
    model.save(str(Path(out) / "model.keras"))


def build_inference_model(
    spec: ModelSpec, dtype: str = "float32"
) -> tuple[Model, list[tuple[str, Variable]]]:
    """The model from Keras's own layers only (keras.Model, [(canonical name, keras.Variable)]):
    keras.saving.load_model opens it without dualtrain. Dropout is keras's Dropout (identity in
    inference), batchnorm is BatchNormalization with torch's eps and the running statistics as its
    moving ones, gelu is Keras's exact gelu. Inputs: NHWC images, (F,) features, in model.inputs
    order; output: the model's outputs (logits)."""
    import keras  # lazy: framework

    from .model import Builder, keras_inputs  # lazy: framework

    inputs = keras_inputs(spec, dtype)
    b = Builder(dtype, 0, conv_flatten_shape(spec), None, None, inference=True)
    x = b.model(resolve(spec), inputs)
    model = keras.Model(inputs if len(inputs) > 1 else inputs[0], x, name="dualtrain_export")
    return model, b.named

"""``dualtrain export --format keras``: the run's inference model as a ``.keras`` file, built from
Keras's own layers only (``model.build_inference_model``), so ``keras.saving.load_model`` opens it
without dualtrain. Run by ``python -m dualtrain.backends.tf.tools export``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from dualtrain.core import pair
from dualtrain.core.weights import Weights
from dualtrain.spec import Experiment


def export_keras(
    spec: Experiment, weights: Weights, out: str, layout: pair.Layout | None = None
) -> None:
    """Write model.keras into the folder ``out`` (dualtrain.driver.export). A model pair's: the
    user's own Keras model with the run's weights through the map (it opens without dualtrain
    where the model's layers are Keras's own or registered by the user's code)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from .model import build_inference_model, load_canonical  # lazy: framework

    dtype = "float64" if next(iter(weights.values())).dtype == np.float64 else "float32"
    if layout is not None:
        from . import pair as pair_tf  # lazy: framework

        net = pair_tf.build_keras(spec.model, dtype)
        pair_tf.load_canonical(pair_tf.named_variables(net, layout), layout, weights)
        pair_tf.keras_only(net).save(str(Path(out) / "model.keras"))
        return
    model, named = build_inference_model(spec.model, dtype)
    load_canonical(named, weights)
    model.save(str(Path(out) / "model.keras"))

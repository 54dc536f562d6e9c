"""Inspection tools for the tf backend.

``forward_logits(spec, weights, inputs)``: float32 outputs (logits) of the Keras model (fp32,
inference) loaded with canonical weights. CLI:

    python -m dualtrain.backends.tf.tools forward SPEC_YAML WEIGHTS_NPZ N OUT_NPZ

writes the outputs of the first N test samples under key "logits".
``python -m dualtrain.backends.tf.tools export SPEC_YAML WEIGHTS_NPZ OUT_FOLDER`` writes the Keras
export (export.py). ``python -m dualtrain.backends.tf.tools env`` prints TensorFlow's and Keras's
facts (``envinfo.backend_facts``) as one JSON object; ``dualtrain env`` runs it.
"""

from __future__ import annotations

import gc

if __name__ == "__main__":  # a short-lived tool process: its framework import without cyclic GC
    gc.disable()  # (dualtrain.runtime.start.settle_gc says what that saves)

import os
import sys
from typing import Any

import numpy as np

from dualtrain.core.model import keras_layouts
from dualtrain.core.weights import Weights
from dualtrain.runtime.entry import (
    describe_main,
    env_facts,
    env_main,
    export_main,
    forward_main,
    probe_layers_main,
)
from dualtrain.spec import Experiment

from . import kernels as tf_kernels
from .envinfo import backend_facts
from .export import export_keras


def forward_logits(
    spec: Experiment,
    weights: Weights,
    inputs: list[np.ndarray],
    layout: Any = None,
    batch_size: int = 1000,
) -> np.ndarray:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # as the workers (see distributed.settings)
    import tensorflow as tf  # lazy: framework (the environment first)

    from .model import (  # lazy: framework
        build_model,
        call_model,
        has_dropout,
        load_canonical,
        to_nhwc,
    )

    tf.config.experimental.enable_tensor_float_32_execution(False)
    if layout is not None:  # a model pair: the user's Keras model, weights through the map
        from . import mapping as pair_map  # lazy: framework
        from . import pair as pair_tf  # lazy: framework

        model = pair_tf.build_keras(spec.model, "float32", layout.keras.config)
        pair_map.load_canonical(pair_map.named_variables(model, layout), layout, weights)
        dropout = False
    else:
        model, named = build_model(spec.model, "float32", seed=spec.seed)
        load_canonical(named, weights, keras_layouts(spec.model))
        dropout = has_dropout(spec.model)
    xs = [to_nhwc(a) if a.ndim == 4 else np.asarray(a, np.float32) for a in inputs]

    def call(chunks: list[np.ndarray]) -> tf.Tensor:
        return call_model(model, [tf.constant(c) for c in chunks], dropout=dropout)[0]

    n = len(xs[0])
    out = [
        np.asarray(call([x[i : i + batch_size] for x in xs]), dtype=np.float32)
        for i in range(0, n, batch_size)
    ]
    return np.concatenate(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["env"]:
        return env_main("tf", argv, lambda: env_facts(backend_facts, tf_kernels))
    if argv[:1] == ["probe-layers"]:
        from dualtrain.backends.tf.locate import probe_layers  # lazy: framework

        return probe_layers_main("tf", argv, probe_layers)
    if argv[:1] == ["describe"]:
        from dualtrain.backends.tf.pair import describe  # lazy: framework

        return describe_main("tf", argv, lambda spec, *file: (describe(spec, *file), None))
    if argv[:1] == ["export"]:
        return export_main("tf", argv, export_keras)
    return forward_main("tf", argv, forward_logits)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

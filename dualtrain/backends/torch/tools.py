"""Inspection tools: the torch model's fp32 logits for given weights and images; this backend's
environment facts.

CLI: ``python -m dualtrain.backends.torch.tools forward SPEC_YAML WEIGHTS_NPZ N OUT_NPZ`` writes the
outputs (logits) of the first N test samples (key ``logits``); the TF backend has the same command,
and a parity test compares the two. ``python -m dualtrain.backends.torch.tools env`` prints
torch's facts
(``envinfo.backend_facts``) as one JSON object; ``dualtrain env`` runs it.
``python -m dualtrain.backends.torch.tools export SPEC_YAML WEIGHTS_NPZ OUT_FOLDER`` writes the
torch export (export.py). ``describe SPEC_YAML OUT_FOLDER`` describes a model pair's torch side;
``convert SPEC_YAML OUT_FOLDER`` also runs model.convert and learns the map (convert.py).
"""

from __future__ import annotations

import gc

if __name__ == "__main__":  # a short-lived tool process: its framework import without cyclic GC
    gc.disable()  # (dualtrain.runtime.start.settle_gc says what that saves)

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dualtrain.backends.torch import kernels as torch_kernels
from dualtrain.backends.torch.convert import convert
from dualtrain.backends.torch.envinfo import backend_facts
from dualtrain.backends.torch.export import export_torch
from dualtrain.backends.torch.locate import probe_layers
from dualtrain.backends.torch.model import build_model, load_canonical
from dualtrain.backends.torch.pair import build_module, describe, load_pair
from dualtrain.core import pair
from dualtrain.core.weights import Weights, check_layout
from dualtrain.runtime.entry import (
    describe_main,
    env_facts,
    env_main,
    export_main,
    forward_main,
    probe_layers_main,
)
from dualtrain.spec import Experiment


def forward_logits(
    spec: Experiment, weights: Weights, inputs: list[np.ndarray], layout: Any = None
) -> np.ndarray:
    """float32 outputs (N, width): fp32, eval mode, on the model inputs as dualtrain.core.data
    gives them (float32, images N,C,H,W)."""
    check_layout(weights, spec.model)
    if spec.model.is_pair:
        model = build_module(spec.model, spec.seed)
        load_pair(model, weights)
    else:
        model = build_model(spec.model, spec.seed)
        load_canonical(model, weights)
    model.eval()
    with torch.no_grad():
        xs = [torch.from_numpy(np.asarray(a, dtype=np.float32)) for a in inputs]
        return model(*xs).to(torch.float32).numpy().copy()


def _converted(spec: Experiment, out: Path) -> tuple[dict[str, Any], Weights]:
    side, weights, converted = convert(spec)
    (out / pair.CONVERTED_FILE).write_text(json.dumps(converted))
    return side, weights


def main(argv: list[str]) -> int:
    if argv[:1] == ["env"]:
        return env_main("torch", argv, lambda: env_facts(backend_facts, torch_kernels))
    if argv[:1] == ["probe-layers"]:
        return probe_layers_main("torch", argv, probe_layers)
    if argv[:1] == ["describe"]:
        return describe_main("torch", argv, describe)
    if argv[:1] == ["convert"]:  # a converted pair's torch side, and the map learned from it
        return describe_main("torch", argv, lambda spec: _converted(spec, Path(argv[-1])))
    if argv[:1] == ["export"]:
        return export_main("torch", argv, export_torch)
    return forward_main("torch", argv, forward_logits)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

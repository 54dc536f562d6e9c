"""Inspection tools: the torch model's fp32 logits for given weights and images; this backend's
environment facts.

CLI: ``python -m dualtrain.backends.torch.tools forward SPEC_YAML WEIGHTS_NPZ N OUT_NPZ`` writes the
logits of the first N MNIST test images (key ``logits``); the TF backend has the same command, and a
parity test compares the two. ``python -m dualtrain.backends.torch.tools env`` prints torch's facts
(``envinfo.backend_facts``) as one JSON object; ``dualtrain env`` runs it.
``python -m dualtrain.backends.torch.tools export SPEC_YAML WEIGHTS_NPZ OUT_FOLDER`` writes the
torch export (export.py).
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from dualtrain.backends.torch.model import build_model, load_canonical
from dualtrain.core.data import normalize
from dualtrain.core.weights import Weights, check_layout
from dualtrain.spec import Experiment


def forward_logits(spec: Experiment, weights: Weights, images_uint8: np.ndarray) -> np.ndarray:
    """float32 logits (N, 10): fp32, eval mode, inputs normalised with
    dualtrain.core.data.normalize."""
    check_layout(weights, spec.model)
    model = build_model(spec.model, spec.seed)
    load_canonical(model, weights)
    model.eval()
    with torch.no_grad():
        x = torch.from_numpy(normalize(np.asarray(images_uint8, dtype=np.uint8)))
        return model(x).to(torch.float32).numpy().copy()


def main(argv: list[str]) -> int:
    from dualtrain.runtime.entry import env_main, export_main, forward_main

    if argv[:1] == ["env"]:
        from dualtrain.backends.torch.envinfo import backend_facts

        return env_main("torch", argv, backend_facts)
    if argv[:1] == ["export"]:
        from dualtrain.backends.torch.export import export_torch

        return export_main("torch", argv, export_torch)
    return forward_main("torch", argv, forward_logits)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

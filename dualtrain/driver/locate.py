"""``dualtrain diff-models`` and the locator after a failed fp64 pair: both sides of a model pair
run the same batch in float64, each in its own backend's child process (the torch side first: the
Keras side is fed the torch modules' inputs), and dualtrain.core.locate names the first layer
that introduces a difference and the classic mistake it fits."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.backends import PACKAGES, tools_warm
from dualtrain.core import data as data_mod
from dualtrain.core import locate, pair
from dualtrain.core.weights import Weights, save_weights
from dualtrain.errors import UserError
from dualtrain.launch import forkserver
from dualtrain.launch.child import worker_env
from dualtrain.spec import Backend, Experiment
from dualtrain.spec.load import dump_spec

TIMEOUT_S = 600


def _child(backend: Backend, args: list[str]) -> None:
    proc = forkserver.run(
        f"{PACKAGES[backend]}.tools",
        ["probe-layers", *args],
        env=worker_env({"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}),
        warm=tools_warm(backend),
        timeout=TIMEOUT_S,
    )
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        ours = [ln for ln in lines if ln.startswith("dualtrain: error: ")]
        if ours:
            raise UserError(ours[-1].removeprefix("dualtrain: error: "))
        sys.stderr.write("\n".join(lines[-30:]) + "\n")
        raise UserError(
            f"the locator's {backend.value} side failed (above): {lines[-1] if lines else ''}"
        )


def locate_pair(
    spec: Experiment, layout: pair.Layout, weights: Weights, samples: int = 16
) -> locate.Finding:
    """The locator on the first ``samples`` training samples (the data's transform applied),
    from ``weights`` (the run's initial weights, or any checkpoint's)."""
    data = data_mod.open_data(spec)
    n = min(samples, data.size(data_mod.TRAIN))
    if n < 1:
        raise UserError("the locator needs at least one training sample. Received: none")
    inputs = data.inputs(data_mod.TRAIN, slice(0, n))
    y = data.targets(data_mod.TRAIN, slice(0, n))
    with tempfile.TemporaryDirectory(prefix="dualtrain-locate-") as tmp:
        d = Path(tmp)
        (d / "spec.yaml").write_text(dump_spec(spec))
        save_weights(d / "weights.npz", weights)
        arrays: dict[str, Any] = {f"x{i}": a for i, a in enumerate(inputs)}
        np.savez(d / "batch.npz", y=y, **arrays)
        (d / "pair.json").write_text(json.dumps(layout.to_json()))
        common = [str(d / "spec.yaml"), str(d / "weights.npz"), str(d / "batch.npz")]
        _child(Backend.TORCH, [*common, str(d / "torch.npz")])
        _child(Backend.TF, [*common, str(d / "pair.json"), str(d / "torch.npz"), str(d / "tf.npz")])
        with np.load(d / "torch.npz") as z:
            t = {k: z[k] for k in z.files}
        with np.load(d / "tf.npz") as z:
            k = {key: z[key] for key in z.files}
    return locate.locate(layout, t, k, weights)


def table(finding: locate.Finding) -> str:
    """The per-layer differences as a plain table (terminal, report)."""

    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.2g}"

    rows = [
        ("torch module", "Keras layer", "input", "own output", "training", "running", "gradient")
    ]
    rows += [
        (r.module, r.keras, f(r.input), f(r.own), f(r.train), f(r.running), f(r.grad))
        for r in finding.rows
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)

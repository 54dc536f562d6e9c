"""The locator past a float32 limit (dualtrain.core.locate.finding.locate): a layer whose own
output differs by float32's rounding (a library computing part of it in float32, as Hugging
Face's and KerasHub's RMSNorm do in float64) does not stop the search. A mistake after it is
named with the limit said beside it; with none after it, the limit is the finding."""

from __future__ import annotations

import numpy as np

from dualtrain.core.locate.finding import locate
from dualtrain.core.locate.mistakes import FLOAT32_U
from dualtrain.core.pair.record import KerasVar, Layout, MapEntry, Side, TorchArray

RNG = np.random.default_rng(0)
X = RNG.normal(size=(4, 8))
LAYOUT = Layout(
    Side("t:f", "M", (8,), torch=(
        TorchArray("norm.weight", (8,), True, "norm", "other", "RMSNorm"),
        TorchArray("fc.weight", (8, 8), True, "fc", "dense", "Linear"),
    )),
    Side("k:f", "M", (8,), keras=(
        KerasVar("norm/scale", (8,), True, "norm", "other", "weight"),
        KerasVar("fc/kernel", (8, 8), True, "fc", "dense", "weight"),
    )),
    (
        MapEntry("norm.weight", "norm/scale", "identity"),
        MapEntry("fc.weight", "fc/kernel", "transpose"),
    ),
)  # fmt: skip


def _runs(fc_off: float) -> tuple[dict, dict]:
    """The torch side's outputs and the Keras side's, fed the torch modules' inputs: the norm's
    1.1 float32 roundings apart, the dense layer ``fc_off`` apart."""
    t = {"out/norm": X, "out/fc": X @ X.T}
    k = {"fed/norm": X * (1 + 1.1 * FLOAT32_U), "fed/fc": (X @ X.T) * (1 + fc_off)}
    return t, k


def test_a_mistake_after_a_float32_limit_is_named_with_the_limit_beside_it():
    found = locate(LAYOUT, *_runs(0.5), {})
    assert found.where == "torch 'fc' / Keras 'fc'" and found.what == "output", found.line()
    assert "Before it, torch 'norm' / Keras 'norm' differs by float32 arithmetic" in found.detail


def test_a_float32_limit_with_nothing_after_it_is_the_finding():
    found = locate(LAYOUT, *_runs(0.0), {})
    assert found.where == "torch 'norm' / Keras 'norm'", found.line()
    assert found.mistake.startswith("float32 arithmetic inside the layer")

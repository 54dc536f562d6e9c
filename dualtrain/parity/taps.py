"""The replayed step layer by layer (debug.dump_layers): where the loss of a replayed step differs
(dualtrain.parity.replay), or its evaluation, both backends saved every layer's output on the same
samples and weights, in training and in inference, with each sample's loss. :func:`first_layer`
names the first layer, in forward order, whose output differs while its input agrees, and checks
the mechanisms a port is known to carry (:mod:`dualtrain.parity.layer_mechanisms`): dropout masks
drawn by another key or left on in inference, batchnorm's eps or variance, a loss scaled or
label-smoothed. :func:`layer_rows` is the per-layer picture the report draws.

Framework-free: it reads the two runs' ``layers_step{N}.npz`` only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dualtrain.core.model import ResolvedLayer, forward_order, resolve
from dualtrain.core.weights import Weights
from dualtrain.parity import layer_mechanisms as M
from dualtrain.parity.loss_mechanisms import loss_mechanism
from dualtrain.parity.mechanisms import rel
from dualtrain.records.record import LAYERS_PREFIX, LAYERS_SUFFIX, layers_file
from dualtrain.spec import Experiment

TRAINING, INFERENCE = "train", "eval"
#: Relative difference that counts as parting (dualtrain.parity.replay's): one fp64 forward of
#: the two backends sits at 1e-16-1e-14.
TOL = 1e-10

Taps = dict[str, np.ndarray]


@dataclass(frozen=True)
class LayerRow:
    """One layer's relative difference between the two sides, in training and in inference (nan:
    not tapped)."""

    prefix: str
    kind: str
    train: float
    eval: float

    def to_json(self) -> dict[str, object]:
        return {
            "layer": self.prefix,
            "type": self.kind,
            "training": _finite(self.train),
            "inference": _finite(self.eval),
        }


def _finite(x: float) -> float | str | None:
    return None if math.isnan(x) else ("inf" if math.isinf(x) else x)


@dataclass(frozen=True)
class LayerFinding:
    mode: str
    """TRAINING or INFERENCE."""
    prefix: str | None
    """The layer's canonical prefix; None: every layer agrees and the loss differs."""
    rel: float
    what: str
    mechanism: str = ""


def read_taps(run_dir: Path, step: int) -> Taps | None:
    p = Path(run_dir) / layers_file(step)
    if not p.is_file():
        return None
    with np.load(p) as z:
        return {k: z[k] for k in z.files}


def tapped_steps(run_dir: Path) -> list[int]:
    steps = []
    for p in Path(run_dir).glob(f"{LAYERS_PREFIX}*{LAYERS_SUFFIX}"):
        digits = p.name.removeprefix(LAYERS_PREFIX).removesuffix(LAYERS_SUFFIX)
        if digits.isdigit():
            steps.append(int(digits))
    return sorted(steps)


def _layers(spec: Experiment) -> list[ResolvedLayer]:
    return list(forward_order(resolve(spec.model)))


def _inputs(
    layers: list[ResolvedLayer] | tuple[ResolvedLayer, ...],
    given: str | None,
    into: dict[str, str | None],
) -> None:
    """The tap key of each layer's input (None: several, a concat's)."""
    x = given
    for r in layers:
        for k, branch in enumerate(r.branches):
            _inputs(branch, f"input/{k}", into)
        _inputs(r.body, x, into)
        _inputs(r.shortcut, x, into)
        into[r.prefix] = None if r.branches else x
        x = f"{{mode}}/{r.prefix}"


def layer_rows(spec: Experiment, a: Taps, b: Taps) -> list[LayerRow]:
    """Every layer's relative difference, in forward order, then the model's output."""
    rows = []
    for r in _layers(spec):
        rows.append(
            LayerRow(
                r.prefix,
                r.spec.type.value,
                *(_rel(a, b, f"{m}/{r.prefix}") for m in (TRAINING, INFERENCE)),
            )
        )
    rows.append(LayerRow("output", "loss", _rel(a, b, "train/loss"), _rel(a, b, "eval/loss")))
    return rows


def _rel(a: Taps, b: Taps, key: str) -> float:
    if key not in a or key not in b:
        return math.nan
    return rel(a[key], b[key])


def first_layer(
    spec: Experiment,
    labels: tuple[str, str],
    taps: tuple[Taps, Taps],
    weights: Weights,
    step: int,
    mode: str,
) -> LayerFinding | None:
    """The first layer whose ``mode`` output differs while its input agrees (from ``weights``, the
    state both sides stepped from), or the loss where every layer agrees; None where nothing
    does."""
    a, b = taps
    into: dict[str, str | None] = {}
    _inputs(resolve(spec.model), "input/0", into)
    for r in _layers(spec):
        key = f"{mode}/{r.prefix}"
        d = _rel(a, b, key)
        if math.isnan(d) or d <= TOL:
            continue
        src = into.get(r.prefix)
        x = a.get(src.format(mode=mode)) if src is not None else None
        kind = r.spec.type.value
        where = "in training" if mode == TRAINING else "in inference"
        what = (
            f"the output of layer {r.prefix!r} ({kind}) at step {step} differs {where} "
            f"({d:.3g} relative) while its input agrees"
        )
        case = M.Layer(r, spec.seed, step, a["ids"], x, weights, mode == TRAINING)
        mechanism = M.layer_mechanism(labels, case, a[key], b[key])
        if not mechanism:
            what += f": {_values(labels, a[key], b[key])}"
        return LayerFinding(mode, r.prefix, d, what, mechanism)
    key = f"{mode}/loss"
    d = _rel(a, b, key)
    if math.isnan(d) or d <= TOL:
        return None  # the tapped samples agree: the replay keeps its own words
    what = (
        f"the loss of step {step} differs ({d:.3g} relative) while every layer's output agrees: "
        f"the loss function"
    )
    out = a[f"{mode}/output"]
    mechanism = loss_mechanism(labels, spec.model.loss, out, a["y"], (a[key], b[key]))
    return LayerFinding(mode, None, d, what, mechanism)


def _values(labels: tuple[str, str], x: np.ndarray, y: np.ndarray) -> str:
    """Both sides' values where they differ most."""
    i = np.unravel_index(int(np.argmax(np.abs(x - y))), x.shape)
    at = ", ".join(str(int(k)) for k in i)
    return f"at [{at}] {labels[0]} {x[i]:.17g}, {labels[1]} {y[i]:.17g}"

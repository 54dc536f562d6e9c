"""The locator: where a model pair's two sides first part, and which classic porting mistake it is.
Framework-free: it judges what each backend's child recorded on the same batch in float64
(dualtrain.backends.torch.pair.probe_layers, dualtrain.backends.tf.pair.probe_layers).

For each weighted layer, in the order the torch forward runs them, three relative differences:

* ``input``: the Keras layer's input in the Keras forward against the torch module's input: a
  difference here that the previous layer's output did not have was made *between* the two
  (activations, flatten, add: the parameter-free operations);
* ``own``: the Keras layer's output when it is fed the torch module's input, against the torch
  module's output: what the layer itself does differently (a difference it *introduces*, not one
  it inherits);
* ``grad``: the parameters' gradients of the same loss on the same batch.

The first layer with a difference over :data:`TOL` is the finding; then the model's output (a
softmax after the last layer), then the gradients. Each finding is matched against the classic
mistakes where the evidence fits: asymmetric 'same' padding on a strided convolution, flatten
order, a transposed kernel, an activation inside the last dense layer (softmax with a loss on
logits), a different activation (approximate vs exact gelu), Keras's float64 gelu.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from dualtrain.core.pair import Layout

#: A float64 difference larger than this is a difference in what is computed (float64 rounding
#: through these layers is ~1e-15 relative)
TOL = 1e-9

_PROBE = np.linspace(-4.0, 4.0, 81)
_ERF = np.vectorize(math.erf)


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "identity": lambda x: x,
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu (exact, erf)": lambda x: 0.5 * x * (1.0 + _ERF(x / math.sqrt(2.0))),
    "gelu (tanh approximation)": lambda x: (
        0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    ),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "tanh": np.tanh,
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "softmax": _softmax,
}


def classify(values: np.ndarray) -> tuple[str, float]:
    """(the activation that maps the probe vector onto ``values``, its largest deviation)."""
    best, err = "other", math.inf
    for name, fn in ACTIVATIONS.items():
        ref = fn(_PROBE)
        if values.shape != ref.shape:
            continue
        e = float(np.max(np.abs(values - ref)))
        if e < err:
            best, err = name, e
    return (best, err) if err < 1e-6 else ("other", err)


def rel(a: np.ndarray | None, b: np.ndarray | None) -> float | None:
    if a is None or b is None:
        return None
    if a.shape != b.shape:
        return math.inf
    den = float(np.linalg.norm(b))
    return float(np.linalg.norm(a - b)) / (den if den > 0 else 1.0)


@dataclass
class Row:
    module: str
    keras: str
    input: float | None
    own: float | None
    grad: float | None


@dataclass
class Finding:
    where: str
    """The torch module (and Keras layer) where the difference is introduced, or "output"."""
    what: str
    """input, output, model output, gradient, or nothing."""
    size: float
    mistake: str
    """The classic mistake the evidence fits ("" when none does)."""
    detail: str
    rows: list[Row] = field(default_factory=list)

    def line(self) -> str:
        if self.what == "nothing":
            return f"locator: {self.detail}"
        name = f": {self.mistake}" if self.mistake else ""
        return (
            f"locator: first difference at {self.where} ({self.what}, {self.size:.2g}){name}. "
            f"{self.detail}"
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _modules(layout: Layout) -> list[tuple[str, str, str]]:
    """(torch module, Keras layer, kind) of every weighted layer, in torch forward order."""
    entries = layout.by_torch()
    keras = {v.path: v for v in layout.keras.keras}
    out: list[tuple[str, str, str]] = []
    for a in layout.torch.torch:
        if out and out[-1][0] == a.module:
            continue
        out.append((a.module, keras[entries[a.name].keras].layer, a.kind))
    return out


def _keras_layer(layout: Layout, name: str) -> dict[str, Any]:
    return next((d for d in layout.keras.layers if d.get("name") == name), {})


def _activations(side: dict[str, np.ndarray]) -> dict[str, tuple[str, float]]:
    return {k[4:]: classify(v) for k, v in side.items() if k.startswith("act/")}


def _activation_mistake(t: dict[str, np.ndarray], k: dict[str, np.ndarray]) -> str:
    ta = {n for n, _ in _activations(t).values() if n not in ("identity", "other")}
    ka = {n for n, _ in _activations(k).values() if n not in ("identity", "other")}
    if ta != ka:
        only_t, only_k = sorted(ta - ka), sorted(ka - ta)
        if any("gelu" in n for n in only_t + only_k):
            return (
                f"approximate vs exact gelu (torch uses {', '.join(only_t) or '-'}, Keras "
                f"{', '.join(only_k) or '-'})"
            )
        return (
            f"a different activation (torch: {', '.join(only_t) or '-'}; Keras: "
            f"{', '.join(only_k) or '-'})"
        )
    exact = ACTIVATIONS["gelu (exact, erf)"](_PROBE)
    for name, v in k.items():
        if name.startswith("act/") and classify(v)[0] == "gelu (exact, erf)":
            err = float(np.max(np.abs(v - exact)))
            if err > 1e-12:
                return (
                    f"Keras's float64 gelu is only float32-accurate ({err:.1g} off the exact "
                    f"form at {name[4:]}; compute x * 0.5 * (1 + erf(x * sqrt(1/2))) instead)"
                )
    return ""


def locate(
    layout: Layout,
    t: dict[str, np.ndarray],
    k: dict[str, np.ndarray],
    weights: dict[str, np.ndarray],
) -> Finding:
    rows: list[Row] = []
    prev_out_ok = True
    prev = "the model's input"
    for module, layer, kind in _modules(layout):
        row = Row(
            module,
            layer,
            rel(k.get(f"kin/{module}"), t.get(f"in/{module}")),
            rel(k.get(f"fed/{module}"), t.get(f"out/{module}")),
            max(
                (
                    rel(k.get(f"grad/{a.name}"), t.get(f"grad/{a.name}")) or 0.0
                    for a in layout.torch.torch
                    if a.module == module and a.trainable
                ),
                default=None,
            ),
        )
        rows.append(row)
        where = f"torch {module!r} / Keras {layer!r}"
        if row.input is not None and row.input > TOL and prev_out_ok:
            mistake = _flatten_mistake(layout, module, t, k) or _activation_mistake(t, k)
            return Finding(
                where,
                "input",
                row.input,
                mistake,
                f"The layers before it agree (their outputs match), so the parameter-free "
                f"operations between {prev} and this layer differ (activations, flatten, add, "
                f"padding, pooling).",
                rows,
            )
        if row.own is not None and row.own > TOL:
            mistake = _layer_mistake(layout, module, layer, kind, t, k, weights)
            return Finding(
                where,
                "output",
                row.own,
                mistake,
                "Fed the torch module's input, the Keras layer computes another output: the "
                "difference is introduced here, not inherited.",
                rows,
            )
        prev_out_ok = row.own is None or row.own <= TOL
        prev = f"{module!r}"
    out = rel(k.get("output"), t.get("output"))
    if out is not None and out > TOL:
        mistake = ""
        if rel(k["output"], _softmax(t["output"])) < TOL:  # type: ignore[operator]
            mistake = "softmax inside the model while the loss takes logits"
        else:
            mistake = _activation_mistake(t, k)
        return Finding(
            f"the model's output, after {prev}",
            "model output",
            out,
            mistake,
            "Every weighted layer agrees; what follows the last one differs.",
            rows,
        )
    for row in rows:
        if row.grad is not None and row.grad > TOL:
            return Finding(
                f"torch {row.module!r} / Keras {row.keras!r}",
                "gradient",
                row.grad,
                "",
                "The forward passes agree; this layer's parameter gradient of the same loss "
                "differs (a custom gradient, or an operation whose derivative differs).",
                rows,
            )
    return Finding(
        "",
        "nothing",
        0.0,
        "",
        f"the two models agree on this batch to {TOL:g} (every layer's input, output and "
        f"gradient, and the model's output): the difference is not in the models' forward or "
        f"backward on these samples.",
        rows,
    )


def _flatten_mistake(layout: Layout, module: str, t: dict, k: dict) -> str:
    entry = next((e for e in layout.entries if e.torch == f"{module}.weight"), None)
    x_t, x_k = t.get(f"in/{module}"), k.get(f"kin/{module}")
    if entry is None or entry.chw is None or x_t is None or x_k is None:
        return ""
    c, h, w = entry.chw
    n = len(x_t)
    hwc_as_chw = x_t.reshape(n, h, w, c).transpose(0, 3, 1, 2).reshape(n, -1)
    chw_as_hwc = x_t.reshape(n, c, h, w).transpose(0, 2, 3, 1).reshape(n, -1)
    if min(rel(x_k, hwc_as_chw) or 1.0, rel(x_k, chw_as_hwc) or 1.0) < TOL:
        return (
            "flatten order: the two sides flatten the (C, H, W) activations in different orders "
            "(torch flattens C,H,W; a port from Keras often flattens H,W,C)"
        )
    return ""


def _layer_mistake(
    layout: Layout, module: str, layer: str, kind: str, t: dict, k: dict, weights: dict
) -> str:
    cfg = _keras_layer(layout, layer)
    strides = cfg.get("strides") or [1]
    if kind == "conv2d" and cfg.get("padding") == "same" and max(strides) > 1:
        return (
            "asymmetric 'same' padding: Keras's padding='same' on a strided convolution pads the "
            "bottom/right only, torch's padding=P both sides (use ZeroPadding2D(P) and 'valid')"
        )
    act = cfg.get("activation")
    if act == "softmax":
        return "softmax inside the model while the loss takes logits (the loss applies its own)"
    if isinstance(act, str) and act not in ("linear", "None", ""):
        return (
            f"an activation inside the Keras layer ({act}) that torch applies elsewhere or not "
            f"at all"
        )
    w, b = weights.get(f"{module}.weight"), weights.get(f"{module}.bias")
    x, fed = t.get(f"in/{module}"), k.get(f"fed/{module}")
    if kind == "dense" and w is not None and x is not None and fed is not None:
        if w.shape[0] == w.shape[1]:
            untransposed = x @ np.asarray(w, np.float64) + (0.0 if b is None else b)
            if (rel(fed, untransposed) or 1.0) < TOL:
                return "a transposed kernel: the Keras kernel is the torch weight untransposed"
    return ""

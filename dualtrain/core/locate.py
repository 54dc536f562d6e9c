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


def _close(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    """Both present and the same to :data:`TOL`."""
    r = rel(a, b)
    return r is not None and r <= TOL


@dataclass
class Row:
    module: str
    keras: str
    input: float | None
    own: float | None
    grad: float | None
    train: float | None = None
    """Training mode: the Keras layer's output fed the torch module's training-mode input."""
    running: float | None = None
    """Batchnorm: the running statistics one training call leaves, fed the same input."""


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
            return f"locator: {self.detail}" + (f": {self.mistake}" if self.mistake else "")
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
    # parameters whose gradient is rounding noise on both sides: their relative difference says
    # nothing, and they are judged on their own below
    still = _no_gradient(layout, t, k)
    for module, layer, kind in _modules(layout):
        row = Row(
            module,
            layer,
            rel(k.get(f"kin/{module}"), t.get(f"in/{module}")),
            rel(k.get(f"fed/{module}"), t.get(f"out/{module}")),
            _worst(layout, module, True, "grad/", "grad/", t, k, skip=still),
            rel(k.get(f"tfed/{module}"), t.get(f"tout/{module}")),
            _worst(layout, module, False, "fedrun/", "running/", t, k),
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
        if row.train is not None and row.train > TOL:
            mistake = _layer_mistake(layout, module, layer, kind, t, k, weights)
            return Finding(
                where,
                "training-mode output",
                row.train,
                mistake,
                "In inference the layer agrees; in training mode (batch statistics), fed the "
                "torch module's input, it computes another output.",
                rows,
            )
        if row.running is not None and row.running > TOL:
            mistake = _batchnorm_mistake(layout, module, layer, t, k, weights)
            return Finding(
                where,
                "running statistics",
                row.running,
                mistake,
                "Its outputs agree; the running statistics one training step leaves differ, "
                "which the next evaluation (and every later step's inference) inherits.",
                rows,
            )
        prev_out_ok = row.own is None or row.own <= TOL
        prev = f"{module!r}"
    out = max(
        (r for r in (rel(k.get(key), t.get(key)) for key in ("output/eval", "output")) if r),
        default=None,
    )
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
    if still:
        module = next(a.module for a in layout.torch.torch if a.name == still[0])
        row = next(r for r in rows if r.module == module)
        return Finding(
            f"torch {module!r} / Keras {row.keras!r}",
            "gradient",
            rel(k.get(f"grad/{still[0]}"), t.get(f"grad/{still[0]}")) or 0.0,
            f"a parameter with no gradient in exact arithmetic ({', '.join(still[:3])}: its "
            f"gradient is rounding noise on both sides, as for a bias right before a "
            f"batchnorm, which subtracts it again); each side moves it by its own noise, and "
            f"an optimizer that normalises the gradient (adam, rmsprop) scales that noise up to "
            f"~lr * 1e-9 per step: drop the parameter (bias=False / use_bias=False, as "
            f"torchvision's ResNets do)",
            "Every layer's input and output, and every other gradient, agree; the pair's "
            "weights part through a parameter that should not move at all.",
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
    if _close(x_k, hwc_as_chw) or _close(x_k, chw_as_hwc):
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
    if kind == "batchnorm":
        return _batchnorm_mistake(layout, module, layer, t, k, weights)
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
            if _close(fed, untransposed):
                return "a transposed kernel: the Keras kernel is the torch weight untransposed"
    return ""


def _worst(
    layout: Layout,
    module: str,
    trainable: bool,
    k_tag: str,
    t_tag: str,
    t: dict,
    k: dict,
    skip: list[str] | None = None,
) -> float | None:
    """The largest relative difference over the module's trainable (or non-trainable) arrays,
    less ``skip``."""
    values = [
        rel(k.get(f"{k_tag}{a.name}"), t.get(f"{t_tag}{a.name}"))
        for a in layout.torch.torch
        if a.module == module and a.trainable == trainable and a.name not in (skip or ())
    ]
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _no_gradient(layout: Layout, t: dict, k: dict) -> list[str]:
    """Trainable arrays whose gradient is rounding noise (under 1e-12 of the largest) on both
    sides."""
    norms = {
        a.name: (np.linalg.norm(t[f"grad/{a.name}"]), np.linalg.norm(k[f"grad/{a.name}"]))
        for a in layout.torch.torch
        if a.trainable and f"grad/{a.name}" in t and f"grad/{a.name}" in k
    }
    top = max((max(v) for v in norms.values()), default=0.0)
    return [n for n, (a, b) in norms.items() if top > 0 and max(a, b) < 1e-12 * top]


def _torch_layer(layout: Layout, name: str) -> dict[str, Any]:
    return next((d for d in layout.torch.layers if d.get("name") == name), {})


def _batchnorm_mistake(
    layout: Layout, module: str, layer: str, t: dict, k: dict, weights: dict
) -> str:
    """The batchnorm conventions the two layers' settings and running statistics show: eps,
    the momentum convention (torch's weights the new batch statistic, Keras's the old value),
    the running variance (torch keeps the unbiased batch variance, Keras's BatchNormalization
    the biased one)."""
    tc, kc = _torch_layer(layout, module), _keras_layer(layout, layer)
    if "momentum" not in tc or "momentum" not in kc:
        return ""
    torch_style = kc.get("cls") == "TorchBatchNormalization"
    m_t, eps_t = float(tc["momentum"]), float(tc["eps"])
    m_k = float(kc["momentum"]) if torch_style else 1.0 - float(kc["momentum"])
    eps_k = float(kc.get("eps" if torch_style else "epsilon", eps_t))
    found: list[str] = []
    if abs(eps_t - eps_k) > 1e-15:
        found.append(f"BatchNorm eps (torch eps={eps_t:g}, Keras epsilon={eps_k:g})")
    if abs(m_t - m_k) > 1e-12:
        if not torch_style and abs(float(kc["momentum"]) - m_t) < 1e-12:
            found.append(
                f"BatchNorm momentum convention (torch's momentum={m_t:g} weights the new batch "
                f"statistic, Keras's momentum={m_t:g} the old value: the port needs "
                f"momentum={1 - m_t:g})"
            )
        elif torch_style:
            found.append(
                f"BatchNorm momentum (torch momentum={m_t:g}, TorchBatchNormalization "
                f"momentum={m_k:g}, both the weight of the new batch statistic)"
            )
        else:
            found.append(
                f"BatchNorm momentum convention (torch momentum={m_t:g}; Keras "
                f"momentum={float(kc['momentum']):g}, which is torch's {m_k:g}: Keras's momentum "
                f"weights the old value, torch's the new batch statistic)"
            )
    x = t.get(f"tin/{module}")
    var_k, var0 = k.get(f"fedrun/{module}.running_var"), weights.get(f"{module}.running_var")
    if not torch_style and x is not None and var_k is not None and var0 is not None:
        axes = (0, *range(2, x.ndim))
        biased = (1.0 - m_k) * np.asarray(var0, np.float64) + m_k * x.var(axis=axes)
        if _close(var_k, biased) and not _close(var_k, t.get(f"running/{module}.running_var")):
            found.append(
                "BatchNorm running-variance convention (Keras's BatchNormalization keeps the "
                "biased batch variance, torch the unbiased one, n/(n-1) larger; "
                "dualtrain.backends.tf.port.TorchBatchNormalization keeps torch's)"
            )
    return "; ".join(found)

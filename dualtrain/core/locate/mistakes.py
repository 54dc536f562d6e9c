"""The classic porting mistakes, named where the locator's evidence fits one: asymmetric 'same'
padding on a strided convolution, flatten order, a transposed kernel, an activation inside the
last dense layer (softmax with a loss on logits), a different activation (approximate vs exact
gelu, told apart by what each side makes of one probe vector), Keras's float64 gelu, the
batchnorm conventions (eps, momentum, running variance); a converter's mistakes first
(dualtrain.core.locate.converter).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from dualtrain.core.locate.compare import TOL, rel
from dualtrain.core.locate.converter import converter_mistake
from dualtrain.core.pair.record import Layout

#: The points every activation is probed at, on both sides (the backends' locators apply each
#: parameter-free layer and each layer's own activation to it: ``act/``), and classified here.
ACTIVATION_PROBE = np.linspace(-4.0, 4.0, 81)
_ERF = np.vectorize(math.erf)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
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
    "softmax": softmax,
}


def classify(values: np.ndarray) -> tuple[str, float]:
    """(the activation that maps the probe vector onto ``values``, its largest deviation)."""
    best, err = "other", math.inf
    for name, fn in ACTIVATIONS.items():
        ref = fn(ACTIVATION_PROBE)
        if values.shape != ref.shape:
            continue
        e = float(np.max(np.abs(values - ref)))
        if e < err:
            best, err = name, e
    return (best, err) if err < 1e-6 else ("other", err)


def close(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    """Both present and the same to :data:`TOL`."""
    r = rel(a, b)
    return r is not None and r <= TOL


def _keras_layer(layout: Layout, name: str) -> dict[str, Any]:
    return next((d for d in layout.keras.layers if d.get("name") == name), {})


def _activations(side: dict[str, np.ndarray]) -> dict[str, tuple[str, float]]:
    return {k[4:]: classify(v) for k, v in side.items() if k.startswith("act/")}


def activation_mistake(t: dict[str, np.ndarray], k: dict[str, np.ndarray]) -> str:
    ta = {n for n, _ in _activations(t).values() if n not in ("identity", "other")}
    ka = {n for n, _ in _activations(k).values() if n not in ("identity", "other")}
    if ta != ka:
        only_t, only_k = sorted(ta - ka), sorted(ka - ta)
        if any("gelu" in n for n in only_t + only_k):
            return (
                f"approximate vs exact gelu (torch uses {', '.join(only_t) or '-'}, Keras "
                f"{', '.join(only_k) or '-'}; one form on both sides: nn.GELU() is Keras's "
                f"gelu(approximate=False), nn.GELU(approximate='tanh') its approximate=True)"
            )
        return (
            f"a different activation (torch: {', '.join(only_t) or '-'}; Keras: "
            f"{', '.join(only_k) or '-'})"
        )
    exact = ACTIVATIONS["gelu (exact, erf)"](ACTIVATION_PROBE)
    for name, v in k.items():
        if name.startswith("act/") and classify(v)[0] == "gelu (exact, erf)":
            err = float(np.max(np.abs(v - exact)))
            if err > 1e-12:
                return (
                    f"Keras's float64 gelu is only float32-accurate ({err:.1g} off the exact "
                    f"form at {name[4:]}; compute x * 0.5 * (1 + erf(x * sqrt(1/2))) instead)"
                )
    return ""


def flatten_mistake(layout: Layout, module: str, t: dict, k: dict) -> str:
    entry = next((e for e in layout.entries if e.torch == f"{module}.weight"), None)
    x_t, x_k = t.get(f"in/{module}"), k.get(f"kin/{module}")
    if entry is None or entry.chw is None or x_t is None or x_k is None:
        return ""
    c, h, w = entry.chw
    n = len(x_t)
    hwc_as_chw = x_t.reshape(n, h, w, c).transpose(0, 3, 1, 2).reshape(n, -1)
    chw_as_hwc = x_t.reshape(n, c, h, w).transpose(0, 2, 3, 1).reshape(n, -1)
    if close(x_k, hwc_as_chw) or close(x_k, chw_as_hwc):
        return (
            "flatten order: the two sides flatten the (C, H, W) activations in different orders "
            "(torch flattens C,H,W; a port from Keras often flattens H,W,C)"
        )
    return ""


def _inside_activation(act: str, t: dict[str, np.ndarray]) -> str:
    """A Keras layer that applies ``act`` itself: against the activations torch applies (its
    activation modules, and those held as functions, as nn.TransformerEncoderLayer holds F.relu)."""
    torch_acts: dict[str, list[str]] = {}
    for where, (kind, _) in _activations(t).items():
        if kind not in ("identity", "other"):
            torch_acts.setdefault(kind, []).append(where)
    if torch_acts and not any(kind.split(" ")[0] == act for kind in torch_acts):
        shown = "; ".join(f"{kind} at {', '.join(w)}" for kind, w in sorted(torch_acts.items()))
        return f"a different activation: the Keras layer applies {act}, torch {shown}"
    return (
        f"an activation inside the Keras layer ({act}) that torch applies elsewhere or not at all"
    )


def layer_mistake(
    layout: Layout, module: str, layer: str, kind: str, t: dict, k: dict, weights: dict
) -> str:
    converted = converter_mistake(layout, module)
    if converted:
        return converted
    cfg = _keras_layer(layout, layer)
    strides = cfg.get("strides") or [1]
    if kind == "conv2d" and cfg.get("padding") == "same" and max(strides) > 1:
        return (
            "asymmetric 'same' padding: Keras's padding='same' on a strided convolution pads the "
            "bottom/right only, torch's padding=P both sides (use ZeroPadding2D(P) and 'valid')"
        )
    if kind == "batchnorm":
        return batchnorm_mistake(layout, module, layer, t, k, weights)
    eps = norm_eps_mistake(_torch_layer(layout, module), cfg)
    if eps:
        return eps
    act = cfg.get("activation")
    if act == "softmax":
        return "softmax inside the model while the loss takes logits (the loss applies its own)"
    if isinstance(act, str) and act not in ("linear", "None", ""):
        return _inside_activation(act, t)
    w, b = weights.get(f"{module}.weight"), weights.get(f"{module}.bias")
    x, fed = t.get(f"in/{module}"), k.get(f"fed/{module}")
    if kind == "dense" and w is not None and x is not None and fed is not None:
        if w.shape[0] == w.shape[1]:
            untransposed = x @ np.asarray(w, np.float64) + (0.0 if b is None else b)
            if close(fed, untransposed):
                return "a transposed kernel: the Keras kernel is the torch weight untransposed"
    return ""


#: float32's unit roundoff (2^-24): a layer that computes part of its work in float32 inside a
#: float64 run differs by a few of these, and by less than FLOAT32_SPAN of them
FLOAT32_U = 2.0**-24
FLOAT32_SPAN = 16.0
#: how :func:`float32_inside` begins: the locator goes past such a layer (a limit, not a mistake)
FLOAT32_INSIDE = "float32 arithmetic inside the layer"


def float32_inside(size: float) -> str:
    """A layer's own output that differs, fed the same float64 input, by float32's rounding: part
    of it computed in float32 on one side or both (a library's limit in float64), not a port's
    mistake."""
    if not 1e-9 < size < FLOAT32_SPAN * FLOAT32_U:
        return ""
    return (
        f"{FLOAT32_INSIDE}: fed the same float64 input, its output differs by "
        f"{size / FLOAT32_U:.2g} x float32's rounding (2^-24), what computing part of it in "
        f"float32 gives; a library's limit in float64 (Hugging Face's LlamaRMSNorm and KerasHub's "
        f"RMSNorm compute in float32 whatever the model's dtype), not a porting mistake"
    )


#: the frameworks' default normalisation epsilons (LayerNorm, GroupNorm, BatchNorm: torch 1e-5;
#: LayerNormalization, GroupNormalization, BatchNormalization: Keras 1e-3)
TORCH_EPS, KERAS_EPS = 1e-5, 1e-3


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-15 * max(abs(a), abs(b), 1e-30) + 1e-300


def norm_eps_mistake(tc: dict[str, Any], kc: dict[str, Any]) -> str:
    """A normalisation layer's epsilon that differs between the sides (LayerNorm, GroupNorm,
    ...: torch's eps, Keras's epsilon), with the side to fix: the one that holds Keras's default
    1e-3 where the other does not (Keras's left at its default, or Keras's default copied onto
    torch's side), else the one that holds either framework's default where the other holds a
    value of its own; both fixes where neither tells."""
    eps_k = kc.get("epsilon", kc.get("eps"))
    if "eps" not in tc or eps_k is None:
        return ""
    eps_t, eps_k = float(tc["eps"]), float(eps_k)
    if _same(eps_t, eps_k):
        return ""
    what = str(tc.get("cls", "normalisation")).removesuffix("2d").removesuffix("1d")
    head = f"{what} eps (torch eps={eps_t:g}, Keras {kc.get('cls', 'layer')} epsilon={eps_k:g}; "
    t_default, k_default = (_same(e, TORCH_EPS) or _same(e, KERAS_EPS) for e in (eps_t, eps_k))
    if _same(eps_k, KERAS_EPS) or (k_default and not t_default):
        return head + f"set the Keras layer's epsilon={eps_t:g})"
    if _same(eps_t, KERAS_EPS) or (t_default and not k_default):
        layer_norm = " (nn.TransformerEncoderLayer's layer_norm_eps)" if what == "LayerNorm" else ""
        origin = ", Keras's default," if _same(eps_t, KERAS_EPS) else ""
        return head + (
            f"the torch side differs: its eps={eps_t:g}{origin} where the Keras layer's is "
            f"{eps_k:g}; set the torch layer's eps={eps_k:g}{layer_norm})"
        )
    return head + (
        f"make them equal: the Keras layer's epsilon={eps_t:g}, or the torch layer's eps={eps_k:g})"
    )


def _torch_layer(layout: Layout, name: str) -> dict[str, Any]:
    return next((d for d in layout.torch.layers if d.get("name") == name), {})


def batchnorm_mistake(
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
        if close(var_k, biased) and not close(var_k, t.get(f"running/{module}.running_var")):
            found.append(
                "BatchNorm running-variance convention (Keras's BatchNormalization keeps the "
                "biased batch variance, torch the unbiased one, n/(n-1) larger; "
                "dualtrain.backends.tf.port.TorchBatchNormalization keeps torch's)"
            )
    return "; ".join(found)

"""The known mechanisms behind a layer's or a loss's first difference (dualtrain.parity.taps): each
candidate recomputes the layer's output from its input (the same on both sides) and the weights
both sides stepped from, the spec's rule first, then the variants ports carry; the side whose
output a variant reproduces, where the other follows the spec's rule, is named with it. Checked,
not guessed: a mechanism is named only where it reproduces the output to float64 rounding.
Framework-free, float64 NumPy."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dualtrain.core import dropout, losses
from dualtrain.core.model import ResolvedLayer
from dualtrain.core.weights import Weights
from dualtrain.parity.mechanisms import rel
from dualtrain.spec import Approximate, LayerType, Loss

#: A recomputed output within this relative distance of a side's reproduces it.
FITS = 1e-9

#: Keras's and torch's batchnorm eps defaults (BatchNormalization(epsilon=1e-3), BatchNorm2d 1e-5)
KERAS_BN_EPS, TORCH_BN_EPS = 1e-3, 1e-5


@dataclass(frozen=True)
class Layer:
    """One layer at the first divergent step: what its candidates recompute from."""

    r: ResolvedLayer
    seed: int
    step: int
    ids: np.ndarray
    x: np.ndarray | None
    """Its input (the side A's; both agree), None for a concat."""
    weights: Weights
    training: bool


#: (what the candidate is, its output: from the layer and a side's observed output)
Candidate = tuple[str, Callable[[Layer, np.ndarray], np.ndarray]]


def layer_mechanism(labels: tuple[str, str], case: Layer, ya: np.ndarray, yb: np.ndarray) -> str:
    """The mechanism that tells the two outputs apart, in words, or ""."""
    kinds = {
        LayerType.DROPOUT: _dropout,
        LayerType.BATCHNORM: _batchnorm,
        LayerType.GELU: _gelu,
    }
    make = kinds.get(case.r.spec.type)
    if make is None or case.x is None:
        return ""
    return _match(labels, make(case), case, (ya, yb))


def _match(
    labels: tuple[str, str], candidates: list[Candidate], case: Layer, ys: tuple[np.ndarray, ...]
) -> str:
    def fits(k: int) -> list[str]:
        return [what for what, f in candidates if rel(f(case, ys[k]), ys[k]) <= FITS]

    spec_rule = candidates[0][0]
    found = [fits(0), fits(1)]
    for k in (0, 1):
        other = found[1 - k]
        if spec_rule in found[k] and other and spec_rule not in other:
            return f"{labels[1 - k]} departs from the spec's rule: {other[0]}"
    return ""


# ---- dropout ---------------------------------------------------------------------------------


def _mask(case: Layer, ids: np.ndarray, step: int) -> np.ndarray:
    r = case.r
    rate = float(r.spec.rate or 0.0)
    keep = dropout.keep(
        dropout.NUMPY,
        case.seed,
        np.int64(step),
        np.asarray(ids, np.int64),
        r.uid,
        dropout.canonical_elements(r.in_shape),
        rate,
    )
    return np.asarray(keep).reshape(case.x.shape if case.x is not None else (len(ids), -1))


def _dropped(case: Layer, keep: np.ndarray, scale: bool = True) -> np.ndarray:
    assert case.x is not None
    rate = float(case.r.spec.rate or 0.0)
    return np.where(keep, case.x * (1.0 / (1.0 - rate) if scale else 1.0), 0.0)


def _dropout(case: Layer) -> list[Candidate]:
    if not case.training:
        return [
            ("the identity in inference", lambda c, y: c.x),
            (
                "dropout left on in inference (kept values scaled by 1 / (1 - rate), the rest 0)",
                lambda c, y: _dropped(c, (y != 0) | (c.x == 0)),
            ),
        ]
    n = len(case.ids)
    return [
        ("masks by sample id", lambda c, y: _dropped(c, _mask(c, c.ids, c.step))),
        (
            "masks drawn by the sample's position in its local batch (0..n-1), not by its id "
            "(the spec's masks hash the seed, the step, the sample id, the layer and the element)",
            lambda c, y: _dropped(c, _mask(c, np.arange(n), c.step)),
        ),
        (
            "one mask for every sample (drawn without the sample's id)",
            lambda c, y: _dropped(c, _mask(c, np.zeros(n, np.int64), c.step)),
        ),
        (
            "kept values not scaled by 1 / (1 - rate)",
            lambda c, y: _dropped(c, _mask(c, c.ids, c.step), scale=False),
        ),
        ("dropout off in training (the identity)", lambda c, y: c.x),
    ]


# ---- batchnorm -------------------------------------------------------------------------------


def _normalise(case: Layer, eps: float, stats: str) -> np.ndarray:
    x = case.x
    assert x is not None
    axes = (0, 2, 3) if x.ndim == 4 else (0,)
    shape = (1, -1, 1, 1) if x.ndim == 4 else (1, -1)
    names = [n for n, _ in case.r.arrays]  # weight, bias, running_mean, running_var
    w, b, rm, rv = (np.asarray(case.weights[n], np.float64) for n in names)
    if stats == "running":
        mean, var = rm, rv
    else:
        mean = x.mean(axis=axes)
        n = x.size // x.shape[1]
        var = ((x - mean.reshape(shape)) ** 2).sum(axis=axes) / (
            n - 1 if stats == "unbiased" else n
        )
    scale = w / np.sqrt(var + eps)
    return (x - mean.reshape(shape)) * scale.reshape(shape) + b.reshape(shape)


def _with_eps(eps: float, stats: str) -> Callable[[Layer, np.ndarray], np.ndarray]:
    return lambda c, y: _normalise(c, eps, stats)


def _batchnorm(case: Layer) -> list[Candidate]:
    eps = float(case.r.spec.eps or TORCH_BN_EPS)
    own = "running" if not case.training else "batch"
    rule = (
        "the running statistics in inference"
        if not case.training
        else "the batch's mean and biased variance"
    )
    out: list[Candidate] = [(f"{rule}, eps {eps:g}", lambda c, y: _normalise(c, eps, own))]
    for other, name in ((KERAS_BN_EPS, "Keras's default"), (TORCH_BN_EPS, "torch's default")):
        if not math.isclose(other, eps):
            out.append((f"eps {other:g} ({name})", _with_eps(other, own)))
    if case.training:
        out += [
            (
                "normalised by the unbiased batch variance (torch normalises by the biased one)",
                lambda c, y: _normalise(c, eps, "unbiased"),
            ),
            (
                "the running statistics in training (the layer left in inference)",
                lambda c, y: _normalise(c, eps, "running"),
            ),
        ]
    else:
        out.append(
            (
                "the batch's statistics in inference (the layer left in training)",
                lambda c, y: _normalise(c, eps, "batch"),
            )
        )
    return out


# ---- gelu ------------------------------------------------------------------------------------

_ERF = np.vectorize(math.erf, otypes=[np.float64])


def _gelu_erf(case: Layer, y: np.ndarray) -> np.ndarray:
    assert case.x is not None
    return 0.5 * case.x * (1.0 + _ERF(case.x / math.sqrt(2.0)))


def _gelu_tanh(case: Layer, y: np.ndarray) -> np.ndarray:
    x = case.x
    assert x is not None
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _gelu(case: Layer) -> list[Candidate]:
    erf: Candidate = (
        "gelu's exact erf form (torch's default, Keras's approximate=False)",
        _gelu_erf,
    )
    tanh: Candidate = ("gelu's tanh approximation (Keras's approximate=True)", _gelu_tanh)
    return [tanh, erf] if case.r.spec.approximate is Approximate.TANH else [erf, tanh]


# ---- the loss --------------------------------------------------------------------------------


def loss_mechanism(
    labels: tuple[str, str],
    loss: Loss,
    out: np.ndarray,
    y: np.ndarray,
    sides: tuple[np.ndarray, np.ndarray],
) -> str:
    """Where one side's per-sample losses are the spec's (dualtrain.core.losses.reference) on the
    shared outputs: the other's, as a constant factor or as label smoothing, in words; else ""."""
    ref = losses.reference(loss, out, y)[0]
    for k in (0, 1):
        mine, other = sides[k], sides[1 - k]
        if rel(ref, mine) > FITS or rel(ref, other) <= FITS:
            continue
        who = labels[1 - k]
        ratio = other / np.where(ref == 0, np.nan, ref)
        ratio = ratio[np.isfinite(ratio)]
        if ratio.size >= 2 and float(np.ptp(ratio)) <= FITS * abs(float(ratio.mean())):
            r = float(ratio.mean())
            half = " (the 1/2 (o - t)^2 convention)" if abs(r - 0.5) < 1e-12 else ""
            return f"{who} departs from the spec's rule: its loss is the spec's x {r:.6g}{half}"
        return _smoothing(who, loss, out, y, ref, other)
    return ""


def _smoothing(
    who: str, loss: Loss, out: np.ndarray, y: np.ndarray, ref: np.ndarray, other: np.ndarray
) -> str:
    """``other`` as the loss with smoothed labels: linear in the smoothing, so one factor fitted
    over every sample, and named only where it reproduces each."""
    if loss is Loss.CROSS_ENTROPY:
        m = out.max(axis=1, keepdims=True)
        lse = np.log(np.exp(out - m).sum(axis=1)) + m[:, 0]
        full = (lse[:, None] - out).mean(axis=1)  # every class's share, label_smoothing = 1
    elif loss is Loss.BINARY_CROSS_ENTROPY:
        full = losses.reference(loss, out, np.full_like(np.asarray(y, np.float64), 0.5))[0]
    else:
        return ""
    d, step = other - ref, full - ref
    if len(d) < 2 or not np.any(step):
        return ""
    eps = float(d @ step / (step @ step))
    if rel(d, eps * step) > 1e-6:
        return ""
    return (
        f"{who} departs from the spec's rule: label smoothing {eps:.3g} (targets t (1 - s) + s / "
        f"{'K' if loss is Loss.CROSS_ENTROPY else '2'}, Keras's label_smoothing=s)"
    )

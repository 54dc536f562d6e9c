"""The known mechanisms behind a layer's or a loss's first difference (dualtrain.parity.taps): each
candidate recomputes the layer's output from its input (the same on both sides) and the weights
both sides stepped from, the spec's rule first, then the variants ports carry; the side whose
output a variant reproduces, where the other follows the spec's rule, is named with it. Checked,
not guessed: a mechanism is named only where it reproduces the output to float64 rounding (a
loss's: dualtrain.parity.loss_mechanisms). Framework-free, float64 NumPy."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dualtrain.core import batchnorm, dropout
from dualtrain.core.model import ResolvedLayer
from dualtrain.core.weights import Weights
from dualtrain.parity.mechanisms import rel
from dualtrain.spec import Approximate, LayerType

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


#: (what the candidate is: words, or words from the layer and the side's output; its output: from
#: the layer and a side's observed output)
Candidate = tuple[
    str | Callable[[Layer, np.ndarray], str], Callable[[Layer, np.ndarray], np.ndarray]
]


def layer_mechanism(labels: tuple[str, str], case: Layer, ya: np.ndarray, yb: np.ndarray) -> str:
    """The mechanism that tells the two outputs apart, in words, or ""."""
    kinds = {
        LayerType.DROPOUT: _dropout,
        LayerType.BATCHNORM: _batchnorm,
        LayerType.GELU: _gelu,
        LayerType.LAYERNORM: _layernorm,
        LayerType.FLATTEN: _flatten,
        LayerType.RELU: _relu,
    }
    make = kinds.get(case.r.spec.type)
    said = "" if make is None or case.x is None else _match(labels, make(case), case, (ya, yb))
    return said or _float32(labels, ya, yb)


def _float32(labels: tuple[str, str], ya: np.ndarray, yb: np.ndarray) -> str:
    """One side's float64 outputs all float32 values, the other's not: that side computed the
    layer in float32."""
    narrow = [bool(np.array_equal(y, y.astype(np.float32).astype(np.float64))) for y in (ya, yb)]
    if narrow[0] == narrow[1]:
        return ""
    who = labels[0] if narrow[0] else labels[1]
    return f"{who}'s outputs are float32 values in a float64 run: it computes this layer in float32"


def _match(
    labels: tuple[str, str], candidates: list[Candidate], case: Layer, ys: tuple[np.ndarray, ...]
) -> str:
    def fits(k: int) -> list[str]:
        return [
            what if isinstance(what, str) else what(case, ys[k])
            for what, f in candidates
            if rel(f(case, ys[k]), ys[k]) <= FITS
        ]

    spec_rule = candidates[0][0]
    assert isinstance(spec_rule, str)  # the spec's rule is said in fixed words
    found = [fits(0), fits(1)]
    for k in (0, 1):
        other = found[1 - k]
        if spec_rule in found[k] and other and spec_rule not in other:
            return f"{labels[1 - k]} departs from the spec's rule: {other[0]}"
    return ""


def _identity(c: Layer, y: np.ndarray) -> np.ndarray:
    """The layer's input unchanged."""
    assert c.x is not None  # candidates run only where the input is known
    return c.x


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


def _seen_rate(c: Layer, y: np.ndarray) -> float:
    """The rate a side's kept values were scaled by (1 / (1 - rate))."""
    assert c.x is not None
    kept = (y != 0) & (c.x != 0)
    return 1.0 - float(np.median(c.x[kept] / y[kept])) if kept.any() else math.nan


def _rate_seen(c: Layer, y: np.ndarray) -> np.ndarray:
    """Dropout at the rate the side's kept values say, masks by id."""
    r = dataclasses.replace(c.r, spec=dataclasses.replace(c.r.spec, rate=_seen_rate(c, y)))
    at = dataclasses.replace(c, r=r)
    return _dropped(at, _mask(at, c.ids, c.step))


def _rate_words(c: Layer, y: np.ndarray) -> str:
    return f"dropout rate {_seen_rate(c, y):.6g} where the spec says {c.r.spec.rate:g}"


def _dropout(case: Layer) -> list[Candidate]:
    if not case.training:
        return [
            ("the identity in inference", _identity),
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
        ("dropout off in training (the identity)", _identity),
        (_rate_words, _rate_seen),
    ]


# ---- batchnorm -------------------------------------------------------------------------------


def _bn_ops(x: np.ndarray) -> batchnorm.Ops:
    """dualtrain.core.batchnorm's arithmetic on NumPy (one replica: nothing to all-reduce)."""
    axes = (0, 2, 3) if x.ndim == 4 else (0,)
    shape = (1, -1, 1, 1) if x.ndim == 4 else (1, -1)
    return batchnorm.Ops(
        channel_sum=lambda t: t.sum(axis=axes),
        count=lambda t: float(t.size // t.shape[1]),
        expand=lambda v: np.reshape(v, shape),
        all_reduce=list,
        sqrt=np.sqrt,
    )


def _normalise(case: Layer, eps: float, stats: str) -> np.ndarray:
    """The layer's output by dualtrain.core.batchnorm (the rule both backends run), with ``eps``
    and the ``stats`` named: the batch's (biased variance), the batch's with the unbiased
    variance, or the running ones."""
    x = case.x
    assert x is not None
    ops = _bn_ops(x)
    names = [n for n, _ in case.r.arrays]  # weight, bias, running_mean, running_var
    w, b, rm, rv = (np.asarray(case.weights[n], np.float64) for n in names)
    if stats == "running":
        mean, var = rm, rv
    else:
        mean, biased, unbiased = batchnorm.batch_stats(ops, x, False)
        var = unbiased if stats == "unbiased" else biased
    return np.asarray(batchnorm.normalize(ops, x, mean, var, w, b, eps))


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


# ---- layernorm, flatten ---------------------------------------------------------------------

#: LayerNormalization's default eps in Keras, nn.LayerNorm's in torch, the 1e-6 many ports use
LAYERNORM_EPS = ((1e-3, "Keras's default"), (1e-5, "torch's default"), (1e-6, "a port's 1e-6"))


def _layer_norm(case: Layer, eps: float) -> np.ndarray:
    x = case.x
    assert x is not None
    w, b = (np.asarray(case.weights[n], np.float64) for n, _ in case.r.params)
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def _layernorm(case: Layer) -> list[Candidate]:
    eps = float(case.r.spec.eps or 1e-5)
    out: list[Candidate] = [(f"eps {eps:g}", lambda c, y: _layer_norm(c, eps))]
    for other, name in LAYERNORM_EPS:
        if not math.isclose(other, eps) and len(case.r.params) == 2:
            out.append((f"eps {other:g} ({name})", _ln_eps(other)))
    return out


def _ln_eps(eps: float) -> Callable[[Layer, np.ndarray], np.ndarray]:
    return lambda c, y: _layer_norm(c, eps)


def _flatten(case: Layer) -> list[Candidate]:
    def chw(c: Layer, y: np.ndarray) -> np.ndarray:
        assert c.x is not None
        return c.x.reshape(len(c.x), -1)

    def hwc(c: Layer, y: np.ndarray) -> np.ndarray:
        assert c.x is not None
        x = c.x if c.x.ndim != 4 else c.x.transpose(0, 2, 3, 1)
        return x.reshape(len(c.x), -1)

    return [
        ("flattened in C,H,W order", chw),
        (
            "flattened in H,W,C order (Keras's channels-last Flatten, without the permute to "
            "torch's order)",
            hwc,
        ),
    ]


def _slope(c: Layer, y: np.ndarray) -> float:
    assert c.x is not None
    neg = c.x < 0
    return float(np.median(y[neg] / c.x[neg])) if neg.any() else 0.0


def _relu(case: Layer) -> list[Candidate]:
    def leaky(c: Layer, y: np.ndarray) -> np.ndarray:
        assert c.x is not None
        return np.where(c.x < 0, _slope(c, y) * c.x, c.x)

    def words(c: Layer, y: np.ndarray) -> str:
        return f"a leaky relu, slope {_slope(c, y):.6g} below zero (LeakyReLU)"

    return [("max(x, 0)", lambda c, y: np.maximum(_identity(c, y), 0.0)), (words, leaky)]


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

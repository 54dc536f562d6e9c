"""The mechanisms of a layer's or a loss's first difference (dualtrain.parity.layer_mechanisms) on
synthetic outputs: each names the side and the variant where the variant reproduces that side's
output and the other side follows the spec's rule, and names nothing where no candidate
reproduces it (a mistake not on the list, or both sides off the rule)."""

import dataclasses
import math

import numpy as np
import pytest

from dualtrain.core import dropout, losses
from dualtrain.core.model import resolve
from dualtrain.parity.layer_mechanisms import Layer, layer_mechanism
from dualtrain.parity.loss_mechanisms import loss_mechanism
from dualtrain.spec import Approximate, LayerSpec, LayerType, Loss, ModelSpec
from dualtrain.spec.load import from_dict
from testkit.synth import base_spec

LABELS = ("torch", "tf")
RNG = np.random.default_rng(7)


def _layer(layers: list[dict], index: int):
    spec = from_dict(
        base_spec(
            model={"preset": None, "inputs": [{"name": "x", "shape": [12]}], "layers": layers}
        )
    )
    return spec, resolve(spec.model)[index]


def _dropout_case(training: bool = True) -> Layer:
    spec, r = _layer([{"type": "dropout", "rate": 0.3}, {"type": "dense", "units": 3}], 0)
    x = RNG.normal(size=(6, 12))
    return Layer(r, spec.seed, 4, np.array([41, 7, 300, 12, 5, 99]), x, {}, training)


def _masked(case: Layer, ids: np.ndarray) -> np.ndarray:
    keep = dropout.keep(
        dropout.NUMPY,
        case.seed,
        np.int64(case.step),
        ids,
        case.r.uid,
        dropout.canonical_elements(case.r.in_shape),
        0.3,
    ).reshape(case.x.shape)
    return np.where(keep, case.x / 0.7, 0.0)


def test_dropout_masks_by_position_are_named_on_their_side():
    case = _dropout_case()
    faithful, by_position = _masked(case, case.ids), _masked(case, np.arange(6))
    said = layer_mechanism(LABELS, case, faithful, by_position)
    assert said.startswith("tf departs from the spec's rule: masks drawn by the sample's position")
    said = layer_mechanism(LABELS, case, by_position, faithful)
    assert said.startswith("torch departs from the spec's rule: masks drawn by")


def test_a_dropout_mask_from_elsewhere_is_not_named():
    case = _dropout_case()
    other = _masked(case, case.ids + 1)  # a mask no candidate draws
    assert layer_mechanism(LABELS, case, _masked(case, case.ids), other) == ""


def test_dropout_left_on_in_inference_is_named():
    case = _dropout_case(training=False)
    on = _masked(case, np.zeros(6, np.int64))
    said = layer_mechanism(LABELS, case, case.x, on)
    assert said.startswith("tf departs from the spec's rule: dropout left on in inference")
    # both sides dropping in inference: no side follows the rule, nothing is named
    assert layer_mechanism(LABELS, case, on, _masked(case, case.ids)) == ""


def _bn_case(eps: float, training: bool = True) -> tuple[Layer, np.ndarray]:
    spec, r = _layer(
        [
            {"type": "dense", "units": 12},
            {"type": "batchnorm", "eps": eps},
            {"type": "dense", "units": 3},
        ],
        1,
    )
    x = RNG.normal(2.0, 3.0, size=(8, 12))
    w = {
        "1.weight": RNG.uniform(0.5, 2, 12),
        "1.bias": RNG.normal(size=12),
        "1.running_mean": RNG.normal(size=12),
        "1.running_var": RNG.uniform(0.5, 2, 12),
    }
    return Layer(r, spec.seed, 1, np.arange(8), x, w, training), x


def _bn(x, w, eps, stats="batch"):
    if stats == "running":
        mean, var = w["1.running_mean"], w["1.running_var"]
    else:
        mean, var = x.mean(0), x.var(0, ddof=1 if stats == "unbiased" else 0)
    return (x - mean) / np.sqrt(var + eps) * w["1.weight"] + w["1.bias"]


@pytest.mark.parametrize("training", [True, False])
def test_batchnorm_eps_of_keras_is_named(training):
    case, x = _bn_case(1e-5, training)
    stats = "batch" if training else "running"
    said = layer_mechanism(
        LABELS, case, _bn(x, case.weights, 1e-5, stats), _bn(x, case.weights, 1e-3, stats)
    )
    assert said == "tf departs from the spec's rule: eps 0.001 (Keras's default)"


def test_batchnorm_unbiased_normalisation_is_named_and_another_eps_is_not():
    case, x = _bn_case(1e-5)
    faithful = _bn(x, case.weights, 1e-5)
    said = layer_mechanism(LABELS, case, faithful, _bn(x, case.weights, 1e-5, "unbiased"))
    assert "normalised by the unbiased batch variance" in said
    assert layer_mechanism(LABELS, case, faithful, _bn(x, case.weights, 2e-3)) == ""


def test_gelu_forms_are_told_apart():
    spec, r = _layer([{"type": "gelu"}, {"type": "dense", "units": 3}], 0)
    assert r.spec.approximate is Approximate.NONE
    x = RNG.normal(size=(5, 12))
    erf = 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    tanh = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    case = Layer(r, spec.seed, 1, np.arange(5), x, {}, True)
    assert "gelu's tanh approximation" in layer_mechanism(LABELS, case, erf, tanh)
    assert layer_mechanism(LABELS, case, erf, tanh * (1 + 1e-6)) == ""


def test_label_smoothing_is_fitted_and_checked_on_every_sample():
    out = RNG.normal(size=(9, 4))
    y = RNG.integers(0, 4, 9)
    ce = losses.reference(Loss.CROSS_ENTROPY, out, y)[0]
    m = out.max(1, keepdims=True)
    lse = np.log(np.exp(out - m).sum(1)) + m[:, 0]
    smoothed = 0.9 * ce + 0.1 * (lse[:, None] - out).mean(1)
    said = loss_mechanism(LABELS, Loss.CROSS_ENTROPY, out, y, (ce, smoothed))
    assert said.startswith("tf departs from the spec's rule: label smoothing 0.1")
    noisy = smoothed + RNG.normal(scale=1e-3, size=9)  # not one smoothing for every sample
    assert loss_mechanism(LABELS, Loss.CROSS_ENTROPY, out, y, (ce, noisy)) == ""


def test_a_scaled_loss_is_named_with_its_factor():
    out, t = RNG.normal(size=(7, 2)), RNG.normal(size=(7, 2))
    mse = losses.reference(Loss.MSE, out, t)[0]
    said = loss_mechanism(LABELS, Loss.MSE, out, t, (mse * 0.5, mse))
    assert said == (
        "torch departs from the spec's rule: its loss is the spec's x 0.5 (the 1/2 (o - t)^2 "
        "convention)"
    )


def test_layer_types_without_candidates_name_nothing():
    spec, r = _layer([{"type": "dense", "units": 3}], 0)
    case = Layer(r, spec.seed, 1, np.arange(2), RNG.normal(size=(2, 12)), {}, True)
    assert layer_mechanism(LABELS, case, np.ones((2, 3)), np.zeros((2, 3))) == ""
    assert LayerType.DENSE is r.spec.type and isinstance(spec.model, ModelSpec)
    assert isinstance(r.spec, LayerSpec)


def test_layernorm_eps_of_keras_is_named():
    spec, r = _layer(
        [{"type": "dense", "units": 12}, {"type": "layernorm"}, {"type": "dense", "units": 3}], 1
    )
    x = RNG.normal(size=(4, 12))
    w = {"1.weight": RNG.uniform(0.5, 2, 12), "1.bias": RNG.normal(size=12)}

    def ln(eps):
        m, v = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - m) / np.sqrt(v + eps) * w["1.weight"] + w["1.bias"]

    case = Layer(r, spec.seed, 1, np.arange(4), x, w, True)
    said = layer_mechanism(LABELS, case, ln(1e-5), ln(1e-3))
    assert said == "tf departs from the spec's rule: eps 0.001 (Keras's default)"
    assert layer_mechanism(LABELS, case, ln(1e-5), ln(3e-4)) == ""


def test_a_channels_last_flatten_is_named():
    spec = from_dict(
        base_spec(
            model={
                "preset": None,
                "inputs": [{"name": "x", "shape": [2, 3, 3]}],
                "layers": [{"type": "flatten"}, {"type": "dense", "units": 3}],
            }
        )
    )
    r = resolve(spec.model)[0]
    x = RNG.normal(size=(4, 2, 3, 3))
    case = Layer(r, spec.seed, 1, np.arange(4), x, {}, True)
    hwc = x.transpose(0, 2, 3, 1).reshape(4, -1)
    said = layer_mechanism(LABELS, case, x.reshape(4, -1), hwc)
    assert said.startswith("tf departs from the spec's rule: flattened in H,W,C order")
    assert layer_mechanism(LABELS, case, x.reshape(4, -1), hwc[:, ::-1]) == ""


def test_another_dropout_rate_is_measured_from_the_kept_values():
    case = _dropout_case()
    r = dataclasses.replace(case.r, spec=dataclasses.replace(case.r.spec, rate=0.31))
    other = dataclasses.replace(case, r=r)
    keep = dropout.keep(
        dropout.NUMPY,
        case.seed,
        np.int64(case.step),
        case.ids,
        case.r.uid,
        dropout.canonical_elements(case.r.in_shape),
        0.31,
    ).reshape(case.x.shape)
    at_031 = np.where(keep, other.x / 0.69, 0.0)
    said = layer_mechanism(LABELS, case, _masked(case, case.ids), at_031)
    assert said == "tf departs from the spec's rule: dropout rate 0.31 where the spec says 0.3"


def test_a_leaky_relu_and_a_float32_layer_are_named():
    spec, r = _layer(
        [{"type": "dense", "units": 12}, {"type": "relu"}, {"type": "dense", "units": 3}], 1
    )
    x = RNG.normal(size=(4, 12))
    case = Layer(r, spec.seed, 1, np.arange(4), x, {}, True)
    relu = np.maximum(x, 0)
    said = layer_mechanism(LABELS, case, relu, np.where(x < 0, 0.2 * x, x))
    assert said == "tf departs from the spec's rule: a leaky relu, slope 0.2 below zero (LeakyReLU)"
    # no candidate for a dense layer, but one side's outputs are float32 values
    spec, r = _layer([{"type": "dense", "units": 3}], 0)
    case = Layer(r, spec.seed, 1, np.arange(4), x, {}, True)
    y = x[:, :3] * 1.1
    narrow = y.astype(np.float32).astype(np.float64)
    assert layer_mechanism(LABELS, case, y, narrow).startswith(
        "tf's outputs are float32 values in a float64 run"
    )
    assert layer_mechanism(LABELS, case, y, y * (1 + 1e-7)) == ""

"""Each loss declared once (dualtrain.core.losses.LOSSES): the declaration covers every loss the
spec names, its sum and metric (written against a kernel namespace) equal its NumPy reference on a
NumPy namespace, and Huber's values are Huber's."""

from __future__ import annotations

import numpy as np
import pytest

from dualtrain.core import losses
from dualtrain.core.losses import HUBER_DELTA, LOSSES, LossOps, ScaleOps, reference
from dualtrain.spec import METRICS, Loss
from testkit.synth import loss_batch


def _ce_sum(out, y):
    m = out.max(axis=1, keepdims=True)
    lse = np.log(np.exp(out - m).sum(axis=1)) + m[:, 0]
    return float((lse - out[np.arange(len(y)), y]).sum())


def _huber(out, t):
    a = np.abs(out - t)
    return np.where(a <= 1.0, 0.5 * a * a, a - 0.5)


NUMPY = LossOps(
    cross_entropy_sum=_ce_sum,
    binary_cross_entropy=lambda x, t: np.maximum(x, 0) - x * t + np.log1p(np.exp(-np.abs(x))),
    squared_difference=lambda a, b: (a - b) ** 2,
    huber=_huber,
    like=lambda y, out: np.asarray(y, out.dtype).reshape(out.shape),
    mean_columns=lambda x: x.mean(axis=1),
    total=np.sum,
    equal=np.equal,
    argmax=lambda out: out.argmax(axis=1),
    count=lambda hit: float(np.sum(hit)),
    fraction=lambda hit, out: hit.astype(out.dtype),
    to_float64=np.float64,
)
SCALE = ScaleOps(
    logsumexp=lambda out: np.log(np.exp(out).sum(axis=1)),
    pick=lambda out, y: out[np.arange(len(y)), y],
    clamp0=lambda x: np.maximum(x, 0),
    log1p=np.log1p,
    exp=np.exp,
    minimum=np.minimum,
    mean_columns=lambda x: x.mean(axis=1),
    total=np.sum,
)


def test_every_loss_the_spec_names_is_declared_with_its_metric():
    assert set(LOSSES) == set(Loss) == set(METRICS)
    for name, d in LOSSES.items():
        assert d.name is name and d.outputs in ("logits", "values"), name
        assert d.higher_is_better == (METRICS[name] == "accuracy"), name
        assert not d.labels or d.min_width >= 2, name  # one logit per class, two classes at least


@pytest.mark.parametrize("loss", list(Loss))
def test_the_declared_sum_and_metric_are_the_reference(loss):
    out, y = loss_batch(loss, 0, 16, 3)
    per, metric = reference(loss, out, y)
    assert np.isclose(losses.loss_sum(NUMPY, loss, out, y), per.sum(), rtol=1e-12)
    assert np.isclose(losses.metric_sum(NUMPY, loss, out, y), metric.sum(), rtol=1e-12)
    t = y if LOSSES[loss].labels else y.reshape(out.shape)
    assert losses.scale_sum(SCALE, loss, out, t) >= abs(per).sum()  # the loss's own size at least


def test_huber_is_quadratic_within_delta_and_linear_beyond():
    out = np.array([[0.5, -2.0, 1.0]])
    per, mae = reference(Loss.HUBER, out, np.zeros((1, 3)))
    assert HUBER_DELTA == 1.0
    assert np.allclose(per, [(0.125 + 1.5 + 0.5) / 3]) and np.allclose(mae, [3.5 / 3])


def test_huber_targets_are_values_of_any_range():
    d = LOSSES[Loss.HUBER]
    assert not d.labels and d.target_range is None and d.outputs == "values"

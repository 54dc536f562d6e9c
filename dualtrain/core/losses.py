"""The losses and evaluation metrics, each declared once for both backends (docs/data.md).

Every loss is a per-sample value (the mean over the sample's output columns); a step
differentiates the **sum** of per-sample losses over the replica's samples divided by the global
batch size (docs/architecture.md "One step"), and an evaluation sums per-sample losses and metrics
over every replica's slice.

:data:`LOSSES` holds, per loss, everything that differs between losses: what its targets are (class
labels or values, their range), what the model's outputs are, how few outputs it takes, the sum a
step differentiates and the metric an evaluation sums (written once against :class:`LossOps`, the
framework's own fused kernels: each backend's ops.py supplies them), the loss's absolute scale
(against :class:`ScaleOps`: the probes' yardstick, measured on torch's fp64 run) and the NumPy
statement of the same values (:func:`reference`, which the backends' tests hold them to). The
backends, the data checks, the locators and export read it; none names a loss itself.

- ``cross_entropy``: int labels (N,) in 0..K-1, K logits; metric ``accuracy`` (argmax == label).
- ``binary_cross_entropy``: floats in [0, 1], (N,) or (N, T), T logits; metric ``accuracy``
  ((logit > 0) == (target > 0.5) per column, the mean over columns).
- ``mse``: floats, (N,) or (N, T), T outputs; metric ``mae`` (the mean over columns of
  abs(output - target)); the loss itself is the MSE.
- ``huber``: as mse, the per-element loss Huber's with delta 1 (torch's ``F.huber_loss`` and
  ``F.smooth_l1_loss`` at their defaults, Keras's ``Huber()``): ``d²/2`` where ``|d| <= 1``, else
  ``|d| - 1/2``; metric ``mae``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dualtrain.errors import UserError
from dualtrain.spec import METRICS, Loss

#: Huber's delta (torch's and Keras's default): quadratic within it, linear beyond
HUBER_DELTA = 1.0


@dataclass(frozen=True)
class LossOps:
    """What a loss's sum and metric need from a framework: its own fused kernels (the ones each
    :class:`LossDef` names) and a few reductions, on its tensors."""

    cross_entropy_sum: Callable[[Any, Any], Any]
    """(logits (N, K), int labels (N,)) -> the sum over the samples of the cross-entropy."""
    binary_cross_entropy: Callable[[Any, Any], Any]
    """(logits, targets of the logits' dtype) -> elementwise binary cross-entropy with logits."""
    squared_difference: Callable[[Any, Any], Any]
    """(outputs, targets of their dtype) -> elementwise (output - target)^2."""
    huber: Callable[[Any, Any], Any]
    """(outputs, targets of their dtype) -> elementwise Huber loss, delta :data:`HUBER_DELTA`."""
    like: Callable[[Any, Any], Any]
    """(targets, outputs) -> the targets in the outputs' dtype."""
    mean_columns: Callable[[Any], Any]
    """(N, T) -> (N,): the mean over a sample's columns."""
    total: Callable[[Any], Any]
    """The sum of every element."""
    equal: Callable[[Any, Any], Any]
    argmax: Callable[[Any], Any]
    """(N, K) -> (N,) the index of each row's largest value, comparable with int labels."""
    count: Callable[[Any], Any]
    """booleans -> how many are true, as float64."""
    fraction: Callable[[Any, Any], Any]
    """(booleans, outputs) -> 1.0 / 0.0 in the outputs' dtype."""
    to_float64: Callable[[Any], Any]


@dataclass(frozen=True)
class ScaleOps:
    """What a loss's absolute scale needs besides arithmetic and ``abs`` (torch's, on the fp64
    reference run: backends/torch/condition.py)."""

    logsumexp: Callable[[Any], Any]
    """(N, K) -> (N,)."""
    pick: Callable[[Any, Any], Any]
    """(logits (N, K), labels (N,)) -> (N,): each row's logit of its label."""
    clamp0: Callable[[Any], Any]
    """max(x, 0) elementwise."""
    log1p: Callable[[Any], Any]
    exp: Callable[[Any], Any]
    minimum: Callable[[Any, float], Any]
    """min(x, c) elementwise."""
    mean_columns: Callable[[Any], Any]
    total: Callable[[Any], Any]


Reference = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class LossDef:
    name: Loss
    higher_is_better: bool
    """Of its metric (dualtrain.spec.METRICS names it)."""
    torch: str
    """The torch kernel (reduction="none", then mean over columns)."""
    tf: str
    """The TensorFlow kernel."""
    labels: bool
    """Its targets are int class labels (N,), one logit per class; else float targets, (N,) or
    (N, T), one output per target column."""
    outputs: str
    """What the model's outputs are: ``logits`` or ``values`` (an export says it)."""
    loss_sum: Callable[[LossOps, Any, Any], Any]
    """(ops, outputs, targets) -> the sum over the samples of the per-sample loss, in the
    outputs' dtype."""
    metric_sum: Callable[[LossOps, Any, Any], Any]
    """(ops, outputs, targets) -> the metric summed over the samples, float64."""
    scale_sum: Callable[[ScaleOps, Any, Any], Any]
    """(ops, outputs, targets) -> the loss's absolute scale summed over the samples: per sample the
    magnitudes of the terms the loss subtracts, so that rounding the outputs by u relative moves
    the loss by about u times this."""
    reference: Reference
    """(outputs, targets) -> (per-sample loss, per-sample metric) in float64 NumPy."""
    target_range: tuple[float, float] | None = None
    """The values float targets must lie in (None: any finite value)."""
    min_width: int = 1

    def check_width(self, width: int) -> None:
        if width < self.min_width:
            raise UserError(
                f"model.loss {self.name.value} needs at least {self.min_width} outputs. Received: "
                f"{width}"
            )


# ---- the column losses share their reductions and metrics ---------------------------------------


def _columns(kernel: Callable[[LossOps], Callable[[Any, Any], Any]]) -> Callable[..., Any]:
    """The sum over the samples of the mean over columns of an elementwise kernel."""

    def loss_sum(ops: LossOps, out: Any, y: Any) -> Any:
        return ops.total(ops.mean_columns(kernel(ops)(out, ops.like(y, out))))

    return loss_sum


def _mae_sum(ops: LossOps, out: Any, y: Any) -> Any:
    return ops.to_float64(ops.total(ops.mean_columns(abs(out - y))))


def _per_column(per: np.ndarray, metric: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return per.mean(axis=1), metric.mean(axis=1)


# ---- each loss ----------------------------------------------------------------------------------


def _ce_reference(out: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    m = out.max(axis=1, keepdims=True)
    lse = np.log(np.exp(out - m).sum(axis=1)) + m[:, 0]
    return lse - out[np.arange(len(y)), y], (out.argmax(axis=1) == y).astype(np.float64)


def _ce_scale(ops: ScaleOps, out: Any, y: Any) -> Any:
    return ops.total(abs(ops.logsumexp(out)) + abs(ops.pick(out, y)))


def _bce_metric(ops: LossOps, out: Any, y: Any) -> Any:
    hit = ops.fraction(ops.equal(out > 0, y > 0.5), out)
    return ops.to_float64(ops.total(ops.mean_columns(hit)))


def _bce_reference(out: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # max(x, 0) - x t + log(1 + exp(-|x|)): the stable form both kernels use
    per = np.maximum(out, 0) - out * t + np.log1p(np.exp(-np.abs(out)))
    return _per_column(per, ((out > 0) == (t > 0.5)).astype(np.float64))


def _bce_scale(ops: ScaleOps, out: Any, t: Any) -> Any:
    terms = ops.clamp0(out) + abs(out * t) + ops.log1p(ops.exp(-abs(out)))
    return ops.total(ops.mean_columns(terms))


def _mse_reference(out: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return _per_column((out - t) ** 2, np.abs(out - t))


def _mse_scale(ops: ScaleOps, out: Any, t: Any) -> Any:
    d = out - t
    return ops.total(ops.mean_columns(2 * abs(d) * (abs(out) + abs(t)) + d * d))


def _huber_reference(out: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.abs(out - t)
    per = np.where(a <= HUBER_DELTA, 0.5 * a * a, HUBER_DELTA * (a - 0.5 * HUBER_DELTA))
    return _per_column(per, a)


def _huber_scale(ops: ScaleOps, out: Any, t: Any) -> Any:
    # the slope min(|d|, delta) times the rounded magnitudes, plus the loss's own size's bound
    a = abs(out - t)
    slope = ops.minimum(a, HUBER_DELTA)
    return ops.total(ops.mean_columns(slope * (abs(out) + abs(t)) + slope * a))


LOSSES = {
    Loss.CROSS_ENTROPY: LossDef(
        Loss.CROSS_ENTROPY,
        True,
        "torch.nn.functional.cross_entropy",
        "tf.nn.sparse_softmax_cross_entropy_with_logits",
        labels=True,
        outputs="logits",
        loss_sum=lambda ops, out, y: ops.cross_entropy_sum(out, y),
        metric_sum=lambda ops, out, y: ops.count(ops.equal(ops.argmax(out), y)),
        scale_sum=_ce_scale,
        reference=_ce_reference,
        min_width=2,
    ),
    Loss.BINARY_CROSS_ENTROPY: LossDef(
        Loss.BINARY_CROSS_ENTROPY,
        True,
        "torch.nn.functional.binary_cross_entropy_with_logits",
        "tf.nn.sigmoid_cross_entropy_with_logits",
        labels=False,
        outputs="logits",
        loss_sum=_columns(lambda ops: ops.binary_cross_entropy),
        metric_sum=_bce_metric,
        scale_sum=_bce_scale,
        reference=_bce_reference,
        target_range=(0.0, 1.0),
    ),
    Loss.MSE: LossDef(
        Loss.MSE,
        False,
        "torch.nn.functional.mse_loss",
        "tf.math.squared_difference",
        labels=False,
        outputs="values",
        loss_sum=_columns(lambda ops: ops.squared_difference),
        metric_sum=_mae_sum,
        scale_sum=_mse_scale,
        reference=_mse_reference,
    ),
    Loss.HUBER: LossDef(
        Loss.HUBER,
        False,
        "torch.nn.functional.huber_loss",
        "tf.where(|d| <= 1, d²/2, |d| - 1/2)",
        labels=False,
        outputs="values",
        loss_sum=_columns(lambda ops: ops.huber),
        metric_sum=_mae_sum,
        scale_sum=_huber_scale,
        reference=_huber_reference,
    ),
}


def metric_name(loss: Loss) -> str:
    return METRICS[loss]


def loss_sum(ops: LossOps, loss: Loss, out: Any, y: Any) -> Any:
    """The sum over the samples of the per-sample loss (the mean over its output columns), in the
    dtype of ``out``: the quantity a step divides by the global batch size and differentiates."""
    return LOSSES[loss].loss_sum(ops, out, y)


def metric_sum(ops: LossOps, loss: Loss, out: Any, y: Any) -> Any:
    """The evaluation metric summed over the samples, float64: correct predictions (accuracy:
    argmax == label; binary: (logit > 0) == (target > 0.5) per column, the mean over columns) or
    absolute errors (mae: the mean over columns of |output - target|)."""
    return LOSSES[loss].metric_sum(ops, out, y)


def correct(ops: LossOps, loss: Loss, out: Any, y: Any) -> Any:
    """Per sample, whether the prediction is right (argmax == label), for a loss on class labels
    (its metric is accuracy); None for the others. What the convergence check pairs sample by sample
    between a run and its fp64 run (dualtrain.parity.checks.convergence)."""
    return ops.equal(ops.argmax(out), y) if LOSSES[loss].labels else None


def scale_sum(ops: ScaleOps, loss: Loss, out: Any, y: Any) -> Any:
    """The loss's absolute scale summed over the samples (:attr:`LossDef.scale_sum`)."""
    return LOSSES[loss].scale_sum(ops, out, y)


def reference(loss: Loss, out: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(per-sample loss, per-sample metric) in float64, the definition both backends follow."""
    out = np.asarray(out, dtype=np.float64)
    d = LOSSES[loss]
    if d.labels:
        return d.reference(out, np.asarray(y))
    return d.reference(out, np.asarray(y, dtype=np.float64).reshape(out.shape))

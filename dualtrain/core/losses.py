"""The losses and evaluation metrics, defined once for both backends (docs/data.md).

Every loss is a per-sample value (the mean over the sample's output columns); a step
differentiates the **sum** of per-sample losses over the replica's samples divided by the global
batch size (docs/architecture.md "One step"), and an evaluation sums per-sample losses and metrics
over every replica's slice. Each backend computes the per-sample values with its framework's own
fused kernel, named in :class:`LossDef` (torch's and TensorFlow's definitions of these three are the
same formulas); :func:`reference` is the NumPy statement of the same values, which the backends'
tests hold them to.

- ``cross_entropy``: int labels (N,) in 0..K-1, K logits; metric ``accuracy`` (argmax == label).
- ``binary_cross_entropy``: floats in [0, 1], (N,) or (N, T), T logits; metric ``accuracy``
  ((logit > 0) == (target > 0.5) per column, the mean over columns).
- ``mse``: floats, (N,) or (N, T), T outputs; metric ``mae`` (the mean over columns of
  abs(output - target)); the loss itself is the MSE.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dualtrain.errors import UserError
from dualtrain.spec import METRICS, Loss


@dataclass(frozen=True)
class LossDef:
    name: Loss
    higher_is_better: bool
    """Of its metric (dualtrain.spec.METRICS names it)."""
    torch: str
    """The torch kernel (reduction="none", then mean over columns)."""
    tf: str
    """The TensorFlow kernel."""
    min_width: int = 1

    def check_width(self, width: int) -> None:
        if width < self.min_width:
            raise UserError(
                f"model.loss {self.name.value} needs at least {self.min_width} outputs. Received: "
                f"{width}"
            )


LOSSES = {
    Loss.CROSS_ENTROPY: LossDef(
        Loss.CROSS_ENTROPY,
        True,
        "torch.nn.functional.cross_entropy",
        "tf.nn.sparse_softmax_cross_entropy_with_logits",
        min_width=2,
    ),
    Loss.BINARY_CROSS_ENTROPY: LossDef(
        Loss.BINARY_CROSS_ENTROPY,
        True,
        "torch.nn.functional.binary_cross_entropy_with_logits",
        "tf.nn.sigmoid_cross_entropy_with_logits",
    ),
    Loss.MSE: LossDef(
        Loss.MSE, False, "torch.nn.functional.mse_loss", "tf.math.squared_difference"
    ),
}


def metric_name(loss: Loss) -> str:
    return METRICS[loss]


@dataclass(frozen=True)
class LossOps:
    """What :func:`loss_sum` and :func:`metric_sum` need from a framework: its own fused kernels
    (the ones :class:`LossDef` names) and a few reductions, on its tensors."""

    cross_entropy_sum: Callable[[Any, Any], Any]
    """(logits (N, K), int labels (N,)) -> the sum over the samples of the cross-entropy."""
    binary_cross_entropy: Callable[[Any, Any], Any]
    """(logits, targets of the logits' dtype) -> elementwise binary cross-entropy with logits."""
    squared_difference: Callable[[Any, Any], Any]
    """(outputs, targets of their dtype) -> elementwise (output - target)^2."""
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


def loss_sum(ops: LossOps, loss: Loss, out: Any, y: Any) -> Any:
    """The sum over the samples of the per-sample loss (the mean over its output columns), in the
    dtype of ``out``: the quantity a step divides by the global batch size and differentiates."""
    if loss is Loss.CROSS_ENTROPY:
        return ops.cross_entropy_sum(out, y)
    t = ops.like(y, out)
    if loss is Loss.BINARY_CROSS_ENTROPY:
        per = ops.binary_cross_entropy(out, t)
    else:
        per = ops.squared_difference(out, t)
    return ops.total(ops.mean_columns(per))


def metric_sum(ops: LossOps, loss: Loss, out: Any, y: Any) -> Any:
    """The evaluation metric summed over the samples, float64: correct predictions (accuracy:
    argmax == label; binary: (logit > 0) == (target > 0.5) per column, the mean over columns) or
    absolute errors (mae: the mean over columns of |output - target|)."""
    if loss is Loss.CROSS_ENTROPY:
        return ops.count(ops.equal(ops.argmax(out), y))
    if loss is Loss.BINARY_CROSS_ENTROPY:
        hit = ops.fraction(ops.equal(out > 0, y > 0.5), out)
        return ops.to_float64(ops.total(ops.mean_columns(hit)))
    return ops.to_float64(ops.total(ops.mean_columns(abs(out - y))))


def reference(loss: Loss, out: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(per-sample loss, per-sample metric) in float64, the definition both backends follow."""
    out = np.asarray(out, dtype=np.float64)
    if loss is Loss.CROSS_ENTROPY:
        m = out.max(axis=1, keepdims=True)
        lse = np.log(np.exp(out - m).sum(axis=1)) + m[:, 0]
        per = lse - out[np.arange(len(y)), y]
        return per, (out.argmax(axis=1) == y).astype(np.float64)
    t = np.asarray(y, dtype=np.float64).reshape(out.shape)
    if loss is Loss.BINARY_CROSS_ENTROPY:
        # max(x, 0) - x t + log(1 + exp(-|x|)): the stable form both kernels use
        per = np.maximum(out, 0) - out * t + np.log1p(np.exp(-np.abs(out)))
        hit = (out > 0) == (t > 0.5)
        return per.mean(axis=1), hit.mean(axis=1)
    return ((out - t) ** 2).mean(axis=1), np.abs(out - t).mean(axis=1)

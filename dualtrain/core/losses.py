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

from dataclasses import dataclass

import numpy as np

from dualtrain.errors import UserError
from dualtrain.spec import Loss


@dataclass(frozen=True)
class LossDef:
    name: Loss
    metric: str
    """The evaluation metric recorded beside the loss: ``accuracy`` or ``mae``."""
    higher_is_better: bool
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
        "accuracy",
        True,
        "torch.nn.functional.cross_entropy",
        "tf.nn.sparse_softmax_cross_entropy_with_logits",
        min_width=2,
    ),
    Loss.BINARY_CROSS_ENTROPY: LossDef(
        Loss.BINARY_CROSS_ENTROPY,
        "accuracy",
        True,
        "torch.nn.functional.binary_cross_entropy_with_logits",
        "tf.nn.sigmoid_cross_entropy_with_logits",
    ),
    Loss.MSE: LossDef(
        Loss.MSE, "mae", False, "torch.nn.functional.mse_loss", "tf.math.squared_difference"
    ),
}


def metric_name(loss: Loss) -> str:
    return LOSSES[loss].metric


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

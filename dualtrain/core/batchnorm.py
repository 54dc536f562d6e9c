"""BatchNorm defined once: the statistics, the normalisation and the running-statistics update.

Both backends call these functions with a tiny array namespace (:class:`Ops`): a per-channel sum,
a per-channel broadcast, a differentiable SUM all-reduce over the replicas, and a square root;
``+ - * /`` on the backend's tensors do the rest. So torch and TF compute the same formulas in the
same order, and the fp64 reference pair proves it (docs/parity.md §9).

Semantics are torch's ``nn.BatchNorm1d/2d`` (training mode), written out:

* per channel, over the ``n`` values of the batch (samples x H x W): ``mean = sum(x) / n``,
  ``var = sum((x - mean)**2) / n`` (biased: used to normalise), ``var_unbiased = ... / (n - 1)``
  (used for ``running_var``);
* ``y = (x - mean) * (weight / sqrt(var + eps)) + bias``; in evaluation the running statistics
  replace the batch's;
* ``running = (1 - momentum) * running + momentum * batch_statistic``.

``sync: true`` is torch ``SyncBatchNorm``'s math: the sums and the counts are all-reduced, so the
statistics are those of the whole global batch, every replica weighted by its sample count; an empty
replica adds zeros. The all-reduce is differentiable (its gradient is the all-reduce of the
gradient), so every replica gets the exact gradient of the global-batch loss.

``sync: false``: each replica normalises with its own batch's statistics; the running statistics
are replica 0's, given to every replica after each step (what DDP's buffer broadcast before each
forward does), so evaluation on every replica and the saved weights use the same, well defined ones.

All of it runs in the parameter dtype (float32; float64 for fp64): under fp16/bf16 autocast the
input is widened first and the output is cast back (Keras's BatchNormalization does the same).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Ops:
    """The arithmetic a backend supplies (tensors of the stats dtype)."""

    channel_sum: Callable[[Any], Any]
    """x -> per-channel sum over every other axis (a vector of C), accurate to O(log n) units of
    roundoff (a cascade sum, or a wider accumulator): a sequential sum of the n = batch x H x W
    values is O(n) off and the batchnorm backward's cancellation amplifies it (docs/parity.md
    §7)."""
    count: Callable[[Any], Any]
    """x -> number of values per channel on this replica (a scalar tensor of the stats dtype)."""
    expand: Callable[[Any], Any]
    """per-channel vector -> a tensor that broadcasts against x; its gradient is a channel sum, with
    the same accuracy."""
    all_reduce: Callable[[Sequence[Any]], list[Any]]
    """SUM over all replicas, differentiable; only called for sync: true."""
    sqrt: Callable[[Any], Any]


def batch_stats(ops: Ops, x: Any, sync: bool) -> tuple[Any, Any, Any]:
    """(mean, biased variance, unbiased variance) per channel: over this replica's batch, or (sync)
    over the global batch. Two passes (the mean, then the squared deviations from it), the second
    against the final mean, so the variance is as accurate as one replica's would be."""
    s, n = ops.channel_sum(x), ops.count(x)
    if sync:
        s, n = ops.all_reduce([s, n])
    mean = s / n
    d = x - ops.expand(mean)
    q = ops.channel_sum(d * d)
    if sync:
        (q,) = ops.all_reduce([q])
    return mean, q / n, q / (n - 1.0)


def normalize(ops: Ops, x: Any, mean: Any, var: Any, weight: Any, bias: Any, eps: float) -> Any:
    """``(x - mean) * (weight / sqrt(var + eps)) + bias``."""
    scale = weight / ops.sqrt(var + eps)
    return (x - ops.expand(mean)) * ops.expand(scale) + ops.expand(bias)


def update_running(running: Any, batch: Any, momentum: float) -> Any:
    """torch's ``running = (1 - momentum) * running + momentum * batch``."""
    return running * (1.0 - momentum) + batch * momentum

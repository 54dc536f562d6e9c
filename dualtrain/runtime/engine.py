"""The contract each backend implements: :class:`Engine` (the mechanics of one worker: a train
step, distributed evaluation, a gather, the weights and optimizer state) and what a step returns
(:class:`StepOut`). Both engines declare it and the type checker holds them to it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from dualtrain.core.weights import Weights
from dualtrain.runtime.checkpoint import OptimizerState


@dataclass
class StepOut:
    """What one process reports about one training step."""

    loss_sum: float
    """Sum of per-sample losses over this process's samples (before the update)."""
    grad_norm: float
    """Global L2 norm of the all-reduced, unscaled gradient, before clipping."""
    loss_scale: float
    """Loss scale used for this step (1.0 without fp16)."""
    skipped: bool
    """True when the all-reduced gradient was not finite and the update was skipped."""
    fed_ids: list[np.ndarray] = field(default_factory=list)
    """The ids each local replica actually consumed, read back from the replica (for
    shards.jsonl)."""
    grad_amax: float | None = None
    """fp16 only: the largest |element| of the all-reduced, unscaled gradient before clipping (inf
    or nan where it is not finite). Times the loss scale, how close the step came to fp16 overflow:
    compare tells a skip decision taken at the threshold from one that is not."""
    grads: Weights | None = None
    """Only when asked (capture_grads): the all-reduced, unscaled, unclipped gradient, canonical
    layout."""
    abs_grads: Weights | None = None
    """With grads, from an engine that can (torch, float64): the gradient's absolute scale per
    parameter (sum of |input| x |output gradient|, all-reduced; dualtrain.backends.torch.condition),
    which the local checks judge gradient errors against."""
    abs_terms: Weights | None = None
    """With abs_grads: per parameter, the number of terms each gradient element sums (a
    1-vector)."""
    abs_loss: float | None = None
    """With abs_grads: the loss's absolute scale, summed over this process's samples: per sample
    the magnitudes of the terms whose difference is its loss (cross-entropy: |logsumexp z| + |z_y|;
    dualtrain.backends.torch.forward), against which the local checks judge a loss error (a loss
    near zero is a cancellation, whose rounding is relative to its terms, not to itself)."""
    own_loss: float | None = None
    """With grads (a probe replay): the sum over this process's samples of the exact (float64) loss
    of the outputs this step itself produced: the probes' loss-path check holds ``loss_sum`` to it
    (dualtrain.parity.local), whatever the forward's kernels did to the outputs."""
    sensitivity: dict[str, float] | None = None
    """With abs_grads: per kind of product (dualtrain.core.kernels.KINDS), the first-order change of
    the step's loss (the global mean) when every product of that kind is scaled by (1 + e), per
    unit e, summed over the replicas (dualtrain.backends.torch.condition): what a kernel's directed
    rounding error does to the loss."""


@dataclass(frozen=True)
class Evaluation:
    """What an evaluation returns, each summed over every replica's slice of the split (so no
    sample counts twice): the per-sample losses, the per-sample metric (dualtrain.core.losses: the
    correct predictions for accuracy, absolute errors for mae), the samples scored."""

    loss_sum: float
    metric_sum: float
    count: float
    correct: np.ndarray | None = None
    """For a loss on class labels: whether each sample of this process's ranges was predicted
    right (uint8, the ranges' samples in order); None for the other losses."""


class TrainSteps(Protocol):
    def train_step(
        self,
        ids: list[np.ndarray],
        *,
        lr: float,
        global_count: int,
        poison: list[bool],
        capture_grads: bool = False,
        step: int = 0,
        measure_scale: bool = False,
    ) -> StepOut:
        """One step (``step``: the 1-based global step, which dropout masks hash). ``ids``: sample
        ids per local replica. The loss each replica differentiates is
        ``sum(per-sample loss) / global_count``; gradients are SUM-all-reduced. ``poison[i]``: set
        local replica i's gradient to inf before the all-reduce (fault injection).
        ``capture_grads``: return the all-reduced gradient in StepOut.grads (the chief's copy is
        saved). ``measure_scale``: also the gradient's absolute scale in StepOut.abs_grads (the fp64
        reference's probe steps; an engine that cannot measure it leaves it None)."""


class Engine(TrainSteps, Protocol):
    backend: str
    rank: int
    """Process index; 0 is the chief that prints and writes."""
    local_replicas: Sequence[int]
    """Global replica indices this process feeds (torch: [rank]; tf mirrored: all of them)."""

    def tap_layers(self, ids: np.ndarray, step: int) -> dict[str, np.ndarray] | None:
        """debug.dump_layers, before step ``step``'s update: every layer's output on these samples
        (one replica's micro-batch) in training and in inference, by canonical prefix, in torch's
        layouts (``train/{prefix}``, ``eval/{prefix}``, ``{train,eval}/output``), each sample's
        loss (``{train,eval}/loss``), ``ids``, ``y`` and the inputs (``input/{k}``); the model's
        state left as it was. None where the engine cannot (dualtrain.parity.taps reads it)."""

    def evaluate(self, split: str, ranges: list[tuple[int, int]]) -> Evaluation:
        """A split's (test, validation) sums over ALL replicas. ``ranges``: [start, stop) per local
        replica, positions in the split."""

    def gather(self, rows: np.ndarray) -> np.ndarray:
        """All-gather a float64/int64 array from every process: result[process] = that process's
        rows."""

    def weights(self) -> Weights:
        """Current weights in the canonical layout."""

    def versions(self) -> dict[str, str]: ...

    def optimizer_state(self) -> OptimizerState:
        """Optimizer slots (canonical names and layouts), applied-update count, loss-scale state."""

    def load_optimizer_state(self, state: OptimizerState) -> None:
        """The inverse of :meth:`optimizer_state` (a checkpoint of either backend). Slots the state
        does not name start from nothing, as in a fresh optimizer."""

    def ema(self, action: str, decay: float) -> None:
        """train.ema after a step (dualtrain.core.ema.action): ``copy`` the weights into the
        average, or ``update`` it by dualtrain.core.ema.update (the first call copies)."""

    def ema_weights(self) -> Weights:
        """The averaged parameters with the live batchnorm statistics, canonical, as
        :meth:`weights`."""

    def load_ema(self, weights: Weights) -> None:
        """Set the average's parameters from canonical weights (a checkpoint's); the live weights
        stay."""

    def load_weights(self, weights: Weights) -> None:
        """Replace the weights (and batchnorm statistics) by canonical arrays, rounded to the
        engine's parameter dtype (a probe's recorded state)."""


class Forward(Protocol):
    """An engine's forward part: evaluation and the layer taps."""

    def evaluate(self, split: str, ranges: list[tuple[int, int]]) -> Evaluation: ...

    def tap_layers(self, ids: np.ndarray, step: int) -> dict[str, np.ndarray] | None: ...


class BuiltFromParts:
    """An engine whose step, evaluation and layer taps are its parts' (each backend's engine.py
    builds ``steps`` and ``forward`` on its state)."""

    steps: TrainSteps
    forward: Forward

    def train_step(
        self,
        ids: list[np.ndarray],
        *,
        lr: float,
        global_count: int,
        poison: list[bool],
        capture_grads: bool = False,
        step: int = 0,
        measure_scale: bool = False,
    ) -> StepOut:
        return self.steps.train_step(
            ids,
            lr=lr,
            global_count=global_count,
            poison=poison,
            capture_grads=capture_grads,
            step=step,
            measure_scale=measure_scale,
        )

    def evaluate(self, split: str, ranges: list[tuple[int, int]]) -> Evaluation:
        return self.forward.evaluate(split, ranges)

    def tap_layers(self, ids: np.ndarray, step: int) -> dict[str, np.ndarray] | None:
        return self.forward.tap_layers(ids, step)

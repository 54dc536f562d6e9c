"""One training step on the torch backend: its micro-batches (the forward under autocast, the
global-batch loss, the backward: forward.py), whose last backward's DDP hook SUMs the gradients,
then the update (GradScaler's unscale and skip, the norm and clipping, torch.optim's update:
update.py, here or on the parameter server) and batchnorm's running statistics. A mixin of
:class:`~dualtrain.backends.torch.engine.TorchEngine`, which builds the module, the optimizer and
the process group's hooks."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dualtrain.backends.torch.condition import AbsoluteScale
from dualtrain.backends.torch.layers import HashDropout
from dualtrain.core.data.splits import TRAIN
from dualtrain.core.plan import micro_batches
from dualtrain.core.weights import Weights
from dualtrain.runtime.engine import StepOut


def _add(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: a[k] + b[k] for k in a}


class HookState:
    """What the DDP comm hook reads: whether to poison this replica's gradient (fault
    injection)."""

    __slots__ = ("poison",)

    def __init__(self) -> None:
        self.poison = False


def sum_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks annotations as real types
    """SUM all-reduce (no division); fault injection turns this replica's local gradient to inf
    first, so the overflow reaches the other replicas only through the all-reduce."""
    buf = bucket.buffer()
    if state.poison:
        buf.fill_(float("inf"))
    return dist.all_reduce(buf, async_op=True).get_future().then(lambda fut: fut.value()[0])


class TrainStep:
    """The methods of TorchEngine this file holds; the engine's state they use, declared:"""

    accumulate: int
    _broadcast: list[torch.Tensor]
    """Unsync batchnorm's running statistics, rank 0's broadcast after every step."""
    _hook: HookState
    ddp: torch.nn.Module
    """DistributedDataParallel around ``module``, or the module itself where nothing
    all-reduces."""
    device: torch.device
    dropouts: list[HashDropout]
    dtype: torch.dtype
    module: torch.nn.Module
    opt: torch.optim.Optimizer
    server: bool

    if TYPE_CHECKING:  # the engine's own (engine.py) and its other mixins' (forward.py, update.py)

        def batch(
            self, split: str, positions: np.ndarray | slice
        ) -> tuple[list[torch.Tensor], torch.Tensor]: ...

        def _micro_step(
            self,
            ids: np.ndarray,
            step: int,
            global_count: int,
            measure_scale: bool,
            capture: bool = False,
        ) -> tuple[torch.Tensor, float | None, AbsoluteScale | None, float | None]: ...

        def _update(
            self, capture_grads: bool
        ) -> tuple[float, float | None, Weights | None, float, bool]: ...

        def pair_masks(
            self, step: torch.Tensor, ids: torch.Tensor
        ) -> contextlib.AbstractContextManager[object]: ...

        def _through_server(
            self, lr: float, poison: bool, capture_grads: bool
        ) -> tuple[float, float | None, Weights | None, float, bool]: ...

    def _no_sync(self) -> contextlib.AbstractContextManager[None]:
        """DDP's no_sync (an accumulating micro-batch: no all-reduce in its backward)."""
        ddp = self.ddp
        assert isinstance(ddp, DistributedDataParallel)  # only a replica that all-reduces
        return ddp.no_sync()

    def _settle_buckets(self) -> None:
        """One zero-loss forward and backward before the first step, so every step of every run,
        fresh or resumed, runs with DDP's rebuilt bucket layout.

        DDP starts with its gradients in one bucket in model order and, after the first backward,
        rebuilds the buckets in the order gradients became ready, which moves every gradient to
        another offset. At world >= 3 gloo's ring all-reduce adds an element's terms in an order set
        by its offset (and BLAS reductions depend on alignment), so without this a run resumed from
        a checkpoint, whose first step would have the initial layout, parts from the uninterrupted
        run in the last bit. Parameters, optimizer state and batchnorm statistics are untouched."""
        buffers = {k: v.clone() for k, v in self.module.named_buffers()}
        idx = torch.zeros(1, dtype=torch.int64, device=self.device)
        step = torch.zeros((), dtype=torch.int64, device=self.device)
        for m in self.dropouts:
            m.step, m.ids = step, idx
        xs, _ = self.batch(TRAIN, np.zeros(1, dtype=np.int64))
        with self.pair_masks(step, idx):
            logits = self.ddp(*xs)
        (logits.sum() * 0.0).backward()
        self.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for k, v in self.module.named_buffers():
                v.copy_(buffers[k])

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
        idx = torch.tensor(ids[0], dtype=torch.int64)
        for group in self.opt.param_groups:
            group["lr"] = lr
        self._hook.poison = poison[0]
        loss_total = torch.zeros((), dtype=self.dtype, device=self.device)
        abs_loss: float | None = 0.0 if measure_scale else None
        abs_grads: dict[str, np.ndarray] | None = None
        abs_terms: dict[str, np.ndarray] | None = None
        sensitivity: dict[str, np.ndarray] | None = None
        own: float | None = 0.0 if capture_grads else None
        # train.accumulate: K micro-batches (dualtrain.core.plan.micro_batches), each loss over the
        # whole step's global count; DDP all-reduces once, in the last backward (no_sync before)
        micro = micro_batches(ids[0], self.accumulate)
        for j, part in enumerate(micro):
            sync = j == len(micro) - 1 or self.server
            with contextlib.nullcontext() if sync else self._no_sync():
                loss_sum, part_abs, scale_j, own_j = self._micro_step(
                    part, step, global_count, measure_scale, capture=capture_grads
                )
            loss_total = loss_total + loss_sum.detach()
            if own is not None and own_j is not None:
                own += own_j
            if part_abs is not None:  # the fp64 reference's probe steps: sums over micro-batches
                assert abs_loss is not None and scale_j is not None  # measured together
                abs_loss += part_abs
                grads_j, terms_j, sens_j = scale_j
                abs_grads = grads_j if abs_grads is None else _add(abs_grads, grads_j)
                abs_terms = terms_j if abs_terms is None else _add(abs_terms, terms_j)
                sensitivity = sens_j if sensitivity is None else _add(sensitivity, sens_j)
        if self.server:  # distribution.strategy: parameter_server (dualtrain.backends.torch.ps)
            norm, amax, captured, scale, skipped = self._through_server(
                lr, poison[0], capture_grads
            )
        else:
            norm, amax, captured, scale, skipped = self._update(capture_grads)
        self._hook.poison = False
        if self._broadcast:  # unsync BatchNorm: every replica takes replica 0's running statistics
            flat = torch.cat([b.reshape(-1) for b in self._broadcast])
            dist.broadcast(flat, src=0)
            for b, new in zip(
                self._broadcast, flat.split([b.numel() for b in self._broadcast]), strict=True
            ):
                b.copy_(new.view_as(b))
        return StepOut(
            loss_sum=loss_total.item(),
            grad_norm=norm,
            loss_scale=scale,
            skipped=skipped,
            fed_ids=[idx.numpy()],
            grads=captured,
            grad_amax=amax,
            abs_grads=abs_grads,
            abs_terms=abs_terms,
            abs_loss=abs_loss,
            own_loss=own,
            sensitivity=(
                {k: float(v[0]) for k, v in sensitivity.items()}
                if sensitivity is not None
                else None
            ),
        )

"""One training step on the torch backend: its micro-batches (the forward under autocast, the
global-batch loss, the backward: forward.py), whose last backward's DDP hook SUMs the gradients,
then the update (GradScaler's unscale and skip, the norm and clipping, torch.optim's update:
update.py, here or on the parameter server) and batchnorm's running statistics. A part of
:class:`~dualtrain.backends.torch.engine.TorchEngine`, which builds the module, the optimizer and
the process group's hooks into one :class:`TorchState`."""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dualtrain.backends.torch.forward import ForwardPass
from dualtrain.backends.torch.state import TorchState
from dualtrain.backends.torch.update import GradientUpdate
from dualtrain.core.data.splits import TRAIN
from dualtrain.core.plan import micro_batches
from dualtrain.runtime.engine import StepOut


def _add(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: a[k] + b[k] for k in a}


class TrainStep:
    """One training step: the micro-batches (the forward part), the all-reduce in DDP's last
    backward, the update (the update part, here or on the parameter server), batchnorm's running
    statistics."""

    def __init__(self, state: TorchState, forward: ForwardPass, update: GradientUpdate):
        self.state = state
        self.forward = forward
        self.grads = update

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        """DDP's no_sync (an accumulating micro-batch: no all-reduce in its backward)."""
        ddp = self.state.ddp
        assert isinstance(ddp, DistributedDataParallel)  # only a replica that all-reduces
        return ddp.no_sync()

    def settle_buckets(self) -> None:
        """One zero-loss forward and backward before the first step, so every step of every run,
        fresh or resumed, runs with DDP's rebuilt bucket layout.

        DDP starts with its gradients in one bucket in model order and, after the first backward,
        rebuilds the buckets in the order gradients became ready, which moves every gradient to
        another offset. At world >= 3 gloo's ring all-reduce adds an element's terms in an order set
        by its offset (and BLAS reductions depend on alignment), so without this a run resumed from
        a checkpoint, whose first step would have the initial layout, parts from the uninterrupted
        run in the last bit. Parameters, optimizer state and batchnorm statistics are untouched."""
        buffers = {k: v.clone() for k, v in self.state.module.named_buffers()}
        idx = torch.zeros(1, dtype=torch.int64, device=self.state.device)
        step = torch.zeros((), dtype=torch.int64, device=self.state.device)
        for m in self.state.dropouts:
            m.step, m.ids = step, idx
        xs, _ = self.state.batch(TRAIN, np.zeros(1, dtype=np.int64))
        with self.forward.pair_masks(step, idx):
            logits = self.state.ddp(*xs)
        (logits.sum() * 0.0).backward()
        self.state.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for k, v in self.state.module.named_buffers():
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
        for group in self.state.opt.param_groups:
            group["lr"] = lr
        self.state.hook.poison = poison[0]
        loss_total = torch.zeros((), dtype=self.state.dtype, device=self.state.device)
        abs_loss: float | None = 0.0 if measure_scale else None
        abs_grads: dict[str, np.ndarray] | None = None
        abs_terms: dict[str, np.ndarray] | None = None
        sensitivity: dict[str, np.ndarray] | None = None
        own: float | None = 0.0 if capture_grads else None
        # train.accumulate: K micro-batches (dualtrain.core.plan.micro_batches), each loss over the
        # whole step's global count; DDP all-reduces once, in the last backward (no_sync before)
        micro = micro_batches(ids[0], self.state.accumulate)
        for j, part in enumerate(micro):
            sync = j == len(micro) - 1 or self.state.server
            with contextlib.nullcontext() if sync else self.no_sync():
                loss_sum, part_abs, scale_j, own_j = self.forward.micro_step(
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
        if (
            self.state.server
        ):  # distribution.strategy: parameter_server (dualtrain.backends.torch.ps)
            norm, amax, captured, scale, skipped = self.grads.through_server(
                lr, poison[0], capture_grads
            )
        else:
            norm, amax, captured, scale, skipped = self.grads.update(capture_grads)
        self.state.hook.poison = False
        if (
            self.state.broadcast
        ):  # unsync BatchNorm: every replica takes replica 0's running statistics
            flat = torch.cat([b.reshape(-1) for b in self.state.broadcast])
            dist.broadcast(flat, src=0)
            for b, new in zip(
                self.state.broadcast,
                flat.split([b.numel() for b in self.state.broadcast]),
                strict=True,
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

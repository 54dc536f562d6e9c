"""One training step on the torch backend: the forward under autocast, the global-batch loss, the
backward whose DDP hook SUMs the gradients, GradScaler's unscale and skip, the norm and clipping,
torch.optim's update. A mixin of :class:`~dualtrain.backends.torch.engine.TorchEngine`, which
builds the module, the optimizer and the process group's hooks."""

from __future__ import annotations

import contextlib
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dualtrain.backends.torch.condition import AbsoluteGradient
from dualtrain.backends.torch.layers import HashDropout
from dualtrain.backends.torch.ops import LOSS_OPS, NORM_OPS
from dualtrain.core import losses, update_rules
from dualtrain.core.data import TRAIN
from dualtrain.core.plan import micro_batches
from dualtrain.runtime.engine import StepOut
from dualtrain.spec import Loss


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
    applied: int
    autocast: contextlib.AbstractContextManager[Any]
    clip: float | None
    ddp: torch.nn.Module
    """DistributedDataParallel around ``module``, or the module itself where nothing
    all-reduces."""
    device: torch.device
    dropouts: list[HashDropout]
    dtype: torch.dtype
    module: torch.nn.Module
    names: list[str]
    opt: torch.optim.Optimizer
    params: list[torch.nn.Parameter]
    scaler: torch.amp.GradScaler | None
    world: int
    loss: Loss
    server: bool
    rank: int

    def batch(self, split: str, positions: Any) -> tuple[list[torch.Tensor], torch.Tensor]:
        raise NotImplementedError  # TorchEngine's

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
        for m in self.dropouts:
            m.step, m.ids = torch.zeros((), dtype=torch.int64, device=self.device), idx
        xs, _ = self.batch(TRAIN, np.zeros(1, dtype=np.int64))
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
                assert abs_loss is not None
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

    def _update(self, capture_grads: bool) -> tuple[float, float | None, Any, float, bool]:
        """The step after the gradients are summed: GradScaler's unscale and skip, the global norm,
        clipping, torch.optim's update, the loss scale's next value. The same code for an
        all-reduce step (on every replica) and a parameter server's (on the server). Returns (grad
        norm, grad amax (fp16), the gradient by name if asked, the scale used, skipped)."""
        scaler = self.scaler
        if scaler is not None:
            self._unscale()
        # backward() gave every parameter a gradient (DDP: every parameter takes part)
        grads = cast(list[torch.Tensor], [p.grad for p in self.params])
        norm = update_rules.global_norm(NORM_OPS, grads)
        amax = (
            torch.stack(torch._foreach_norm(grads, float("inf"))).max().item()
            if scaler is not None
            else None
        )
        captured = None
        if capture_grads:
            captured = {
                n: g.detach().to("cpu").numpy().copy()
                for n, g in zip(self.names, grads, strict=True)
            }
        if self.clip is not None:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.clip, norm)
        if scaler is not None:
            scale = scaler.get_scale()
            scaler.step(self.opt)
            scaler.update()
            skipped = scaler.get_scale() < scale  # backoff < 1 happens only on a found inf
        else:
            self.opt.step()
            scale, skipped = 1.0, False
        self.applied += not skipped
        self.opt.zero_grad(set_to_none=True)
        return norm.item(), amax, captured, scale, skipped

    def _through_server(
        self, lr: float, poison: bool, capture_grads: bool
    ) -> tuple[float, float | None, Any, float, bool]:
        """A replica of a parameter-server run: its gradient (flattened) to the server, the
        server's parameters and outcome back (dualtrain.backends.torch.ps)."""
        from dualtrain.backends.torch import ps

        flat = torch.cat(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to("cpu")
                for p in self.params
            ]
        )
        if poison:  # fault injection: this replica's gradient only, as in the all-reduce hook
            flat.fill_(float("inf"))
        out = ps.step(self.rank, flat, lr, capture_grads)
        with torch.no_grad():
            offset = 0
            for p in self.params:
                p.copy_(out.params[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        self.opt.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.update(out.next_scale)
        self.applied += not out.skipped
        return out.grad_norm, out.grad_amax, out.grads, out.loss_scale, out.skipped

    @torch.no_grad()
    def server_update(self, total: torch.Tensor, lr: float, capture_grads: bool) -> Any:
        """The parameter server's update from the replicas' summed gradient (flattened)."""
        from dualtrain.backends.torch import ps

        offset = 0
        for p in self.params:
            p.grad = total[offset : offset + p.numel()].view_as(p).to(p.device).clone()
            offset += p.numel()
        for group in self.opt.param_groups:
            group["lr"] = lr
        norm, amax, captured, scale, skipped = self._update(capture_grads)
        return ps.Outcome(
            params=torch.cat([p.detach().reshape(-1).to("cpu") for p in self.params]),
            grad_norm=norm,
            grad_amax=amax,
            loss_scale=scale,
            next_scale=self.scaler.get_scale() if self.scaler is not None else 1.0,
            skipped=skipped,
            grads=captured,
        )

    def _micro_step(
        self,
        ids: np.ndarray,
        step: int,
        global_count: int,
        measure_scale: bool,
        capture: bool = False,
    ) -> tuple[torch.Tensor, float | None, Any, float | None]:
        """One micro-batch's forward under autocast and its backward of sum(loss) / global_count
        (times the loss scale under fp16; gradients accumulate in .grad). Returns the loss sum,
        on the fp64 run's probe steps the loss's and the gradient's absolute scales, and with
        ``capture`` (a probe replay) the exact loss of its own outputs (the same losses in
        float64, which the probes' loss-path check holds the loss sum to)."""
        idx = torch.tensor(ids, dtype=torch.int64)
        if self.dropouts:  # the masks hash (seed, step, sample id, layer, element)
            dev_idx = idx.to(self.device, non_blocking=True) if self.device.type == "cuda" else idx
            step_t = torch.tensor(step, dtype=torch.int64, device=self.device)
            for m in self.dropouts:
                m.step, m.ids = step_t, dev_idx
        xs, y = self.batch(TRAIN, ids)
        # The fp64 reference's probe steps also measure the gradient's scale (the local checks).
        absolute = AbsoluteGradient(self.module) if measure_scale else None
        with self.autocast, absolute or contextlib.nullcontext():
            logits = self.ddp(*xs)
        loss_sum = self._loss_sum(logits, y)
        abs_loss = self._loss_abs(logits, y).item() if measure_scale else None
        own = self._loss_exact(logits, y).item() if capture else None
        loss = loss_sum / global_count
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()
        scale = absolute.result(self.world) if absolute is not None else None
        return loss_sum, abs_loss, scale, own

    def _unscale(self) -> None:
        """fp16: the all-reduced gradients divided by the loss scale (GradScaler.unscale_, which
        also records whether any is not finite)."""
        assert self.scaler is not None  # fp16 only, which has a scaler
        self.scaler.unscale_(self.opt)

    def _loss_sum(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The sum of per-sample losses as dualtrain.core.losses defines them, computed in the
        parameter dtype (float32; float64 for fp64) whatever precision the outputs came out in
        (docs/parity.md §3)."""
        return self._losses(out.to(self.dtype), y)

    @torch.no_grad()
    def _loss_exact(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The same sum in float64 on the same outputs (exact to float64 rounding): what the probes'
        loss-path check holds :meth:`_loss_sum` to (dualtrain.parity.local)."""
        return self._losses(out.detach().to(torch.float64), y)

    def _losses(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, losses.loss_sum(LOSS_OPS, self.loss, out, y))

    @torch.no_grad()
    def _loss_abs(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The loss's absolute scale, summed over the samples (StepOut.abs_loss): per sample the
        magnitudes of the terms the loss subtracts, so that rounding the outputs by u relative
        moves the loss by about u times this. cross-entropy: |logsumexp(z)| + |z_y|; binary
        cross-entropy: max(z, 0) + |z t| + log1p(exp(-|z|)); mse: 2 |o - t| (|o| + |t|) + (o -
        t)^2 (the last two per column, then their mean)."""
        out = out.to(self.dtype)
        if self.loss is Loss.CROSS_ENTROPY:
            z_y = out.gather(1, y[:, None])[:, 0]
            return (torch.logsumexp(out, dim=1).abs() + z_y.abs()).sum()
        if self.loss is Loss.BINARY_CROSS_ENTROPY:
            terms = out.clamp(min=0) + (out * y).abs() + torch.log1p(torch.exp(-out.abs()))
            return terms.mean(dim=1).sum()
        d = out - y
        return (2 * d.abs() * (out.abs() + y.abs()) + d * d).mean(dim=1).sum()

    def _metric_sum(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The evaluation metric summed over these samples (dualtrain.core.losses)."""
        return cast(torch.Tensor, losses.metric_sum(LOSS_OPS, self.loss, out, y))

"""The forward and the sums taken from it on the torch backend: one micro-batch's forward under
autocast and its backward (what the step runs per micro-batch: step.py), the loss and the metric
sums of dualtrain.core.losses (and, for the fp64 reference's probe steps, the loss's absolute
scale), and evaluation (the module in inference, the sums all-reduced). A mixin of
:class:`~dualtrain.backends.torch.engine.TorchEngine`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from dualtrain.backends.torch.condition import AbsoluteGradient, AbsoluteScale
from dualtrain.backends.torch.layers import BatchNorm, HashDropout
from dualtrain.backends.torch.ops import LOSS_OPS, SCALE_OPS
from dualtrain.core import losses
from dualtrain.core.data.splits import TRAIN
from dualtrain.core.model import forward_order, resolve
from dualtrain.core.pair import dropout as pair_dropout
from dualtrain.core.pair.dropout import DropoutEntry
from dualtrain.runtime.engine import Evaluation
from dualtrain.spec import Experiment, Loss


class ForwardPass:
    """The methods of TorchEngine this file holds; the engine's state they use, declared:"""

    _eval_bs: int
    autocast: contextlib.AbstractContextManager[object]
    ddp: torch.nn.Module
    """DistributedDataParallel around ``module``, or the module itself where nothing
    all-reduces."""
    device: torch.device
    dropouts: list[HashDropout]
    dtype: torch.dtype
    loss: Loss
    module: torch.nn.Module
    pair_dropouts: tuple[DropoutEntry, ...]
    """A model pair's dropout calls (model_pair.json), in forward order."""
    scaler: torch.amp.GradScaler | None
    seed: int
    spec: Experiment
    world: int

    if TYPE_CHECKING:  # TorchEngine's own (engine.py)

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
    ) -> tuple[torch.Tensor, float | None, AbsoluteScale | None, float | None]:
        """One micro-batch's forward under autocast and its backward of sum(loss) / global_count
        (times the loss scale under fp16; gradients accumulate in .grad). Returns the loss sum,
        on the fp64 run's probe steps the loss's and the gradient's absolute scales, and with
        ``capture`` (a probe replay) the exact loss of its own outputs (the same losses in
        float64, which the probes' loss-path check holds the loss sum to)."""
        idx = torch.tensor(ids, dtype=torch.int64)
        masks: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
        if self.dropouts or self.pair_dropouts:  # the masks hash (seed, step, id, layer, element)
            dev_idx = idx.to(self.device, non_blocking=True) if self.device.type == "cuda" else idx
            step_t = torch.tensor(step, dtype=torch.int64, device=self.device)
            for m in self.dropouts:
                m.step, m.ids = step_t, dev_idx
            masks = self.pair_masks(step_t, dev_idx)
        xs, y = self.batch(TRAIN, ids)
        # The fp64 reference's probe steps also measure the gradient's scale (the local checks).
        absolute = AbsoluteGradient(self.module) if measure_scale else None
        with self.autocast, absolute or contextlib.nullcontext(), masks:
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

    def pair_masks(
        self, step: torch.Tensor, ids: torch.Tensor
    ) -> contextlib.AbstractContextManager[object]:
        """A training forward of a model pair's module: its dropout calls take the pair's masks
        of ``step`` and these sample ids (dualtrain.core.pair.dropout)."""
        if not self.pair_dropouts:
            return contextlib.nullcontext()
        return pair_dropout.training_forward("torch", self.pair_dropouts, self.seed, step, ids)

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
        """The loss's absolute scale, summed over the samples (StepOut.abs_loss; its formula per
        loss: dualtrain.core.losses)."""
        return cast(torch.Tensor, losses.scale_sum(SCALE_OPS, self.loss, out.to(self.dtype), y))

    def _metric_sum(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The evaluation metric summed over these samples (dualtrain.core.losses)."""
        return cast(torch.Tensor, losses.metric_sum(LOSS_OPS, self.loss, out, y))

    # ---- debug.dump_layers ----------------------------------------------------------------------
    def tap_layers(self, ids: np.ndarray, step: int) -> dict[str, np.ndarray] | None:
        """debug.dump_layers (dualtrain.parity.taps): every layer's output on these samples before
        this step's update, in training (this step's dropout masks, the batch's statistics; the
        running statistics left as they were) and in inference, and each sample's loss. None for
        a model pair, and for synchronised batchnorm across processes (its statistics are the
        whole batch's)."""
        if self.spec.model.is_pair or (
            self.world > 1
            and any(isinstance(m, BatchNorm) and m.sync for m in self.module.modules())
        ):
            return None
        mods = dict(self.module.named_modules())
        prefixes = [r.prefix for r in forward_order(resolve(self.spec.model)) if r.prefix in mods]
        xs, y = self.batch(TRAIN, ids)
        out: dict[str, np.ndarray] = {"ids": np.asarray(ids, np.int64), "y": y.cpu().numpy()}
        out.update({f"input/{k}": x.cpu().numpy() for k, x in enumerate(xs)})

        def forward(tag: str) -> torch.Tensor:
            def hook(prefix: str) -> Callable[[nn.Module, tuple[torch.Tensor], torch.Tensor], None]:
                def record(m: nn.Module, args: tuple[torch.Tensor], result: torch.Tensor) -> None:
                    out[f"{tag}/{prefix}"] = result.detach().cpu().numpy().copy()

                return record

            handles = [mods[p].register_forward_hook(hook(p)) for p in prefixes]
            try:
                with torch.no_grad(), self.autocast:
                    logits = self.module(*xs)
            finally:
                for h in handles:
                    h.remove()
            out[f"{tag}/output"] = logits.cpu().numpy().copy()
            out[f"{tag}/loss"] = np.array(
                [self._loss_sum(logits[i : i + 1], y[i : i + 1]).item() for i in range(len(y))]
            )
            return logits

        kept = {k: b.clone() for k, b in self.module.named_buffers()}
        idx = torch.tensor(ids, dtype=torch.int64, device=self.device)
        for m in self.dropouts:
            m.step, m.ids = torch.tensor(step, dtype=torch.int64, device=self.device), idx
        forward("train")
        with torch.no_grad():  # the training forward moved the running statistics: put them back
            for k, b in self.module.named_buffers():
                b.copy_(kept[k])
        self.module.eval()
        forward("eval")
        self.module.train()
        return out

    # ---- evaluation ------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, split: str, ranges: list[tuple[int, int]]) -> Evaluation:
        self.module.eval()
        acc = torch.zeros(3, dtype=torch.float64, device=self.device)
        right: list[torch.Tensor] = []
        for start, stop in ranges:
            for s in range(start, stop, self._eval_bs):
                e = min(s + self._eval_bs, stop)
                xs, y = self.batch(split, slice(s, e))
                with self.autocast:
                    out = self.module(*xs)
                out = out.to(self.dtype)
                acc[0] += self._loss_sum(out, y).double()
                acc[1] += self._metric_sum(out, y).double()
                acc[2] += e - s
                hit = losses.correct(LOSS_OPS, self.loss, out, y)
                if hit is not None:
                    right.append(hit.to(torch.uint8).cpu())
        self.module.train()
        dist.all_reduce(acc, op=dist.ReduceOp.SUM)
        loss_sum, metric_sum, count = acc.tolist()
        correct = torch.cat(right).numpy() if right else None
        return Evaluation(loss_sum=loss_sum, metric_sum=metric_sum, count=count, correct=correct)

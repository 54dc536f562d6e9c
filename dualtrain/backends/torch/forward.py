"""The forward and the sums taken from it on the torch backend: one micro-batch's forward under
autocast and its backward (what the step runs per micro-batch: step.py), the loss and the metric
sums of dualtrain.core.losses (and, for the fp64 reference's probe steps, the loss's absolute
scale), and evaluation (the module in inference, the sums all-reduced). A part of
:class:`~dualtrain.backends.torch.engine.TorchEngine`, on its :class:`TorchState`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import cast

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from dualtrain.backends.torch.condition import AbsoluteGradient, AbsoluteScale
from dualtrain.backends.torch.layers import BatchNorm
from dualtrain.backends.torch.ops import LOSS_OPS, SCALE_OPS
from dualtrain.backends.torch.state import TorchState
from dualtrain.core import losses
from dualtrain.core.data.splits import TRAIN
from dualtrain.core.model import forward_order, resolve
from dualtrain.core.pair import dropout as pair_dropout
from dualtrain.runtime.engine import Evaluation


class ForwardPass:
    """The forward and what is summed from it: a micro-batch's forward and backward, the losses,
    the layer taps, evaluation."""

    def __init__(self, state: TorchState):
        self.state = state

    def micro_step(
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
        if (
            self.state.dropouts or self.state.pair_dropouts
        ):  # the masks hash (seed, step, id, layer, element)
            dev_idx = (
                idx.to(self.state.device, non_blocking=True)
                if self.state.device.type == "cuda"
                else idx
            )
            step_t = torch.tensor(step, dtype=torch.int64, device=self.state.device)
            for m in self.state.dropouts:
                m.step, m.ids = step_t, dev_idx
            masks = self.pair_masks(step_t, dev_idx)
        xs, y = self.state.batch(TRAIN, ids)
        # The fp64 reference's probe steps also measure the gradient's scale (the local checks).
        absolute = AbsoluteGradient(self.state.module) if measure_scale else None
        with self.state.autocast, absolute or contextlib.nullcontext(), masks:
            logits = self.state.ddp(*xs)
        loss_sum = self.loss_sum(logits, y)
        abs_loss = self.loss_abs(logits, y).item() if measure_scale else None
        own = self.loss_exact(logits, y).item() if capture else None
        loss = loss_sum / global_count
        if self.state.scaler is not None:
            self.state.scaler.scale(loss).backward()
        else:
            loss.backward()
        scale = absolute.result(self.state.world) if absolute is not None else None
        return loss_sum, abs_loss, scale, own

    def pair_masks(
        self, step: torch.Tensor, ids: torch.Tensor
    ) -> contextlib.AbstractContextManager[object]:
        """A training forward of a model pair's module: its dropout calls take the pair's masks
        of ``step`` and these sample ids (dualtrain.core.pair.dropout)."""
        if not self.state.pair_dropouts:
            return contextlib.nullcontext()
        return pair_dropout.training_forward(
            "torch", self.state.pair_dropouts, self.state.seed, step, ids
        )

    def loss_sum(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The sum of per-sample losses as dualtrain.core.losses defines them, computed in the
        parameter dtype (float32; float64 for fp64) whatever precision the outputs came out in
        (docs/parity.md §3)."""
        return self.losses(out.to(self.state.dtype), y)

    @torch.no_grad()
    def loss_exact(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The same sum in float64 on the same outputs (exact to float64 rounding): what the probes'
        loss-path check holds :meth:`loss_sum` to (dualtrain.parity.local)."""
        return self.losses(out.detach().to(torch.float64), y)

    def losses(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, losses.loss_sum(LOSS_OPS, self.state.loss, out, y))

    @torch.no_grad()
    def loss_abs(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The loss's absolute scale, summed over the samples (StepOut.abs_loss; its formula per
        loss: dualtrain.core.losses)."""
        return cast(
            torch.Tensor, losses.scale_sum(SCALE_OPS, self.state.loss, out.to(self.state.dtype), y)
        )

    def metric_sum(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The evaluation metric summed over these samples (dualtrain.core.losses)."""
        return cast(torch.Tensor, losses.metric_sum(LOSS_OPS, self.state.loss, out, y))

    # ---- debug.dump_layers ----------------------------------------------------------------------
    def tap_layers(self, ids: np.ndarray, step: int) -> dict[str, np.ndarray] | None:
        """debug.dump_layers (dualtrain.parity.taps): every layer's output on these samples before
        this step's update, in training (this step's dropout masks, the batch's statistics; the
        running statistics left as they were) and in inference, and each sample's loss. None for
        a model pair, and for synchronised batchnorm across processes (its statistics are the
        whole batch's)."""
        if self.state.spec.model.is_pair or (
            self.state.world > 1
            and any(isinstance(m, BatchNorm) and m.sync for m in self.state.module.modules())
        ):
            return None
        mods = dict(self.state.module.named_modules())
        prefixes = [
            r.prefix for r in forward_order(resolve(self.state.spec.model)) if r.prefix in mods
        ]
        xs, y = self.state.batch(TRAIN, ids)
        out: dict[str, np.ndarray] = {"ids": np.asarray(ids, np.int64), "y": y.cpu().numpy()}
        out.update({f"input/{k}": x.cpu().numpy() for k, x in enumerate(xs)})

        def forward(tag: str) -> torch.Tensor:
            def hook(prefix: str) -> Callable[[nn.Module, tuple[torch.Tensor], torch.Tensor], None]:
                def record(m: nn.Module, args: tuple[torch.Tensor], result: torch.Tensor) -> None:
                    out[f"{tag}/{prefix}"] = result.detach().cpu().numpy().copy()

                return record

            handles = [mods[p].register_forward_hook(hook(p)) for p in prefixes]
            try:
                with torch.no_grad(), self.state.autocast:
                    logits = self.state.module(*xs)
            finally:
                for h in handles:
                    h.remove()
            out[f"{tag}/output"] = logits.cpu().numpy().copy()
            out[f"{tag}/loss"] = np.array(
                [self.loss_sum(logits[i : i + 1], y[i : i + 1]).item() for i in range(len(y))]
            )
            return logits

        kept = {k: b.clone() for k, b in self.state.module.named_buffers()}
        idx = torch.tensor(ids, dtype=torch.int64, device=self.state.device)
        for m in self.state.dropouts:
            m.step, m.ids = torch.tensor(step, dtype=torch.int64, device=self.state.device), idx
        forward("train")
        with torch.no_grad():  # the training forward moved the running statistics: put them back
            for k, b in self.state.module.named_buffers():
                b.copy_(kept[k])
        self.state.module.eval()
        forward("eval")
        self.state.module.train()
        return out

    # ---- evaluation ------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, split: str, ranges: list[tuple[int, int]]) -> Evaluation:
        self.state.module.eval()
        acc = torch.zeros(3, dtype=torch.float64, device=self.state.device)
        right: list[torch.Tensor] = []
        for start, stop in ranges:
            for s in range(start, stop, self.state.eval_batch):
                e = min(s + self.state.eval_batch, stop)
                xs, y = self.state.batch(split, slice(s, e))
                with self.state.autocast:
                    out = self.state.module(*xs)
                out = out.to(self.state.dtype)
                acc[0] += self.loss_sum(out, y).double()
                acc[1] += self.metric_sum(out, y).double()
                acc[2] += e - s
                hit = losses.correct(LOSS_OPS, self.state.loss, out, y)
                if hit is not None:
                    right.append(hit.to(torch.uint8).cpu())
        self.state.module.train()
        dist.all_reduce(acc, op=dist.ReduceOp.SUM)
        loss_sum, metric_sum, count = acc.tolist()
        correct = torch.cat(right).numpy() if right else None
        return Evaluation(loss_sum=loss_sum, metric_sum=metric_sum, count=count, correct=correct)

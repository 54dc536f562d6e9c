"""One training step on the tf backend, as one traced function (``strategy.run`` per replica,
then the update on every device): the forward and the global-batch loss, the SUM all-reduce,
loss scaling, the norm and clipping, the update rules of dualtrain.core.update_rules, the
batchnorm running statistics. A mixin of :class:`~dualtrain.backends.tf.engine.TFEngine`,
which builds the variables and traces this step."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from dualtrain.core import batchnorm, losses, update_rules
from dualtrain.core.data import TRAIN
from dualtrain.core.pair import Layout
from dualtrain.core.plan import micro_batches
from dualtrain.runtime.engine import StepOut
from dualtrain.spec import Experiment, Loss, OptimizerSpec

from .model import (
    Conversion,
    call_model,
)
from .ops import LOSS_OPS
from .optimizer import OptimizerVariables

SUM = tf.distribute.ReduceOp.SUM


class TrainStep:
    """The methods of TFEngine this file holds; the engine's state they use, declared:"""

    accumulate: int
    optimizer: OptimizerVariables
    _dropout: bool
    _guard_empty: bool
    _norms: list[tuple[float, bool]]
    """(momentum, sync) per batchnorm layer, in canonical order."""
    _poisonable: bool
    _step_capture_cf: Any  # a traced tf.function (no stubs)
    _step_cf: Any  # a traced tf.function (no stubs)
    conversion: Conversion
    layout: Layout | None
    applied: tf.Variable
    dtype: tf.DType
    first_replica: int
    fp16: bool
    good_steps: tf.Variable
    host: str
    model: keras.Model
    n_local: int
    ops: update_rules.Ops
    opt: OptimizerSpec
    param_names: list[str]
    params: list[tf.Variable]
    running: list[tf.Variable]
    scale: tf.Variable
    spec: Experiment
    strategy: tf.distribute.Strategy
    loss: Loss

    def feed(self, split: str, positions: np.ndarray | slice) -> list[np.ndarray]:
        raise NotImplementedError  # TFEngine's

    def _local_index(self) -> tf.Tensor:
        rid = tf.distribute.get_replica_context().replica_id_in_sync_group
        return tf.cast(rid, tf.int32) - self.first_replica

    def _forward(
        self,
        x: list[tf.Tensor],
        ids: tf.Tensor | None = None,
        step: tf.Tensor | None = None,
        training: bool = False,
    ) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """(logits, batchnorm statistics); see model.call_model."""
        return call_model(
            self.model, x, dropout=self._dropout, ids=ids, step=step, training=training
        )

    def _running_updates(
        self, ctx: tf.distribute.ReplicaContext, stats: Sequence[Sequence[tf.Tensor]]
    ) -> list[tf.Tensor]:
        """New running statistics (identical on every replica) from each batchnorm layer's batch
        statistics, one update per micro-batch (``stats``: a list per micro-batch): sync layers'
        are already global; unsync layers take replica 0's (DDP's buffer broadcast), sent to every
        replica by an all-reduce of replica 0's values and zeros elsewhere (adding zeros is
        exact). dualtrain.core.batchnorm.update_running does the arithmetic."""
        if self.layout is not None:
            # a model pair's own batchnorm layers updated their statistics in the forward, by
            # their own conventions; every replica then takes replica 0's (DDP's broadcast)
            values = [r.read_value() for r in self.running]
            if ctx.num_replicas_in_sync == 1:
                return values
            first = tf.equal(ctx.replica_id_in_sync_group, 0)
            return list(ctx.all_reduce(SUM, [tf.where(first, v, tf.zeros_like(v)) for v in values]))
        unsync = [
            i for j, (_, sync) in enumerate(self._norms) if not sync for i in (2 * j, 2 * j + 1)
        ]
        values = [r.read_value() for r in self.running]
        for micro in stats:  # each micro-batch's forward moves them once (train.accumulate)
            if unsync and ctx.num_replicas_in_sync > 1:
                first = tf.equal(ctx.replica_id_in_sync_group, 0)
                sent = ctx.all_reduce(
                    SUM, [tf.where(first, micro[k], tf.zeros_like(micro[k])) for k in unsync]
                )
                micro = list(micro)
                for k, v in zip(unsync, sent, strict=True):
                    micro[k] = v
            values = [
                batchnorm.update_running(v, stat, self._norms[k // 2][0])
                for k, (v, stat) in enumerate(zip(values, micro, strict=True))
            ]
        return values

    def _replica_step(
        self,
        ids_flat: tf.Tensor,
        offsets: tf.Tensor,
        poison: tf.Tensor,
        global_count: tf.Tensor,
        step: tf.Tensor,
        batch: list[tf.Tensor],
        capture: bool,
    ) -> tuple[
        list[tf.Tensor],
        tf.Tensor,
        tf.Tensor,
        tf.Tensor,
        tf.Tensor,
        tf.Tensor,
        list[tf.Tensor],
        list[tf.Tensor],
        tf.Tensor,
    ]:
        ctx = tf.distribute.get_replica_context()
        i = self._local_index()
        n = self.n_local
        scale = self.scale.read_value()
        # train.accumulate: K micro-batches (dualtrain.core.plan.micro_batches; the process's
        # ids are laid out micro-batch by micro-batch, replica by replica), each loss over the
        # whole step's global count; the gradients add up here and are all-reduced once
        fed: list[Any] = []
        stats: list[Any] = []
        grads: list[Any] = []
        loss_sum: Any = None
        own = tf.constant(0.0, tf.float64)
        for j in range(self.accumulate):
            with tf.device(self.host):  # this replica's rows of the process's batch
                lo, hi = offsets[j * n + i], offsets[j * n + i + 1]
                ids = ids_flat[lo:hi]
                x = [t[lo:hi] for t in batch[:-1]]
                y = batch[-1][lo:hi]
            loss_j, stats_j, grads_j, own_j = self._micro_step(
                ids, x, y, global_count, step, scale, capture=capture
            )
            fed.append(ids)
            stats.append(stats_j)
            loss_sum = loss_j if loss_sum is None else loss_sum + loss_j
            if own_j is not None:
                own = own + own_j
            grads = [a + b for a, b in zip(grads, grads_j, strict=True)] if j else list(grads_j)
        ids = fed[0] if len(fed) == 1 else tf.concat(fed, 0)
        if self._poisonable:  # fault injection (debug.nonfinite_grad); not in the graph otherwise
            grads = [
                tf.where(poison[i], tf.fill(tf.shape(g), tf.constant(math.inf, g.dtype)), g)
                for g in grads
            ]
        grads = ctx.all_reduce(SUM, grads)
        grads, norm, finite, amax, captured = self._after_reduce(grads, scale, capture=capture)
        running = self._running_updates(ctx, stats) if self.running else []
        return grads, loss_sum, ids, norm, finite, amax, captured, running, own

    def _after_reduce(
        self, grads: list[tf.Tensor], scale: tf.Tensor, *, capture: bool
    ) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor, tf.Tensor, list[tf.Tensor]]:
        """What follows the SUM of the gradients, the same in the mirrored step and on the
        parameter server: fp16's unscale, its finite check and the largest |element| (fp16 skips on
        every replica when the summed gradient is not finite, GradScaler's check; fp32/bf16 never
        skip, as torch without a GradScaler); the global norm (torch.nn.utils.clip_grad_norm_: the
        L2 norm of the per-tensor L2 norms); the captured gradient (``capture``); clipping.
        Returns (clipped gradient, norm, finite, amax, captured)."""
        if self.fp16:
            grads = self._unscale(grads, scale)
            finite = tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(g)) for g in grads]))
            amax = tf.reduce_max(tf.stack([tf.reduce_max(tf.abs(g)) for g in grads]))
        else:
            finite, amax = tf.constant(True), tf.constant(0.0, self.dtype)
        norm = update_rules.global_norm(self.ops, grads)
        captured = list(grads) if capture else []
        grads = update_rules.clip(self.ops, grads, norm, self.opt.clip_grad_norm)
        return grads, norm, finite, amax, captured

    def _micro_step(
        self,
        ids: tf.Tensor,
        x: list[tf.Tensor],
        y: tf.Tensor,
        global_count: tf.Tensor,
        step: tf.Tensor,
        scale: tf.Tensor,
        capture: bool = False,
    ) -> tuple[tf.Tensor, list[tf.Tensor], list[tf.Tensor], tf.Tensor | None]:
        """One micro-batch on this replica: (its loss sum, its batchnorm statistics, the gradient
        of sum(loss) / global_count, times the loss scale under fp16, and with ``capture`` (a
        probe) the exact loss of its own outputs: the same losses in float64, which the probes'
        loss-path check holds the loss sum to; else None)."""

        def forward() -> list[tf.Tensor]:
            logits, stats = self._forward(x, ids, step, True)
            own = [tf.stop_gradient(self._loss_exact(logits, y))] if capture else []
            return [self._loss_sum(logits, y), *own, *(tf.stop_gradient(t) for t in stats)]

        # an empty replica (models without sync batchnorm): no forward at all
        def skipped() -> list[tf.Tensor]:
            return [
                tf.constant(0.0, self.dtype),
                *([tf.constant(0.0, tf.float64)] if capture else []),
                *(tf.zeros(r.shape, r.dtype) for r in self.running if self.layout is None),
            ]

        with tf.GradientTape() as tape:
            # An empty replica contributes zero loss and zero gradient. Dense layers get there by
            # themselves (a 0-row matmul); convolutions are not run on an empty batch (oneDNN's
            # fused conv kernels reject one). The guard is a tf.cond, which costs time in every step
            # (and its gradient), so only models with convolutions have it.
            if self._guard_empty:
                loss_sum, *stats = tf.cond(tf.size(ids) > 0, forward, skipped)
            else:
                loss_sum, *stats = forward()
            own = stats.pop(0) if capture else None
            loss = loss_sum / tf.cast(global_count, self.dtype)
            if self.fp16:
                loss = loss * scale
        grads = tape.gradient(loss, self.params, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return loss_sum, stats, grads, own

    def _loss_sum(self, logits: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        """Sum of per-sample losses (dualtrain.core.losses) in the parameter dtype (float32;
        float64 for fp64), whatever precision the logits came out in (docs/parity.md §3)."""
        return self._losses(tf.cast(logits, self.dtype), y)

    def _loss_exact(self, logits: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        """The same sum in float64 on the same outputs (exact to float64 rounding): what the probes'
        loss-path check holds :meth:`_loss_sum` to (dualtrain.parity.local)."""
        return self._losses(tf.cast(logits, tf.float64), y)

    def _losses(self, out: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        return losses.loss_sum(LOSS_OPS, self.loss, out, y)

    def _metric_sum(self, logits: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        """The evaluation metric summed over these samples (dualtrain.core.losses)."""
        return losses.metric_sum(LOSS_OPS, self.loss, tf.cast(logits, self.dtype), y)

    def _unscale(self, grads: Sequence[tf.Tensor], scale: tf.Tensor) -> list[tf.Tensor]:
        """fp16: the all-reduced gradient divided by the loss scale (GradScaler's unscale_: a
        multiplication by the float32 reciprocal)."""
        inv = tf.constant(1.0, tf.float32) / scale
        return [g * inv for g in grads]

    def _step(
        self,
        ids_flat: tf.Tensor,
        offsets: tf.Tensor,
        poison: tf.Tensor,
        global_count: tf.Tensor,
        lr: tf.Tensor,
        step: tf.Tensor,
        *batch: tf.Tensor,
        capture: bool,
    ) -> dict[str, Any]:
        s = self.strategy
        grads, loss_sum, ids, norm, finite, amax, captured, running, own = s.run(
            self._replica_step,
            args=(ids_flat, offsets, poison, global_count, step, list(batch), capture),
        )
        apply = finite  # always True outside fp16 (_replica_step)
        for k, p in enumerate(self.params):
            s.extended.update(p, self._apply_one, args=(grads[k], apply, lr, k), group=False)
        # BatchNorm running statistics move in the forward, as torch's buffers do: also on a step
        # whose update fp16 skips.
        for r, new in zip(self.running, running, strict=True):
            s.extended.update(r, lambda var, value: var.assign(value), args=(new,), group=False)
        # Stateful ops in a tf.function run in program order (automatic control dependencies), so
        # the counters below advance after every parameter update has read them.
        s.extended.update(self.applied, self._bookkeeping, args=(apply,), group=False)
        return {
            "loss_sum": loss_sum,
            "ids": ids,
            "norm": norm,
            "finite": finite,
            "amax": amax,
            "captured": captured,
            "own_loss": own,
        }

    def _apply_one(
        self, p: tf.Variable, g: tf.Tensor, apply: tf.Tensor, lr: tf.Tensor, k: int
    ) -> tf.Operation:
        """torch.optim's update of parameter k (runs once per device, on that device's copies)."""

        def update() -> list[tf.Operation]:
            slots = {key: held[k] for key, held in self.optimizer.slots.items() if held}
            new_p, new_slots = update_rules.update(
                self.ops, self.opt, p, g, slots, lr=lr, applied=self.applied
            )
            return [
                *(slots[key].assign(value) for key, value in new_slots.items()),
                p.assign(new_p),
            ]

        if not self.fp16:  # only fp16 ever skips; a tf.cond per variable and device costs time
            return tf.group(update())
        return tf.cond(apply, lambda: tf.group(update()), tf.no_op)

    def _bookkeeping(self, applied: tf.Variable, ok: tf.Tensor) -> tf.Operation:
        """Applied-step counter and GradScaler's dynamic loss-scale rule (per device copy)."""
        ops = [applied.assign_add(tf.cast(ok, tf.int64))]
        if self.fp16:
            scale, good = update_rules.loss_scale_update(
                self.ops, self.scale, self.good_steps, ok, self.spec.precision.loss_scale
            )
            ops += [self.scale.assign(scale), self.good_steps.assign(good)]
        return tf.group(ops)

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
        if len(ids) != self.n_local or len(poison) != self.n_local:
            raise ValueError(f"expected ids and poison for {self.n_local} local replicas")
        # micro-batch by micro-batch, replica by replica (train.accumulate; _replica_step)
        micro = [micro_batches(a, self.accumulate) for a in ids]
        pieces = [micro[i][j] for j in range(self.accumulate) for i in range(self.n_local)]
        sizes = [len(a) for a in pieces]
        offsets = np.zeros(len(pieces) + 1, np.int32)
        np.cumsum(sizes, out=offsets[1:])
        flat = (
            np.concatenate(pieces).astype(np.int64, copy=False) if sizes else np.zeros(0, np.int64)
        )
        scale = float(self.scale.numpy()) if self.fp16 else 1.0
        fn = self._step_capture_cf if capture_grads else self._step_cf
        out = fn(
            tf.constant(flat),
            tf.constant(offsets),
            tf.constant(np.asarray(poison, bool)),
            tf.constant(global_count, tf.float32),
            tf.constant(lr, tf.float64),
            tf.constant(step, tf.int64),
            *self.feed(TRAIN, flat),
        )
        local = self.strategy.experimental_local_results
        loss_sum = float(sum(float(t) for t in local(out["loss_sum"])))
        fed = [t.numpy() for t in local(out["ids"])]
        norm = float(local(out["norm"])[0])
        finite = bool(local(out["finite"])[0])
        grads = None
        if capture_grads:
            grads = {
                name: self.conversion.to_canonical(name, local(g)[0].numpy())
                for name, g in zip(self.param_names, out["captured"], strict=True)
            }
        amax = float(local(out["amax"])[0]) if self.fp16 else None
        own = float(sum(float(t) for t in local(out["own_loss"]))) if capture_grads else None
        return StepOut(
            loss_sum=loss_sum,
            grad_norm=norm,
            loss_scale=scale,
            skipped=self.fp16 and not finite,
            fed_ids=fed,
            grads=grads,
            grad_amax=amax,
            own_loss=own,
        )

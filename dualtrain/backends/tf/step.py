"""One training step on the tf backend, as one traced function (``strategy.run`` per replica,
then the update on every device): each replica's micro-batches (their forward, loss and gradient:
forward.py), the SUM all-reduce, what follows it (loss scaling, the norm and clipping: update.py),
the batchnorm running statistics, then the update rules of dualtrain.core.update_rules on every
device (update.py). A part of :class:`~dualtrain.backends.tf.engine.TFEngine`, which builds the
variables into one :class:`TFState`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from dualtrain.core import batchnorm
from dualtrain.core.data.splits import TRAIN
from dualtrain.core.plan import micro_batches
from dualtrain.runtime.engine import StepOut

from .forward import ForwardPass
from .layers import Tensor
from .mapping import canonical
from .state import TFState
from .update import GradientUpdate

SUM = tf.distribute.ReduceOp.SUM


class TrainStep:
    """One training step as one traced function: every replica's micro-batches (the forward
    part), the SUM all-reduce, what follows it and the update on every device (the update
    part), batchnorm's running statistics."""

    def __init__(self, state: TFState, forward: ForwardPass, update: GradientUpdate):
        self.state = state
        self.forward = forward
        self.grads = update

    def trace(self, signature: list[tf.TensorSpec]) -> None:
        """The step with and without gradient capture, traced now (start-up, not training time:
        graph errors also surface before step 1); its concrete function is called directly (less
        Python dispatch per step). The capturing one is traced now too where debug.dump_grads
        will use it."""
        # autograph=False: every tensor-dependent branch here is an explicit tf.cond / tf.where /
        # tf.while_loop, so there is nothing to convert, and skipping autograph's source transform
        # saves ~3 s of start-up per worker (measured with cProfile on the MLP).
        step_fn = tf.function(
            lambda *a: self.graph_step(*a, capture=False),
            input_signature=signature,
            jit_compile=False,
            autograph=False,
        )
        capture_fn = tf.function(
            lambda *a: self.graph_step(*a, capture=True),
            input_signature=signature,
            jit_compile=False,
            autograph=False,
        )
        self.step_fn: Callable[..., dict[str, Any]] = step_fn.get_concrete_function()
        self.capture_fn: Callable[..., dict[str, Any]] = (
            capture_fn.get_concrete_function() if self.state.spec.debug.dump_grads else capture_fn
        )

    def local_index(self) -> tf.Tensor:
        rid = tf.distribute.get_replica_context().replica_id_in_sync_group
        return tf.cast(rid, tf.int32) - self.state.first_replica

    def running_updates(
        self, ctx: tf.distribute.ReplicaContext, stats: Sequence[Sequence[tf.Tensor]]
    ) -> list[tf.Tensor]:
        """New running statistics (identical on every replica) from each batchnorm layer's batch
        statistics, one update per micro-batch (``stats``: a list per micro-batch): sync layers'
        are already global; unsync layers take replica 0's (DDP's buffer broadcast), sent to every
        replica by an all-reduce of replica 0's values and zeros elsewhere (adding zeros is
        exact). dualtrain.core.batchnorm.update_running does the arithmetic."""
        if self.state.layout is not None:
            # a model pair's own batchnorm layers updated their statistics in the forward, by
            # their own conventions; every replica then takes replica 0's (DDP's broadcast)
            values = [r.read_value() for r in self.state.running]
            if ctx.num_replicas_in_sync == 1:
                return values
            first = tf.equal(ctx.replica_id_in_sync_group, 0)
            return list(ctx.all_reduce(SUM, [tf.where(first, v, tf.zeros_like(v)) for v in values]))
        unsync = [
            i
            for j, (_, sync) in enumerate(self.state.norms)
            if not sync
            for i in (2 * j, 2 * j + 1)
        ]
        values = [r.read_value() for r in self.state.running]
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
                batchnorm.update_running(v, stat, self.state.norms[k // 2][0])
                for k, (v, stat) in enumerate(zip(values, micro, strict=True))
            ]
        return values

    def replica_step(
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
        i = self.local_index()
        n = self.state.n_local
        scale = self.state.scale.read_value()
        # train.accumulate: K micro-batches (dualtrain.core.plan.micro_batches; the process's
        # ids are laid out micro-batch by micro-batch, replica by replica), each loss over the
        # whole step's global count; the gradients add up here and are all-reduced once
        fed: list[Tensor] = []
        stats: list[Tensor] = []
        grads: list[Tensor] = []
        loss_sum: Tensor | None = None
        own = tf.constant(0.0, tf.float64)
        for j in range(self.state.accumulate):
            with tf.device(self.state.host):  # this replica's rows of the process's batch
                lo, hi = offsets[j * n + i], offsets[j * n + i + 1]
                ids = ids_flat[lo:hi]
                x = [t[lo:hi] for t in batch[:-1]]
                y = batch[-1][lo:hi]
            loss_j, stats_j, grads_j, own_j = self.forward.micro_step(
                ids, x, y, global_count, step, scale, capture=capture
            )
            fed.append(ids)
            stats.append(stats_j)
            loss_sum = loss_j if loss_sum is None else loss_sum + loss_j
            if own_j is not None:
                own = own + own_j
            grads = [a + b for a, b in zip(grads, grads_j, strict=True)] if j else list(grads_j)
        ids = fed[0] if len(fed) == 1 else tf.concat(fed, 0)
        if (
            self.state.poisonable
        ):  # fault injection (debug.nonfinite_grad); not in the graph otherwise
            grads = [
                tf.where(poison[i], tf.fill(tf.shape(g), tf.constant(math.inf, g.dtype)), g)
                for g in grads
            ]
        grads = ctx.all_reduce(SUM, grads)
        grads, norm, finite, amax, captured = self.grads.after_reduce(grads, scale, capture=capture)
        running = self.running_updates(ctx, stats) if self.state.running else []
        return grads, loss_sum, ids, norm, finite, amax, captured, running, own

    def graph_step(
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
        s = self.state.strategy
        grads, loss_sum, ids, norm, finite, amax, captured, running, own = s.run(
            self.replica_step,
            args=(ids_flat, offsets, poison, global_count, step, list(batch), capture),
        )
        apply = finite  # always True outside fp16 (replica_step)
        for k, p in enumerate(self.state.params):
            s.extended.update(p, self.grads.apply_one, args=(grads[k], apply, lr, k), group=False)
        # BatchNorm running statistics move in the forward, as torch's buffers do: also on a step
        # whose update fp16 skips.
        for r, new in zip(self.state.running, running, strict=True):
            s.extended.update(r, lambda var, value: var.assign(value), args=(new,), group=False)
        # Stateful ops in a tf.function run in program order (automatic control dependencies), so
        # the counters below advance after every parameter update has read them.
        s.extended.update(self.state.applied, self.grads.bookkeeping, args=(apply,), group=False)
        return {
            "loss_sum": loss_sum,
            "ids": ids,
            "norm": norm,
            "finite": finite,
            "amax": amax,
            "captured": captured,
            "own_loss": own,
        }

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
        if len(ids) != self.state.n_local or len(poison) != self.state.n_local:
            raise ValueError(f"expected ids and poison for {self.state.n_local} local replicas")
        # micro-batch by micro-batch, replica by replica (train.accumulate; replica_step)
        micro = [micro_batches(a, self.state.accumulate) for a in ids]
        pieces = [
            micro[i][j] for j in range(self.state.accumulate) for i in range(self.state.n_local)
        ]
        sizes = [len(a) for a in pieces]
        offsets = np.zeros(len(pieces) + 1, np.int32)
        np.cumsum(sizes, out=offsets[1:])
        flat = (
            np.concatenate(pieces).astype(np.int64, copy=False) if sizes else np.zeros(0, np.int64)
        )
        scale = float(self.state.scale.numpy()) if self.state.fp16 else 1.0
        fn = self.capture_fn if capture_grads else self.step_fn
        out = fn(
            tf.constant(flat),
            tf.constant(offsets),
            tf.constant(np.asarray(poison, bool)),
            tf.constant(global_count, tf.float32),
            tf.constant(lr, tf.float64),
            tf.constant(step, tf.int64),
            *self.state.feed(TRAIN, flat),
        )
        local = self.state.strategy.experimental_local_results
        loss_sum = float(sum(float(t) for t in local(out["loss_sum"])))
        fed = [t.numpy() for t in local(out["ids"])]
        norm = float(local(out["norm"])[0])
        finite = bool(local(out["finite"])[0])
        grads = None
        if capture_grads:
            grads = canonical(
                self.state.conversion,
                (
                    (name, local(g)[0].numpy())
                    for name, g in zip(self.state.param_names, out["captured"], strict=True)
                ),
            )
        amax = float(local(out["amax"])[0]) if self.state.fp16 else None
        own = float(sum(float(t) for t in local(out["own_loss"]))) if capture_grads else None
        return StepOut(
            loss_sum=loss_sum,
            grad_norm=norm,
            loss_scale=scale,
            skipped=self.state.fp16 and not finite,
            fed_ids=fed,
            grads=grads,
            grad_amax=amax,
            own_loss=own,
        )

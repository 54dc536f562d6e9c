"""One training step on the tf backend, as one traced function (``strategy.run`` per replica,
then the update on every device): each replica's micro-batches (their forward, loss and gradient:
forward.py), the SUM all-reduce, what follows it (loss scaling, the norm and clipping: update.py),
the batchnorm running statistics, then the update rules of dualtrain.core.update_rules on every
device (update.py). A mixin of :class:`~dualtrain.backends.tf.engine.TFEngine`, which builds the
variables and traces this step."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from dualtrain.core import batchnorm
from dualtrain.core.data.splits import TRAIN
from dualtrain.core.pair.record import Layout
from dualtrain.core.plan import micro_batches
from dualtrain.runtime.engine import StepOut

from .layers import Tensor
from .model import Conversion
from .pair import canonical

SUM = tf.distribute.ReduceOp.SUM


class TrainStep:
    """The methods of TFEngine this file holds; the engine's state they use, declared:"""

    accumulate: int
    _norms: list[tuple[float, bool]]
    """(momentum, sync) per batchnorm layer, in canonical order."""
    _poisonable: bool
    _step_capture_cf: Any  # a traced tf.function (no stubs)
    _step_cf: Any  # a traced tf.function (no stubs)
    conversion: Conversion
    layout: Layout | None
    applied: tf.Variable
    first_replica: int
    fp16: bool
    host: str
    n_local: int
    param_names: list[str]
    params: list[tf.Variable]
    running: list[tf.Variable]
    scale: tf.Variable
    strategy: tf.distribute.Strategy

    if TYPE_CHECKING:  # the engine's own (engine.py) and its other mixins' (forward.py, update.py)

        def feed(self, split: str, positions: np.ndarray | slice) -> list[np.ndarray]: ...

        def _micro_step(
            self,
            ids: tf.Tensor,
            x: list[tf.Tensor],
            y: tf.Tensor,
            global_count: tf.Tensor,
            step: tf.Tensor,
            scale: tf.Tensor,
            capture: bool = False,
        ) -> tuple[tf.Tensor, list[tf.Tensor], list[tf.Tensor], tf.Tensor | None]: ...

        def _after_reduce(
            self, grads: list[tf.Tensor], scale: tf.Tensor, *, capture: bool
        ) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor, tf.Tensor, list[tf.Tensor]]: ...

        def _apply_one(
            self, p: tf.Variable, g: tf.Tensor, apply: tf.Tensor, lr: tf.Tensor, k: int
        ) -> tf.Operation: ...

        def _bookkeeping(self, applied: tf.Variable, ok: tf.Tensor) -> tf.Operation: ...

    def _local_index(self) -> tf.Tensor:
        rid = tf.distribute.get_replica_context().replica_id_in_sync_group
        return tf.cast(rid, tf.int32) - self.first_replica

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
        fed: list[Tensor] = []
        stats: list[Tensor] = []
        grads: list[Tensor] = []
        loss_sum: Tensor | None = None
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
            grads = canonical(
                self.conversion,
                (
                    (name, local(g)[0].numpy())
                    for name, g in zip(self.param_names, out["captured"], strict=True)
                ),
            )
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

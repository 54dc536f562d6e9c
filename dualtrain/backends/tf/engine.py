"""The TF engine: one training step exactly as docs/architecture.md defines it, in a custom
``strategy.run`` loop inside ``tf.function`` (never ``model.fit``).

Per step, every replica:

1. slices its own ids out of the flat id vector the loop hands in
   (``ids_flat[offsets[i]:offsets[i+1]]``, ``i`` = this replica's local index) and gathers those
   rows from the in-memory dataset on the host; no tf.data pipeline and no auto-sharding decide
   anything. The ids it used are returned from inside the replica function (``StepOut.fed_ids``);
2. differentiates ``sum(per-sample CE) / N_global`` (CE in float32, float64 for fp64; times the loss
   scale under fp16);
3. optionally poisons its local gradient with inf (fault injection), then all-reduces with SUM;
4. on the all-reduced gradient (identical on every replica): unscale, finite check (fp16), global
   norm, clipping with torch's ``min(1, max / (norm + 1e-6))``.

Then, in cross-replica context, ``strategy.extended.update`` applies torch.optim's update formulas
(dualtrain.core.update_rules on the TF namespace in .ops, not Keras's optimizers) on every device,
or skips it on every device when the all-reduced fp16 gradient was not finite, and advances the
dynamic loss scale with GradScaler's rule (dualtrain.core.update_rules too, as are the global norm
and clipping).

All step inputs have fixed signatures (ids are a flat ``[None]`` vector plus offsets, lr and
N_global are scalar tensors), so the step is traced once (twice with gradient capture) whatever the
per-replica batch sizes are. That also keeps multi-worker collective keys in lockstep across
processes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

from dualtrain.core import batchnorm, update_rules
from dualtrain.core.data import Mnist, normalize
from dualtrain.core.model import resolve, walk
from dualtrain.core.weights import Weights
from dualtrain.runtime.checkpoint import OptimizerState
from dualtrain.runtime.engine import Engine, Evaluation, StepOut
from dualtrain.spec import Experiment, LayerType, Precision

from .model import (
    build_model,
    call_model,
    export_canonical,
    has_dropout,
    load_canonical,
    to_canonical,
    to_nhwc,
)
from .ops import OPS
from .optimizer import SLOTS, OptimizerVariables
from .precision import policy_name

SUM = tf.distribute.ReduceOp.SUM


class TFEngine(Engine):
    backend = "tf"
    #: the array namespace dualtrain.core.update_rules computes with (a test hook may replace it on
    #: an instance before __init__ traces the step: tools/mutants.py)
    ops: update_rules.Ops = OPS

    def __init__(
        self,
        spec: Experiment,
        strategy: tf.distribute.Strategy,
        data: Mnist,
        init_weights: Weights,
        *,
        rank: int,
        num_processes: int,
        host_device: str,
    ):
        self.spec = spec
        self.strategy = strategy
        self.rank = rank
        self.num_processes = num_processes
        self.n_local = strategy.num_replicas_in_sync // num_processes
        if self.n_local * num_processes != strategy.num_replicas_in_sync:
            raise RuntimeError(
                f"{strategy.num_replicas_in_sync} replicas do not split evenly over "
                f"{num_processes} processes"
            )
        self.first_replica = rank * self.n_local
        self.local_replicas: Sequence[int] = list(
            range(self.first_replica, self.first_replica + self.n_local)
        )
        self.host = host_device
        self.multi_worker = num_processes > 1
        self.fp16 = spec.precision.dtype is Precision.FP16
        # Parameters, optimizer state, loss and gradients: float64 for fp64, else float32.
        self.dtype = tf.as_dtype(spec.precision.dtype.param_dtype)
        self._poisonable = bool(spec.debug.nonfinite_grad)
        layers = list(walk(resolve(spec.model)))
        norms = [r.spec for r in layers if r.spec.type is LayerType.BATCHNORM]
        # (momentum, sync) per batchnorm layer, in canonical order (the model's extra outputs).
        self._norms = [(n.momentum, n.sync) for n in norms]
        # An empty replica must still run a forward with sync batchnorm (its all-reduces), so the
        # empty-batch guard below is left out then (the convolutions see 0 rows; measured fine).
        self._guard_empty = any(r.spec.type is LayerType.CONV2D for r in layers) and not any(
            sync for _, sync in self._norms
        )
        self.opt = spec.optimizer
        ls = spec.precision.loss_scale

        with tf.device(host_device):
            self.train_x = tf.constant(to_nhwc(normalize(data.train_x), self.dtype.name))
            self.train_y = tf.constant(data.train_y.astype(np.int32))
            self.test_x = tf.constant(to_nhwc(normalize(data.test_x), self.dtype.name))
            self.test_y = tf.constant(data.test_y.astype(np.int32))

        with strategy.scope():
            self.model, self.named = build_model(
                spec.model, policy_name(spec.precision.dtype), seed=spec.seed
            )
            self._dropout = has_dropout(spec.model)
            load_canonical(self.named, init_weights)
            # The underlying tf.Variables (MirroredVariables under the strategy): trainable
            # parameters, and batchnorm running statistics (assigned by the step, never trained).
            self.param_names = [n for n, v in self.named if v.trainable]
            self.params = [v.value for _, v in self.named if v.trainable]
            self.running = [v.value for _, v in self.named if not v.trainable]
            # torch.optim's state and GradScaler's, as variables (optimizer.py); the engine's
            # names for them (self.buf, self.m, ...) are the mutants' too (tools/mutants.py).
            self.optimizer = OptimizerVariables(
                self.opt, self.params, fp16=self.fp16, loss_scale=ls
            )
            for key, attr in SLOTS.items():
                setattr(self, attr, self.optimizer.slots[key])
            self.applied = self.optimizer.applied
            self.scale = self.optimizer.scale
            self.good_steps = self.optimizer.good_steps

        eval_chunk = max(1, spec.data.eval_batch_size // strategy.num_replicas_in_sync)
        self._eval_chunk = eval_chunk
        step_sig = [
            tf.TensorSpec([None], tf.int64, name="ids_flat"),
            tf.TensorSpec([self.n_local + 1], tf.int32, name="offsets"),
            tf.TensorSpec([self.n_local], tf.bool, name="poison"),
            tf.TensorSpec([], tf.float32, name="global_count"),
            tf.TensorSpec([], tf.float64, name="lr"),
            tf.TensorSpec([], tf.int64, name="step"),
        ]
        self._step_fn = tf.function(
            lambda *a: self._step(*a, capture=False),
            input_signature=step_sig,
            jit_compile=False,
            autograph=False,
        )
        self._step_capture_fn = tf.function(
            lambda *a: self._step(*a, capture=True),
            input_signature=step_sig,
            jit_compile=False,
            autograph=False,
        )
        # autograph=False: every tensor-dependent branch here is an explicit tf.cond / tf.where /
        # tf.while_loop, so there is nothing to convert, and skipping autograph's source transform
        # saves ~3 s of start-up per worker (measured with cProfile on the MLP).
        # Trace the step now (startup, not training time): also surfaces graph errors before step 1.
        # The concrete function is called directly: less Python dispatch per step.
        self._step_cf = self._step_fn.get_concrete_function()
        # The gradient-capturing variant too, when debug.dump_grads will use it: its tracing must
        # not count as training time either.
        self._step_capture_cf = (
            self._step_capture_fn.get_concrete_function()
            if spec.debug.dump_grads
            else self._step_capture_fn
        )
        self._eval_fn = tf.function(
            self._evaluate,
            input_signature=[tf.TensorSpec([self.n_local, 2], tf.int32)],
            jit_compile=False,
            autograph=False,
        )
        self._gather: dict[tf.DType, object] = {}

    # ---- training --------------------------------------------------------------------------------
    def _local_index(self) -> tf.Tensor:
        rid = tf.distribute.get_replica_context().replica_id_in_sync_group
        return tf.cast(rid, tf.int32) - self.first_replica

    def _forward(self, x, ids=None, step=None, training: bool = False):
        """(logits, batchnorm statistics); see model.call_model."""
        return call_model(
            self.model, x, dropout=self._dropout, ids=ids, step=step, training=training
        )

    def _running_updates(self, ctx, stats):
        """New running statistics (identical on every replica) from each batchnorm layer's batch
        statistics: sync layers' are already global; unsync layers take replica 0's (DDP's buffer
        broadcast), sent to every replica by an all-reduce of replica 0's values and zeros elsewhere
        (adding zeros is exact). dualtrain.core.batchnorm.update_running does the arithmetic."""
        unsync = [
            i for j, (_, sync) in enumerate(self._norms) if not sync for i in (2 * j, 2 * j + 1)
        ]
        if unsync and ctx.num_replicas_in_sync > 1:
            first = tf.equal(ctx.replica_id_in_sync_group, 0)
            sent = ctx.all_reduce(
                SUM, [tf.where(first, stats[k], tf.zeros_like(stats[k])) for k in unsync]
            )
            stats = list(stats)
            for k, v in zip(unsync, sent, strict=True):
                stats[k] = v
        return [
            batchnorm.update_running(r.read_value(), stat, self._norms[k // 2][0])
            for k, (r, stat) in enumerate(zip(self.running, stats, strict=True))
        ]

    def _replica_step(self, ids_flat, offsets, poison, global_count, step, capture: bool):
        ctx = tf.distribute.get_replica_context()
        i = self._local_index()
        with tf.device(self.host):
            ids = ids_flat[offsets[i] : offsets[i + 1]]
            x = tf.gather(self.train_x, ids)
            y = tf.gather(self.train_y, ids)
        scale = self.scale.read_value()

        def forward():
            logits, stats = self._forward(x, ids, step, True)
            return [self._loss_sum(logits, y), *(tf.stop_gradient(t) for t in stats)]

        def skipped():  # an empty replica (models without sync batchnorm): no forward at all
            return [
                tf.constant(0.0, self.dtype),
                *(tf.zeros(r.shape, r.dtype) for r in self.running),
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
            loss = loss_sum / tf.cast(global_count, self.dtype)
            if self.fp16:
                loss = loss * scale
        grads = tape.gradient(loss, self.params, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        if self._poisonable:  # fault injection (debug.nonfinite_grad); not in the graph otherwise
            grads = [
                tf.where(poison[i], tf.fill(tf.shape(g), tf.constant(math.inf, g.dtype)), g)
                for g in grads
            ]
        grads = ctx.all_reduce(SUM, grads)
        if self.fp16:
            grads = self._unscale(grads, scale)
        # fp16 skips on every replica when the all-reduced gradient is not finite (GradScaler's
        # check); fp32/bf16 never skip, as torch without a GradScaler.
        if self.fp16:
            finite = tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(g)) for g in grads]))
            amax = tf.reduce_max(tf.stack([tf.reduce_max(tf.abs(g)) for g in grads]))
        else:
            finite, amax = tf.constant(True), tf.constant(0.0, self.dtype)
        # torch.nn.utils.clip_grad_norm_: the L2 norm of the per-tensor L2 norms.
        norm = update_rules.global_norm(self.ops, grads)
        captured = list(grads) if capture else []
        grads = update_rules.clip(self.ops, grads, norm, self.opt.clip_grad_norm)
        running = self._running_updates(ctx, stats) if self.running else []
        return grads, loss_sum, ids, norm, finite, amax, captured, running

    def _loss_sum(self, logits, y):
        """Sum of per-sample cross-entropy in the parameter dtype (float32; float64 for fp64),
        whatever precision the logits came out in (docs/parity.md §3)."""
        per_sample = tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=y, logits=tf.cast(logits, self.dtype)
        )
        return tf.reduce_sum(per_sample)

    def _unscale(self, grads, scale):
        """fp16: the all-reduced gradient divided by the loss scale (GradScaler's unscale_: a
        multiplication by the float32 reciprocal)."""
        inv = tf.constant(1.0, tf.float32) / scale
        return [g * inv for g in grads]

    def _step(self, ids_flat, offsets, poison, global_count, lr, step, *, capture: bool):
        s = self.strategy
        grads, loss_sum, ids, norm, finite, amax, captured, running = s.run(
            self._replica_step, args=(ids_flat, offsets, poison, global_count, step, capture)
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
        }

    def _apply_one(self, p, g, apply, lr, k: int):
        """torch.optim's update of parameter k (runs once per device, on that device's copies)."""

        def update():
            slots = {
                key: getattr(self, attr)[k] for key, attr in SLOTS.items() if getattr(self, attr)
            }
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

    def _bookkeeping(self, applied, ok):
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
        sizes = [len(a) for a in ids]
        offsets = np.zeros(self.n_local + 1, np.int32)
        np.cumsum(sizes, out=offsets[1:])
        flat = np.concatenate(ids).astype(np.int64, copy=False) if sizes else np.zeros(0, np.int64)
        scale = float(self.scale.numpy()) if self.fp16 else 1.0
        fn = self._step_capture_cf if capture_grads else self._step_cf
        out = fn(
            tf.constant(flat),
            tf.constant(offsets),
            tf.constant(np.asarray(poison, bool)),
            tf.constant(global_count, tf.float32),
            tf.constant(lr, tf.float64),
            tf.constant(step, tf.int64),
        )
        local = self.strategy.experimental_local_results
        loss_sum = float(sum(float(t) for t in local(out["loss_sum"])))
        fed = [t.numpy() for t in local(out["ids"])]
        norm = float(local(out["norm"])[0])
        finite = bool(local(out["finite"])[0])
        grads = None
        if capture_grads:
            grads = {
                name: to_canonical(name, local(g)[0].numpy())
                for name, g in zip(self.param_names, out["captured"], strict=True)
            }
        amax = float(local(out["amax"])[0]) if self.fp16 else None
        return StepOut(
            loss_sum=loss_sum,
            grad_norm=norm,
            loss_scale=scale,
            skipped=self.fp16 and not finite,
            fed_ids=fed,
            grads=grads,
            grad_amax=amax,
        )

    # ---- evaluation ------------------------------------------------------------------------------
    def _evaluate(self, ranges):
        chunk = self._eval_chunk

        def replica(ranges):
            ctx = tf.distribute.get_replica_context()
            i = self._local_index()
            start, stop = ranges[i, 0], ranges[i, 1]
            n_chunks = (stop - start + chunk - 1) // chunk

            def body(j, loss_acc, correct_acc):
                s = start + j * chunk
                e = tf.minimum(s + chunk, stop)
                with tf.device(self.host):
                    x, y = self.test_x[s:e], self.test_y[s:e]
                logits = tf.cast(self._forward(x)[0], self.dtype)
                per = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
                hit = tf.equal(tf.argmax(logits, axis=1, output_type=tf.int32), y)
                return (
                    j + 1,
                    loss_acc + tf.cast(tf.reduce_sum(per), tf.float64),
                    correct_acc + tf.reduce_sum(tf.cast(hit, tf.float64)),
                )

            zero = tf.constant(0.0, tf.float64)
            _, loss_sum, correct = tf.while_loop(
                lambda j, *_: j < n_chunks, body, [tf.constant(0, tf.int32), zero, zero]
            )
            local = tf.stack([loss_sum, correct, tf.cast(stop - start, tf.float64)])
            return ctx.all_reduce(SUM, local)

        out = self.strategy.run(replica, args=(ranges,))
        return self.strategy.experimental_local_results(out)[0]

    def evaluate(self, ranges: list[tuple[int, int]]) -> Evaluation:
        if len(ranges) != self.n_local:
            raise ValueError(f"expected {self.n_local} eval ranges, got {len(ranges)}")
        loss_sum, correct, count = self._eval_fn(np.asarray(ranges, np.int32)).numpy().tolist()
        return Evaluation(loss_sum=loss_sum, correct=correct, count=count)

    # ---- gather, weights -------------------------------------------------------------------------
    def _gather_fn(self, dtype: tf.DType):
        # An all-gather as a SUM all-reduce of a (processes, n) matrix in which each process fills
        # only its own row: adding zeros is exact (int64 and float64 alike).
        if dtype not in self._gather:

            def gather(rows):
                def replica(v):  # identity: place the value on the replica's device
                    return tf.distribute.get_replica_context().all_reduce(SUM, tf.identity(v))

                out = self.strategy.run(replica, args=(rows,))
                return self.strategy.experimental_local_results(out)[0]

            self._gather[dtype] = tf.function(
                gather,
                input_signature=[tf.TensorSpec([self.num_processes, None], dtype)],
                jit_compile=False,
                autograph=False,
            )
        return self._gather[dtype]

    def gather(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows)
        if not self.multi_worker:
            return rows[None]
        dtype = tf.int64 if rows.dtype.kind in "iu" else tf.float64
        mat = np.zeros((self.num_processes, rows.size), dtype.as_numpy_dtype)
        mat[self.rank] = rows.reshape(-1)
        out = self._gather_fn(dtype)(mat).numpy()
        return out.reshape(self.num_processes, *rows.shape).astype(rows.dtype, copy=False)

    def weights(self) -> Weights:
        return export_canonical(self.named)

    def versions(self) -> dict[str, str]:
        return {"tensorflow": tf.__version__, "keras": keras.__version__}

    # ---- checkpoints -----------------------------------------------------------------------------
    def optimizer_state(self) -> OptimizerState:
        return self.optimizer.state(self.param_names)

    def load_weights(self, weights: Weights) -> None:
        load_canonical(self.named, weights)

    def load_optimizer_state(self, state: OptimizerState) -> None:
        self.optimizer.load(state, self.param_names)

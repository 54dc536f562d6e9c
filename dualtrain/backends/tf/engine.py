"""The TF engine: one training step exactly as docs/architecture.md defines it, in a custom
``strategy.run`` loop inside ``tf.function`` (never ``model.fit``).

Per step, every replica:

1. slices its own ids, and their rows, out of the flat id vector and the process's batch the loop
   hands in (``ids_flat[offsets[i]:offsets[i+1]]``, ``i`` = this replica's local index; the rows
   come from dualtrain.core.data, the same float32 values the torch backend gets); no tf.data
   pipeline and no auto-sharding decide anything. The ids it used are returned from inside the
   replica function (``StepOut.fed_ids``);
2. differentiates ``sum(per-sample loss) / N_global`` (the loss in float32, float64 for fp64; times
   the loss scale under fp16);
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

from collections.abc import Sequence
from typing import cast

import keras
import numpy as np
import tensorflow as tf

from dualtrain.backends.tf import pair as pair_tf
from dualtrain.backends.tf.pair import PairConversion, build_keras, named_variables
from dualtrain.backends.tf.step import TrainStep
from dualtrain.core import ema as ema_rule
from dualtrain.core import pair
from dualtrain.core.data.dataset import Data
from dualtrain.core.losses import LOSSES
from dualtrain.core.model import keras_layouts, resolve, walk
from dualtrain.core.ops import Ops
from dualtrain.core.pair.transforms import check_identity
from dualtrain.core.weights import Weights
from dualtrain.runtime.checkpoint import OptimizerState
from dualtrain.runtime.engine import Engine
from dualtrain.spec import Experiment, LayerType, Precision

from .forward import ForwardPass
from .model import (
    Conversion,
    Taps,
    build_model,
    export_canonical,
    has_dropout,
    load_canonical,
    to_nhwc,
)
from .ops import OPS
from .optimizer import OptimizerVariables
from .precision import policy_name
from .update import GradientUpdate

SUM = tf.distribute.ReduceOp.SUM


class TFEngine(TrainStep, ForwardPass, GradientUpdate, Engine):
    backend = "tf"
    #: the array namespace dualtrain.core.update_rules computes with (an instance may carry its
    #: own before __init__ traces the step)
    ops: Ops = OPS

    def __init__(
        self,
        spec: Experiment,
        strategy: tf.distribute.Strategy,
        data: Data,
        init_weights: Weights,
        *,
        rank: int,
        num_processes: int,
        host_device: str,
        layout: pair.Layout | None = None,
    ):
        self.spec = spec
        self.layout = layout
        # canonical <-> Keras layouts of weights, gradients and slots (by name, or the pair's map)
        self.conversion = Conversion.of(spec.model) if layout is None else PairConversion(layout)
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
        layers = [] if layout is not None else list(walk(resolve(spec.model)))
        norms = [r.spec for r in layers if r.spec.type is LayerType.BATCHNORM]
        # (momentum, sync) per batchnorm layer, in canonical order (the model's extra outputs).
        # (LayerSpec fills a batchnorm's momentum and sync)
        self._norms = [(cast(float, n.momentum), cast(bool, n.sync)) for n in norms]
        # An empty replica must still run a forward with sync batchnorm (its all-reduces), so the
        # empty-batch guard below is left out then (the convolutions see 0 rows; measured fine).
        self._guard_empty = (
            any(r.spec.type is LayerType.CONV2D for r in layers) or layout is not None
        ) and not any(sync for _, sync in self._norms)
        self.opt = spec.optimizer
        ls = spec.precision.loss_scale

        self.data = data
        self.loss = spec.model.loss
        self.accumulate = spec.train.accumulate
        self._ema: list[tf.Variable] | None = None  # train.ema's average (ema())

        with strategy.scope():
            self._build(spec, layout)
            self.load_weights(init_weights)
            if layout is not None:
                check_identity(init_weights, self.weights())
            # The underlying tf.Variables (MirroredVariables under the strategy): trainable
            # parameters, and batchnorm running statistics (assigned by the step, never trained).
            self.param_names = [n for n, v in self.named if v.trainable]
            self.params = [v.value for _, v in self.named if v.trainable]
            self.running = [v.value for _, v in self.named if not v.trainable]
            # torch.optim's state and GradScaler's, as variables (optimizer.py)
            self.optimizer = OptimizerVariables(
                self.opt, self.params, fp16=self.fp16, loss_scale=ls, conversion=self.conversion
            )
            self.applied = self.optimizer.applied
            self.scale = self.optimizer.scale
            self.good_steps = self.optimizer.good_steps

        self._trace()

    def _build(self, spec: Experiment, layout: pair.Layout | None) -> None:
        """The model (under the strategy's scope) and its variables in canonical order: the
        user's Keras model by the pair's map, or dualtrain's from the spec, every layer's output
        kept in ``taps`` (tap_layers)."""
        self.taps: Taps = {}
        if layout is not None:
            self.model = build_keras(spec.model, policy_name(spec.precision.dtype))
            self.named = named_variables(self.model, layout)
            self._dropout = False
        else:
            self.model, self.named = build_model(
                spec.model, policy_name(spec.precision.dtype), seed=spec.seed, taps=self.taps
            )
            self._dropout = has_dropout(spec.model)

    def _trace(self) -> None:
        """The traced functions: the step (with and without gradient capture) and evaluation."""
        spec = self.spec
        eval_chunk = max(1, spec.data.eval_batch_size // self.strategy.num_replicas_in_sync)
        self._eval_chunk = eval_chunk
        self._batch_sig = batch_sig = [
            tf.TensorSpec([None, *_keras_shape(i.shape)], self.dtype, name=f"input_{i.name}")
            for i in spec.model.inputs
        ]
        batch_sig.append(
            tf.TensorSpec([None], tf.int32, name="labels")
            if LOSSES[self.loss].labels
            else tf.TensorSpec([None, None], self.dtype, name="targets")
        )
        step_sig = [
            tf.TensorSpec([None], tf.int64, name="ids_flat"),
            tf.TensorSpec([self.accumulate * self.n_local + 1], tf.int32, name="offsets"),
            tf.TensorSpec([self.n_local], tf.bool, name="poison"),
            tf.TensorSpec([], tf.float32, name="global_count"),
            tf.TensorSpec([], tf.float64, name="lr"),
            tf.TensorSpec([], tf.int64, name="step"),
            *batch_sig,
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
            self._evaluate_chunk, input_signature=batch_sig, jit_compile=False, autograph=False
        )
        self._gather: dict[tf.DType, object] = {}

    # ---- batches (the step: step.py, forward.py, update.py; evaluation: forward.py) --------------

    def feed(self, split: str, positions: np.ndarray | slice) -> list[np.ndarray]:
        """A batch as the traced functions take it: the inputs (images NHWC) in the parameter
        dtype, then the targets (int32 labels for cross-entropy)."""
        xs = [
            (to_nhwc(a, self.dtype.name) if a.ndim == 4 else a.astype(self.dtype.name))
            for a in self.data.inputs(split, positions)
        ]
        y = self.data.targets(split, positions)
        return [*xs, y.astype(np.int32 if y.dtype == np.int64 else self.dtype.name)]

    # ---- gather, weights -------------------------------------------------------------------------
    def _gather_fn(self, dtype: tf.DType) -> tf.types.experimental.PolymorphicFunction:
        # An all-gather as a SUM all-reduce of a (processes, n) matrix in which each process fills
        # only its own row: adding zeros is exact (int64 and float64 alike).
        if dtype not in self._gather:

            def gather(rows: tf.Tensor) -> tf.Tensor:
                # identity: place the value on the replica's device
                def replica(v: tf.Tensor) -> tf.Tensor:
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
        if self.layout is not None:
            return pair_tf.export_canonical(self.named, self.layout)
        return export_canonical(self.named, keras_layouts(self.spec.model))

    def versions(self) -> dict[str, str]:
        return {"tensorflow": tf.__version__, "keras": keras.__version__}

    # ---- the average of the weights (train.ema; dualtrain.core.ema) ------------------------------
    def ema(self, action: str, decay: float) -> None:
        if self._ema is None:
            with self.strategy.scope():
                self._ema = [
                    tf.Variable(p.read_value(), trainable=False, name=f"ema_{k}")
                    for k, p in enumerate(self.params)
                ]
            self._ema_fn = tf.function(self._ema_update)
            if action == ema_rule.UPDATE:  # a resumed average is loaded (load_ema), never here
                action = ema_rule.COPY
        if action == ema_rule.COPY:
            for e, p in zip(self._ema, self.params, strict=True):
                e.assign(p.read_value())
            return
        self._ema_fn(tf.constant(decay, tf.float64))

    def _ema_update(self, decay: tf.Tensor) -> None:
        assert self._ema is not None  # set by ema() before its first update
        for e, p in zip(self._ema, self.params, strict=True):
            e.assign(ema_rule.update(self.ops, e.read_value(), p.read_value(), decay))

    def ema_weights(self) -> Weights:
        assert self._ema is not None  # ema() ran before (the loop starts it)
        live = [p.read_value() for p in self.params]
        for p, e in zip(self.params, self._ema, strict=True):
            p.assign(e.read_value())
        try:
            return self.weights()  # the averaged parameters, the live running statistics
        finally:
            for p, w in zip(self.params, live, strict=True):
                p.assign(w)

    def load_ema(self, weights: Weights) -> None:
        live = self.weights()
        self.load_weights(weights)
        self.ema(ema_rule.COPY, 0.0)
        self.load_weights(live)

    # ---- checkpoints -----------------------------------------------------------------------------
    def optimizer_state(self) -> OptimizerState:
        return self.optimizer.state(self.param_names)

    def load_weights(self, weights: Weights) -> None:
        if self.layout is not None:
            pair_tf.load_canonical(self.named, self.layout, weights)
        else:
            load_canonical(self.named, weights, keras_layouts(self.spec.model))

    def load_optimizer_state(self, state: OptimizerState) -> None:
        self.optimizer.load(state, self.param_names)


def _keras_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """One sample's shape as the Keras model takes it: images (C, H, W) as (H, W, C)."""
    return (shape[1], shape[2], shape[0]) if len(shape) == 3 else shape

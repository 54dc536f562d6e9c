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

from dualtrain.backends.tf import mapping as pair_map
from dualtrain.backends.tf.mapping import PairConversion, named_variables
from dualtrain.backends.tf.pair import build_keras
from dualtrain.core import ema as ema_rule
from dualtrain.core import pair
from dualtrain.core.data.dataset import Data
from dualtrain.core.losses import LOSSES
from dualtrain.core.model import keras_layouts, resolve, walk
from dualtrain.core.ops import Ops
from dualtrain.core.pair.transforms import check_identity
from dualtrain.core.weights import Weights
from dualtrain.runtime.checkpoint import OptimizerState
from dualtrain.runtime.engine import BuiltFromParts, Engine, TrainSteps
from dualtrain.spec import Experiment, LayerType, Precision

from .forward import ForwardPass
from .model import (
    Conversion,
    Taps,
    build_model,
    export_canonical,
    has_dropout,
    load_canonical,
)
from .ops import OPS
from .optimizer import OptimizerVariables
from .precision import policy_name
from .state import TFState
from .step import TrainStep
from .update import GradientUpdate

SUM = tf.distribute.ReduceOp.SUM


class TFEngine(BuiltFromParts, Engine):
    """Built from parts on one :class:`TFState`: the forward (forward.py), the update
    (update.py) and the step (step.py); the weights, their average and checkpoints are here."""

    backend = "tf"
    forward: ForwardPass
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
        self.data = data
        self.rank = rank
        n_local = strategy.num_replicas_in_sync // num_processes
        if n_local * num_processes != strategy.num_replicas_in_sync:
            raise RuntimeError(
                f"{strategy.num_replicas_in_sync} replicas do not split evenly over "
                f"{num_processes} processes"
            )
        self.local_replicas: Sequence[int] = list(range(rank * n_local, (rank + 1) * n_local))
        self._ema: list[tf.Variable] | None = None  # train.ema's average (ema())
        with strategy.scope():
            self.state = self._build(spec, strategy, data, layout, rank, num_processes, n_local)
            self.state.multi_worker = num_processes > 1
            self.state.host = host_device
            self.load_weights(init_weights)
            if layout is not None:
                check_identity(init_weights, self.weights())
        self.forward = ForwardPass(self.state)
        self.grads = GradientUpdate(self.state)
        self.steps: TrainSteps = TrainStep(self.state, self.forward, self.grads)
        self._trace()

    def _build(
        self,
        spec: Experiment,
        strategy: tf.distribute.Strategy,
        data: Data,
        layout: pair.Layout | None,
        rank: int,
        num_processes: int,
        n_local: int,
    ) -> TFState:
        """The model (under the strategy's scope) and its variables in canonical order: the
        user's Keras model by the pair's map, or dualtrain's from the spec, every layer's output
        kept in ``taps`` (tap_layers); torch.optim's and GradScaler's state as variables."""
        taps: Taps = {}
        if layout is not None:
            model = build_keras(spec.model, policy_name(spec.precision.dtype), layout.keras.config)
            named = named_variables(model, layout)
        else:
            model, named = build_model(
                spec.model, policy_name(spec.precision.dtype), seed=spec.seed, taps=taps
            )
        layers = [] if layout is not None else list(walk(resolve(spec.model)))
        norms = [r.spec for r in layers if r.spec.type is LayerType.BATCHNORM]
        # (momentum, sync) per batchnorm layer, in canonical order (the model's extra outputs).
        # (LayerSpec fills a batchnorm's momentum and sync)
        norm_rules = [(cast(float, n.momentum), cast(bool, n.sync)) for n in norms]
        # An empty replica must still run a forward with sync batchnorm (its all-reduces), so the
        # empty-batch guard is left out then (the convolutions see 0 rows; measured fine).
        guard_empty = (
            any(r.spec.type is LayerType.CONV2D for r in layers) or layout is not None
        ) and not any(sync for _, sync in norm_rules)
        # canonical <-> Keras layouts of weights, gradients and slots (by name, or the pair's map)
        conversion = Conversion.of(spec.model) if layout is None else PairConversion(layout)
        params = [v.value for _, v in named if v.trainable]
        return TFState(
            spec=spec,
            data=data,
            strategy=strategy,
            layout=layout,
            conversion=conversion,
            rank=rank,
            num_processes=num_processes,
            n_local=n_local,
            first_replica=rank * n_local,
            host="",
            dtype=tf.as_dtype(spec.precision.dtype.param_dtype),
            ops=self.ops,
            model=model,
            named=named,
            taps=taps,
            dropout=layout is None and has_dropout(spec.model),
            norms=norm_rules,
            guard_empty=guard_empty,
            param_names=[n for n, v in named if v.trainable],
            params=params,
            running=[v.value for _, v in named if not v.trainable],
            optimizer=OptimizerVariables(
                spec.optimizer,
                params,
                fp16=spec.precision.dtype is Precision.FP16,
                loss_scale=spec.precision.loss_scale,
                conversion=conversion,
            ),
        )

    def _trace(self) -> None:
        """The traced functions: the step (with and without gradient capture) and evaluation."""
        spec, st = self.spec, self.state
        st.eval_chunk = max(1, spec.data.eval_batch_size // st.strategy.num_replicas_in_sync)
        batch_sig = [
            tf.TensorSpec([None, *_keras_shape(i.shape)], st.dtype, name=f"input_{i.name}")
            for i in spec.model.inputs
        ]
        batch_sig.append(
            tf.TensorSpec([None], tf.int32, name="labels")
            if LOSSES[st.loss].labels
            else tf.TensorSpec([None, None], st.dtype, name="targets")
        )
        assert isinstance(self.steps, TrainStep)  # the mirrored step (ps.py traces its own)
        self.steps.trace(
            [
                tf.TensorSpec([None], tf.int64, name="ids_flat"),
                tf.TensorSpec([st.accumulate * st.n_local + 1], tf.int32, name="offsets"),
                tf.TensorSpec([st.n_local], tf.bool, name="poison"),
                tf.TensorSpec([], tf.float32, name="global_count"),
                tf.TensorSpec([], tf.float64, name="lr"),
                tf.TensorSpec([], tf.int64, name="step"),
                *batch_sig,
            ]
        )
        self.forward.trace_eval(batch_sig)

    # ---- gather (the step, evaluation and the taps: the parts, runtime.engine.BuiltFromParts) --
    def gather(self, rows: np.ndarray) -> np.ndarray:
        return self.state.gather(rows)

    # ---- weights ---------------------------------------------------------------------------------
    def weights(self) -> Weights:
        if self.state.layout is not None:
            return pair_map.export_canonical(self.state.named, self.state.layout)
        return export_canonical(self.state.named, keras_layouts(self.spec.model))

    def versions(self) -> dict[str, str]:
        return {"tensorflow": tf.__version__, "keras": keras.__version__}

    # ---- the average of the weights (train.ema; dualtrain.core.ema) ------------------------------
    def ema(self, action: str, decay: float) -> None:
        if self._ema is None:
            with self.state.strategy.scope():
                self._ema = [
                    tf.Variable(p.read_value(), trainable=False, name=f"ema_{k}")
                    for k, p in enumerate(self.state.params)
                ]
            self._ema_fn = tf.function(self._ema_update)
            if action == ema_rule.UPDATE:  # a resumed average is loaded (load_ema), never here
                action = ema_rule.COPY
        if action == ema_rule.COPY:
            for e, p in zip(self._ema, self.state.params, strict=True):
                e.assign(p.read_value())
            return
        self._ema_fn(tf.constant(decay, tf.float64))

    def _ema_update(self, decay: tf.Tensor) -> None:
        assert self._ema is not None  # set by ema() before its first update
        for e, p in zip(self._ema, self.state.params, strict=True):
            e.assign(ema_rule.update(self.state.ops, e.read_value(), p.read_value(), decay))

    def ema_weights(self) -> Weights:
        assert self._ema is not None  # ema() ran before (the loop starts it)
        live = [p.read_value() for p in self.state.params]
        for p, e in zip(self.state.params, self._ema, strict=True):
            p.assign(e.read_value())
        try:
            return self.weights()  # the averaged parameters, the live running statistics
        finally:
            for p, w in zip(self.state.params, live, strict=True):
                p.assign(w)

    def load_ema(self, weights: Weights) -> None:
        live = self.weights()
        self.load_weights(weights)
        self.ema(ema_rule.COPY, 0.0)
        self.load_weights(live)

    # ---- checkpoints -----------------------------------------------------------------------------
    def optimizer_state(self) -> OptimizerState:
        return self.state.optimizer.state(self.state.param_names)

    def load_weights(self, weights: Weights) -> None:
        if self.state.layout is not None:
            pair_map.load_canonical(self.state.named, self.state.layout, weights)
        else:
            load_canonical(self.state.named, weights, keras_layouts(self.spec.model))

    def load_optimizer_state(self, state: OptimizerState) -> None:
        self.state.optimizer.load(state, self.state.param_names)


def _keras_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """One sample's shape as the Keras model takes it: images (C, H, W) as (H, W, C)."""
    return (shape[1], shape[2], shape[0]) if len(shape) == 3 else shape

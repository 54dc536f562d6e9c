"""What the tf engine's parts share: the strategy and this process's replicas, the Keras model and
its variables in canonical order, torch.optim's and GradScaler's state as variables, the precision.
Built once by :class:`~dualtrain.backends.tf.engine.TFEngine` under the strategy's scope; its parts
(the forward: forward.py, the update: update.py, the step: step.py, the parameter server's step:
ps.py) each take it, and each other, in their constructors."""

from __future__ import annotations

from dataclasses import dataclass, field

import keras
import numpy as np
import tensorflow as tf

from dualtrain.core.data.dataset import Data
from dualtrain.core.ops import Ops
from dualtrain.core.pair.record import Layout
from dualtrain.spec import Experiment, Loss, OptimizerSpec

from .model import Conversion, Taps, to_nhwc
from .optimizer import OptimizerVariables

SUM = tf.distribute.ReduceOp.SUM


@dataclass(eq=False)
class TFState:
    """This process's training state on the tf backend (its replicas: ``n_local`` from
    ``first_replica``)."""

    spec: Experiment
    data: Data
    strategy: tf.distribute.Strategy
    layout: Layout | None
    """A model pair's (model_pair.json), else None."""
    conversion: Conversion
    """canonical <-> Keras layouts of weights, gradients and slots (by name, or the pair's map)."""
    rank: int
    num_processes: int
    n_local: int
    first_replica: int
    host: str
    """The host device: where a process's batch and evaluation live."""
    dtype: tf.DType
    """Parameters, optimizer state, loss and gradients: float64 for fp64, else float32."""
    ops: Ops
    """The array namespace dualtrain.core.update_rules computes with."""
    model: keras.Model
    named: list[tuple[str, keras.Variable]]
    """The model's variables in canonical order."""
    taps: Taps
    """Every layer's output (tap_layers); empty for a model pair."""
    dropout: bool
    """dualtrain's own dropout layers are in the model (their masks take ids and step)."""
    norms: list[tuple[float, bool]]
    """(momentum, sync) per batchnorm layer, in canonical order."""
    guard_empty: bool
    """An empty replica runs no forward (models with convolutions, without sync batchnorm)."""
    param_names: list[str]
    params: list[tf.Variable]
    """The trainable parameters' tf.Variables (MirroredVariables under the strategy)."""
    running: list[tf.Variable]
    """Batchnorm's running statistics: assigned by the step, never trained."""
    optimizer: OptimizerVariables
    """torch.optim's state and GradScaler's, as variables (optimizer.py)."""
    multi_worker: bool = False
    eval_chunk: int = 1
    gathers: dict[tf.DType, tf.types.experimental.PolymorphicFunction] = field(default_factory=dict)

    @property
    def fp16(self) -> bool:
        return self.optimizer.fp16

    @property
    def opt(self) -> OptimizerSpec:
        return self.spec.optimizer

    @property
    def loss(self) -> Loss:
        return self.spec.model.loss

    @property
    def accumulate(self) -> int:
        return self.spec.train.accumulate

    @property
    def poisonable(self) -> bool:
        """Fault injection (debug.nonfinite_grad) is in the graph."""
        return bool(self.spec.debug.nonfinite_grad)

    @property
    def applied(self) -> tf.Variable:
        return self.optimizer.applied

    @property
    def scale(self) -> tf.Variable:
        return self.optimizer.scale

    @property
    def good_steps(self) -> tf.Variable:
        return self.optimizer.good_steps

    def feed(self, split: str, positions: np.ndarray | slice) -> list[np.ndarray]:
        """A batch as the traced functions take it: the inputs (images NHWC) in the parameter
        dtype, then the targets (int32 labels for cross-entropy)."""
        xs = [
            (to_nhwc(a, self.dtype.name) if a.ndim == 4 else a.astype(self.dtype.name))
            for a in self.data.inputs(split, positions)
        ]
        y = self.data.targets(split, positions)
        return [*xs, y.astype(np.int32 if y.dtype == np.int64 else self.dtype.name)]

    def gather(self, rows: np.ndarray) -> np.ndarray:
        """Every process's ``rows``, stacked in rank order."""
        rows = np.asarray(rows)
        if not self.multi_worker:
            return rows[None]
        dtype = tf.int64 if rows.dtype.kind in "iu" else tf.float64
        mat = np.zeros((self.num_processes, rows.size), dtype.as_numpy_dtype)
        mat[self.rank] = rows.reshape(-1)
        out = self._gather_fn(dtype)(mat).numpy()
        return out.reshape(self.num_processes, *rows.shape).astype(rows.dtype, copy=False)

    def _gather_fn(self, dtype: tf.DType) -> tf.types.experimental.PolymorphicFunction:
        # An all-gather as a SUM all-reduce of a (processes, n) matrix in which each process fills
        # only its own row: adding zeros is exact (int64 and float64 alike).
        if dtype not in self.gathers:

            def gather(rows: tf.Tensor) -> tf.Tensor:
                # identity: place the value on the replica's device
                def replica(v: tf.Tensor) -> tf.Tensor:
                    return tf.distribute.get_replica_context().all_reduce(SUM, tf.identity(v))

                out = self.strategy.run(replica, args=(rows,))
                return self.strategy.experimental_local_results(out)[0]

            self.gathers[dtype] = tf.function(
                gather,
                input_signature=[tf.TensorSpec([self.num_processes, None], dtype)],
                jit_compile=False,
                autograph=False,
            )
        return self.gathers[dtype]

"""The audit recorder for Keras ``fit`` under a tf.distribute strategy (MirroredStrategy,
MultiWorkerMirroredStrategy): a callback, plus a thin wrapper of the model's train step and of its
optimizer's gradient all-reduce for what a callback cannot see::

    rec = dualtrain.audit.keras_recorder("runs/audit_keras", model=model)
    model.fit(train_ds, epochs=..., callbacks=[rec])      # the record is written as fit ends

Per step: the lr and loss scale at the step's start and whether the optimizer applied the step
(its ``iterations`` moved: a LossScaleOptimizer that skips leaves it) from the callback; from the
wrappers, each replica's rows (their digests, dualtrain.audit.identity) and its loss, both in the
replica's train step, and the norm of the gradient Keras's all-reduce summed (no all-reduce of the
recorder's own). A replica's loss is the change of its own copy of fit's loss tracker over its step
(the tracker's variables are per replica until read across them): ``sum`` grows by the replica's
loss times its rows, ``count`` by its rows, so the step's loss, the rows' weighted mean, is the
global batch's as fit computes it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from dualtrain.audit import record
from dualtrain.audit.identity import CHUNK, MASK32, hexes, multipliers
from dualtrain.backends.tf.envinfo import backend_facts
from dualtrain.core.pair import mapfile
from dualtrain.errors import UserError, shown

#: Keras variable name -> torch's, for the canonical (state-dict) names
NAMES = {
    "kernel": "weight",
    "bias": "bias",
    "gamma": "weight",
    "beta": "bias",
    "moving_mean": "running_mean",
    "moving_variance": "running_var",
    "embeddings": "weight",
}


def canonical_weights(model: Any, weight_map: str | None = None) -> dict[str, np.ndarray]:
    """The model's variables in torch's layout and state-dict style names (``conv2d.weight``):
    conv kernels HWIO -> OIHW, dense kernels (in, out) -> (out, in); or, given a model pair's
    ``weight_map`` file, under the torch names and layout the map gives them."""
    if weight_map is not None:
        values = {v.path: np.asarray(keras.ops.convert_to_numpy(v)) for v in model.weights}
        trainable = [v.path for v in model.trainable_weights]
        return mapfile.canonical_from_keras(weight_map, values, trainable)
    out = {}
    for v in model.weights:
        layer, _, leaf = v.path.rpartition("/")
        if leaf not in NAMES:
            continue  # seed generators' states and the like
        inner = layer.split("/")[1:] or [layer]  # without the model's own name
        a = np.asarray(keras.ops.convert_to_numpy(v))
        if leaf == "kernel" and a.ndim >= 3:
            a = np.transpose(a, (a.ndim - 1, a.ndim - 2, *range(a.ndim - 2)))
        elif leaf == "kernel" and a.ndim == 2:
            a = a.T
        out[".".join([*inner, NAMES[leaf]])] = np.ascontiguousarray(a)
    return out


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if isinstance(v, (int, float, bool, str, type(None)))}


def strategy_name(strategy: Any) -> str:
    """The strategy's public name (MultiWorkerMirroredStrategy's class is
    CollectiveAllReduceStrategy)."""
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "MultiWorkerMirroredStrategy"
    return type(strategy).__name__


def _config(model: Any) -> dict[str, Any]:
    opt = model.optimizer
    cfg: dict[str, Any] = {
        "batchnorm": [
            {
                "name": layer.name,
                "momentum": layer.momentum,
                "eps": layer.epsilon,
                "convention": "keras",
            }
            for layer in model._flatten_layers()
            if isinstance(layer, keras.layers.BatchNormalization)
        ],
        "strategy": strategy_name(model.distribute_strategy),
    }
    if isinstance(opt, keras.optimizers.LossScaleOptimizer):
        c = opt.get_config()
        cfg["loss_scale"] = {
            "type": "LossScaleOptimizer",
            "initial_scale": float(c.get("initial_scale", 2.0**15)),
            "growth_interval": int(c.get("dynamic_growth_steps", 2000)),
            "growth_factor": 2.0,
            "backoff_factor": 0.5,
        }
        opt = opt.inner_optimizer
    oc = _plain(opt.get_config())
    if not isinstance(opt.get_config().get("learning_rate"), (int, float)):
        oc["learning_rate"] = type(opt._learning_rate).__name__
    cfg["optimizer"] = {"type": type(opt).__name__, **oc}
    return cfg


def _dot(words: Any, mult: Any) -> Any:
    """dualtrain.audit.identity's exact sums: float64 products of integers below 2**53."""
    out = None
    for lo in range(0, int(words.shape[1]), CHUNK):
        part = tf.cast(tf.matmul(words[:, lo : lo + CHUNK], mult[lo : lo + CHUNK]), tf.int64)
        out = part if out is None else out + part
    return tf.bitwise.bitwise_and(out, MASK32)


def _sums(tracker: Any) -> tuple[Any, Any]:
    """A loss tracker's (total, count) as this replica holds them; NaNs without a tracker."""
    if tracker is None:
        return tf.constant(float("nan")), tf.constant(float("nan"))
    return tf.convert_to_tensor(tracker.total), tf.convert_to_tensor(tracker.count)


class KerasRecorder(keras.callbacks.Callback):
    """See the module docstring; made by dualtrain.audit.keras_recorder."""

    def __init__(self, run_dir: str | Path, *, model: Any, weight_map: str | None = None):
        super().__init__()
        if not isinstance(model, keras.Model):
            raise UserError(
                f"keras_recorder's model must be a keras.Model. Received: {shown(model)}"
            )
        self.weight_map = None if weight_map is None else str(weight_map)
        if self.weight_map is not None and model.built:
            canonical_weights(model, self.weight_map)  # a map that does not fit: before anything
        strategy = model.distribute_strategy
        if not isinstance(
            strategy, (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)
        ):
            raise UserError(
                "keras_recorder needs a model built under a MirroredStrategy or "
                "MultiWorkerMirroredStrategy scope (`with strategy.scope(): model = ...`). "
                f"Received: a model under {type(strategy).__name__}"
            )
        record.claim("keras")
        try:
            resolver = getattr(strategy, "cluster_resolver", None)
            self.rank = int(getattr(resolver, "task_id", 0) or 0)
            self.ranks = (
                max(1, int(strategy.extended._num_workers))
                if hasattr(strategy.extended, "_num_workers")
                else 1
            )
            self.dir = Path(run_dir)
            if self.rank == 0:
                record.prepare(self.dir, "tf")
        except BaseException:
            record.release()
            raise
        self.replicas = strategy.num_replicas_in_sync
        self.lock = threading.Lock()
        self.steps: list[dict[str, Any]] = []
        self.rows: list[dict[str, Any]] = []
        self.norms: dict[int, float] = {}
        self.epoch = 1
        self.last: int | None = None
        self.closed = False
        self._undo: list[Callable[[], None]] = []
        self._recorded = model
        self._wrap(model)

    # ---- the wrappers (traced into fit's train function) -----------------------------------------
    def _wrap(self, model: Any) -> None:
        original_step = model.train_step
        mults: dict[int, tf.Tensor] = {}

        def digests(x: Any) -> tuple[Any, Any]:
            width = int(np.prod(x.shape[1:]))
            x = tf.cast(tf.reshape(x, (-1, width)), tf.float32)
            if width not in mults:
                mults[width] = tf.constant(multipliers(width))
            mult = mults[width]
            bits = tf.bitwise.bitwise_and(tf.cast(tf.bitcast(x, tf.int32), tf.int64), MASK32)
            low, high = tf.bitwise.bitwise_and(bits, 0xFFFF), tf.bitwise.right_shift(bits, 16)
            words = tf.cast(tf.concat([low, high], axis=1), tf.float64)
            mask = tf.cast(x > tf.reduce_min(x, axis=1, keepdims=True), tf.float64)
            exact, pattern = _dot(words, mult), _dot(mask, mult[:width])
            return exact, pattern

        def train_step(data: Any) -> Any:
            x = data[0] if isinstance(data, (tuple, list)) else data
            x = next(iter(x.values())) if isinstance(x, dict) else x
            x = x[0] if isinstance(x, (tuple, list)) else x
            rid = tf.distribute.get_replica_context().replica_id_in_sync_group
            exact, pattern = digests(x)
            tracker = next((m for m in model.metrics if m.name == "loss"), None)
            before = _sums(tracker)  # this replica's copy (read in its replica context)
            logs = original_step(data)
            after = _sums(tracker)  # after the step's update (ordered on the variables)
            loss = (after[0] - before[0]) / (after[1] - before[1])  # NaN: no tracker
            tf.py_function(self._host_rows, [rid, exact, pattern, loss], [])
            return logs

        original_fit = model.fit

        def fit(*args: Any, **kwargs: Any) -> Any:
            try:
                return original_fit(*args, **kwargs)
            except BaseException:  # fit calls no callback when it fails: the record says so
                self.close()
                raise

        jit = model.jit_compile
        self._undo.append(lambda: setattr(model, "jit_compile", jit))
        self._patch(model, "train_step", train_step)
        self._patch(model, "fit", fit)
        model.train_function = None  # rebuilt by fit with the wrapper
        # the wrapper hands values to Python (tf.py_function), which XLA cannot compile: fit's
        # train function runs without jit_compile while recorded (docs/audit.md)
        model.jit_compile = False
        self._wrap_optimizer(model)

    def _patch(self, obj: Any, name: str, value: Any) -> None:
        """Set ``obj.name`` for this recording; :meth:`_unwrap` puts back what was there."""
        if name in vars(obj):
            old = vars(obj)[name]
            self._undo.append(lambda: setattr(obj, name, old))
        else:
            self._undo.append(lambda: delattr(obj, name))
        setattr(obj, name, value)

    def _unwrap(self) -> None:
        """The model, its optimizer and fit as they were before the recorder (a later fit, or
        another recorder, starts from the model as the script built it)."""
        while self._undo:
            self._undo.pop()()
        self._recorded.train_function = None

    def close(self) -> None:
        """End a recording that did not end with its fit (a recorder closes itself when fit
        returns): one whose fit failed or never ran. Its folder says it failed (compare refuses
        it) and the process may start another recorder. Closing twice does nothing."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.rank == 0:
                record.abandon(self.dir)
        finally:
            record.release()
            self._unwrap()

    def _wrap_optimizer(self, model: Any) -> None:
        """The norm of the gradients Keras's own all-reduce summed over the replicas (its
        ``_all_reduce_sum_gradients``, in the replica's update step): no all-reduce of its own. A
        LossScaleOptimizer's inner optimizer is wrapped: it sees the unscaled gradients, and a
        step the scaler skips reaches no update (its norm is NaN, as torch's recorder leaves it)."""
        opt = model.optimizer
        if opt is None:
            raise UserError("keras_recorder needs a compiled model (call model.compile first)")
        if isinstance(opt, keras.optimizers.LossScaleOptimizer):
            opt = opt.inner_optimizer
        original = opt._all_reduce_sum_gradients

        def all_reduce_sum_gradients(grads_and_vars: Any) -> Any:
            reduced = original(grads_and_vars)
            grads = [tf.cast(g, tf.float32) for g, _ in reduced if g is not None]
            ctx = tf.distribute.get_replica_context()
            rid = ctx.replica_id_in_sync_group if ctx else 0
            tf.py_function(self._host_norm, [rid, tf.linalg.global_norm(grads)], [])
            return reduced

        self._patch(opt, "_all_reduce_sum_gradients", all_reduce_sum_gradients)

    def _host_rows(self, rid: Any, exact: Any, pattern: Any, loss: Any) -> None:
        row = {
            "step": len(self.steps),
            "epoch": self.epoch,
            "replica": int(rid),
            "count": int(exact.shape[0]),
            "exact": hexes(exact.numpy()),
            "pattern": hexes(pattern.numpy()),
            "indices": None,
            "loss": None if np.isnan(float(loss)) else float(loss),
        }
        with self.lock:
            self.rows.append(row)

    def _host_norm(self, rid: Any, norm: Any) -> None:
        if int(rid) == 0:
            self.norms[len(self.steps)] = float(norm)

    # ---- the callback ----------------------------------------------------------------------------
    def _iterations(self) -> int:
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def on_train_begin(self, logs: Any = None) -> None:
        if self.closed:
            raise UserError("this audit recorder is closed; make a new one for another fit")
        spe = getattr(self.model, "steps_per_execution", 1)
        if int(keras.ops.convert_to_numpy(spe)) != 1:
            self.close()
            raise UserError(
                "keras_recorder records each step: compile with steps_per_execution=1. "
                f"Received: steps_per_execution={int(keras.ops.convert_to_numpy(spe))}"
            )
        self.started = time.perf_counter()
        try:
            self.init = canonical_weights(self.model, self.weight_map) if self.rank == 0 else {}
        except UserError:  # a map that does not fit the model fit built: nothing half-written
            self.close()
            raise
        self.config = _config(self.model)

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epoch = epoch + 1

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        opt = self.model.optimizer
        scale = None
        if isinstance(opt, keras.optimizers.LossScaleOptimizer):
            scale = float(keras.ops.convert_to_numpy(opt.dynamic_scale))
        lr = float(keras.ops.convert_to_numpy(opt.learning_rate))
        self.before = self._iterations() if self.last is None else self.last  # the last step's end
        self.steps.append(
            {"step": len(self.steps) + 1, "epoch": self.epoch, "lr": lr, "loss_scale": scale}
        )

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.last, step = self._iterations(), self.steps[-1]
        step["skipped"] = self.last == self.before
        step["grad_norm"] = self.norms.get(step["step"], float("nan"))

    def on_train_end(self, logs: Any = None) -> None:
        self.closed = True
        try:
            rows = sorted(self.rows, key=lambda r: (r["step"], r["replica"]))
            record.write_part(self.dir, self.rank, rows)
            if self.rank == 0:
                record.finish(
                    self.dir,
                    framework="tf",
                    world_size=self.replicas,
                    steps=self.steps,
                    ranks=self.ranks,
                    config=self.config,
                    weights_init=self.init,
                    weights_final=canonical_weights(self.model, self.weight_map),
                    env={"tf": backend_facts()},
                    wall_s=time.perf_counter() - self.started,
                )
        finally:
            record.release()
            self._unwrap()

"""distribution.strategy: parameter_server on TF: ``tf.distribute.ParameterServerStrategy`` with a
``ClusterCoordinator``, the Keras 3 model's variables on a parameter-server task
(docs/strategies.md).

The run's processes are a TF cluster dualtrain's launcher starts: the chief (the coordinator, this
engine's process: it runs the training loop and writes the run directory), W workers and one
parameter server, the last W + 1 being ``tf.distribute.Server`` processes (:func:`serve`) that the
launcher stops once the chief is done. Every step the chief schedules one function per replica and
micro-batch (``ClusterCoordinator.schedule``: whichever worker is free runs it) that computes the
gradient of that shard's ``sum(loss) / N_global`` (times the loss scale under fp16) against the
server's variables; ``join`` is the barrier; the gradients are summed replica by replica (micro-
batches first, as an accumulating replica adds them) and the update is the one an all-reduce step
makes (unscale and skip, norm, clipping, torch.optim's rule on the TF namespace, GradScaler's rule:
the same methods of :class:`~dualtrain.backends.tf.update.GradientUpdate`), applied to the
variables on the parameter server. Evaluation runs on the chief, reading the server's variables.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tensorflow as tf

from dualtrain.core import pair
from dualtrain.core.data.dataset import Data
from dualtrain.core.data.splits import TRAIN
from dualtrain.core.plan import micro_batches
from dualtrain.core.weights import Weights
from dualtrain.runtime.engine import StepOut
from dualtrain.spec import Experiment

from .engine import TFEngine
from .forward import ForwardPass
from .mapping import canonical
from .state import TFState
from .update import GradientUpdate


def serve(cluster: dict[str, list[str]], job: str, index: int, threads: int) -> None:
    """A worker or parameter-server task: serve the coordinator until the launcher stops it. The
    server runs the functions it is sent under its own session config (not the eager context's
    tf.config settings): its thread pools are set there."""
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=threads, inter_op_parallelism_threads=max(2, threads)
    )
    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster),
        job_name=job,
        task_index=index,
        protocol="grpc",
        config=config,
        start=True,
    )
    server.join()


def strategy_for(cluster: dict[str, list[str]]) -> tuple[Any, Any]:
    """The chief's ParameterServerStrategy over ``cluster`` and its ClusterCoordinator."""
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc"
    )
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    return strategy, tf.distribute.coordinator.ClusterCoordinator(strategy)


class PSEngine(TFEngine):
    """The chief's engine: the replicas' gradients computed on the workers, summed and applied
    here to the parameter server's variables (its step: :class:`ServerStep`)."""

    def __init__(
        self,
        spec: Experiment,
        strategy: tf.distribute.ParameterServerStrategy,
        coordinator: tf.distribute.coordinator.ClusterCoordinator,
        data: Data,
        init_weights: Weights,
        *,
        host_device: str,
        layout: pair.Layout | None = None,
    ) -> None:
        """``layout``: a model pair's (model_pair.json): the user's Keras model, its variables on
        the parameter server, its dropout layers the pair's masks on the workers."""
        self.coordinator = coordinator
        super().__init__(
            spec,
            strategy,
            data,
            init_weights,
            rank=0,
            num_processes=1,
            host_device=host_device,
            layout=layout,
        )

    def _trace(self) -> None:
        world = self.spec.distribution.world_size
        st = self.state
        st.n_local = world
        self.local_replicas = list(range(world))
        st.multi_worker = False  # one process runs the loop: gathers are local
        st.eval_chunk = max(1, self.spec.data.eval_batch_size // world)
        self.forward.trace_eval(None)
        self.steps = ServerStep(st, self.forward, self.grads, self.coordinator)


class ServerStep:
    """One step of a parameter-server run: each replica's micro-batches scheduled on the workers
    (the forward part), their gradients summed on the chief, the update (the update part)
    applied to the server's variables."""

    def __init__(
        self,
        state: TFState,
        forward: ForwardPass,
        update: GradientUpdate,
        coordinator: tf.distribute.coordinator.ClusterCoordinator,
    ) -> None:
        self.state = state
        self.forward = forward
        self.grads = update
        self.coordinator = coordinator
        self.replica_fn = tf.function(self.shard, jit_compile=False, autograph=False)
        self.apply_fn = tf.function(
            lambda grads, lr: self.apply(grads, lr, capture=False), autograph=False
        )
        self.apply_capture_fn = tf.function(
            lambda grads, lr: self.apply(grads, lr, capture=True), autograph=False
        )

    def shard(
        self,
        ids: tf.Tensor,
        global_count: tf.Tensor,
        step: tf.Tensor,
        poison: tf.Tensor,
        *batch: tf.Tensor,
    ) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
        """One replica's micro-batch, on a worker: (gradient, loss sum)."""

        def replica(
            ids: tf.Tensor, x: list[tf.Tensor], y: tf.Tensor
        ) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
            scale = self.state.scale.read_value()
            loss_sum, _, grads, _ = self.forward.micro_step(ids, x, y, global_count, step, scale)
            if self.state.poisonable:  # fault injection (debug.nonfinite_grad)
                grads = [
                    tf.where(poison, tf.fill(tf.shape(g), tf.constant(math.inf, g.dtype)), g)
                    for g in grads
                ]
            return grads, loss_sum, tf.identity(ids)  # the ids it used, read back

        return self.state.strategy.run(replica, args=(ids, list(batch[:-1]), batch[-1]))

    def apply(self, grads: list[tf.Tensor], lr: tf.Tensor, *, capture: bool) -> dict[str, Any]:
        """The update from the summed gradient, on the chief, to the server's variables."""
        st = self.state
        scale = st.scale.read_value()
        grads, norm, finite, amax, captured = self.grads.after_reduce(grads, scale, capture=capture)
        for k, p in enumerate(st.params):
            self.grads.apply_one(p, grads[k], finite, lr, k)
        self.grads.bookkeeping(st.applied, finite)
        return {"norm": norm, "finite": finite, "amax": amax, "captured": captured}

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
            raise ValueError(f"expected ids and poison for {self.state.n_local} replicas")
        scale = float(self.state.scale.numpy()) if self.state.fp16 else 1.0
        count = tf.constant(global_count, tf.float32)
        step_t = tf.constant(step, tf.int64)
        remote = []
        owner: list[int] = []
        for r, replica_ids in enumerate(ids):
            for part in micro_batches(replica_ids, self.state.accumulate):
                owner.append(r)
                batch = [tf.constant(b) for b in self.state.feed(TRAIN, part)]
                args = (tf.constant(part, tf.int64), count, step_t, tf.constant(poison[r]), *batch)
                remote.append(self.coordinator.schedule(self.replica_fn, args=args))
        self.coordinator.join()  # the barrier: every replica's gradient is in
        total: list[tf.Tensor] | None = None
        loss_sum = 0.0
        fed: list[list[np.ndarray]] = [[] for _ in ids]
        for r, rv in zip(owner, remote, strict=True):  # replica by replica, micro-batches in order
            grads, loss, used = rv.fetch()
            loss_sum += float(loss)
            fed[r].append(np.asarray(used))
            total = (
                [tf.constant(g) for g in grads]
                if total is None
                else [t + g for t, g in zip(total, grads, strict=True)]
            )
        assert total is not None
        fn = self.apply_capture_fn if capture_grads else self.apply_fn
        out = fn(total, tf.constant(lr, tf.float64))
        finite = bool(out["finite"])
        grads_out = None
        if capture_grads:
            grads_out = canonical(
                self.state.conversion,
                (
                    (name, g.numpy())
                    for name, g in zip(self.state.param_names, out["captured"], strict=True)
                ),
            )
        return StepOut(
            loss_sum=loss_sum,
            grad_norm=float(out["norm"]),
            loss_scale=scale,
            skipped=self.state.fp16 and not finite,
            fed_ids=[np.concatenate(f) if f else np.zeros(0, np.int64) for f in fed],
            grads=grads_out,
            grad_amax=float(out["amax"]) if self.state.fp16 else None,
        )

"""Mutants that run on either backend (:data:`BACKEND_MUTANTS`, [BACKEND/]NAME)."""

from __future__ import annotations

from dualtrain.core import stopping
from tools.mutants.patching import tf_engine, tf_forward, tf_step, torch_engine, torch_forward

#: Mutants that run on either backend ([BACKEND/]NAME): a model pair's native layers
#: (configs/port_resnet.yaml with model.args.bn=true; parity_tests/test_model_pairs.py), and
#: gradient accumulation (parity_tests/test_accumulation.py)
BACKEND_MUTANTS = {
    "pair_bn_own_stats": "a model pair's native batchnorm layers: every replica keeps the running "
    "statistics of its own batches (Keras under tf.distribute; torch without DDP's buffer "
    "broadcast) instead of replica 0's",
    "ema_decay_swapped": "train.ema: the decay weighs the new weights instead of the average "
    "(ema = (1 - decay) ema + decay w: the momentum convention of one framework read in the "
    "other's)",
    "early_stop_late": "train.early_stopping: the run stops one evaluation after its patience "
    "ran out (a wait counter compared with > instead of >=)",
    "accumulate_micro_mean": "train.accumulate: each micro-batch's loss is its own mean, divided "
    "by K and the replica count (Keras's gradient_accumulation_steps under tf.distribute), not the "
    "sum over the whole step's global count: the same only when every micro-batch is as large",
    "ps_mean_of_means": "distribution.strategy: parameter_server: every replica's loss is its own "
    "mean and the server averages the W gradients (the RPC batch-update tutorial's and Horovod's "
    "convention), not the sum over the global count: the same only when every shard is as large",
}


# ---- mutants on either backend (BACKEND_MUTANTS) ------------------------------------------------


def tf_pair_bn_own_stats() -> None:
    cls = tf_step()
    updates = cls.running_updates

    def mutated(self, ctx, stats):
        if self.state.layout is None:
            return updates(self, ctx, stats)
        # as the forward left them: no broadcast
        return [r.read_value() for r in self.state.running]

    cls.running_updates = mutated


def torch_pair_bn_own_stats() -> None:
    cls = torch_engine().TorchEngine
    init = cls.__init__

    def mutated(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if self._pair:  # a pair's broadcast holds its own batchnorm layers' statistics only
            self.state.broadcast = []

    cls.__init__ = mutated


def tf_accumulate_micro_mean() -> None:
    import tensorflow as tf  # lazy: framework

    cls = tf_forward()
    micro_step = cls.micro_step

    def mutated(self, ids, x, y, global_count, step, scale, **kw):
        count = tf.cast(tf.maximum(tf.size(ids), 1), tf.float32)
        per = count * self.state.accumulate * self.state.strategy.num_replicas_in_sync
        return micro_step(self, ids, x, y, per, step, scale, **kw)

    cls.micro_step = mutated


def torch_accumulate_micro_mean() -> None:
    cls = torch_forward()
    micro_step = cls.micro_step

    def mutated(self, ids, step, global_count, measure_scale, **kw):
        per = max(len(ids), 1) * self.state.accumulate * self.state.world
        return micro_step(self, ids, step, per, measure_scale, **kw)

    cls.micro_step = mutated


def torch_ps_mean_of_means() -> None:
    cls = torch_forward()
    micro_step = cls.micro_step

    def mutated(self, ids, step, global_count, measure_scale, **kw):
        if self.state.server:  # a parameter-server replica only: the all-reduce path is untouched
            global_count = max(len(ids), 1) * self.state.world
        return micro_step(self, ids, step, global_count, measure_scale, **kw)

    cls.micro_step = mutated


def tf_ps_mean_of_means() -> None:
    import tensorflow as tf  # lazy: framework

    cls = tf_forward()
    micro_step = cls.micro_step

    def mutated(self, ids, x, y, global_count, step, scale, **kw):
        if self.state.spec.distribution.strategy != "parameter_server":
            return micro_step(self, ids, x, y, global_count, step, scale, **kw)
        # a parameter-server run only: the mirrored step is untouched
        own = tf.cast(tf.maximum(tf.size(ids), 1) * self.state.n_local, tf.float32)
        return micro_step(self, ids, x, y, own, step, scale, **kw)

    cls.micro_step = mutated


def early_stop_late() -> None:
    update = stopping.Stopper.update

    def mutated(self, value, step):
        improved, stop = update(self, value, step)
        stop = self.patience is not None and self.wait > self.patience
        self.stopped_at = step if stop else None
        return improved, stop

    stopping.Stopper.update = mutated


tf_early_stop_late = torch_early_stop_late = early_stop_late


def tf_ema_decay_swapped() -> None:
    cls = tf_engine()
    ema = cls.ema

    def mutated(self, action, decay):
        return ema(self, action, 1.0 - decay)

    cls.ema = mutated


def torch_ema_decay_swapped() -> None:
    cls = torch_engine().TorchEngine
    ema = cls.ema

    def mutated(self, action, decay):
        return ema(self, action, 1.0 - decay)

    cls.ema = mutated

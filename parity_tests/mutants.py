"""Semantic mutants: one backend computes something slightly different on purpose (tests only).

A mutant is applied through dualtrain's test hook: ``DUALTRAIN_TEST_HOOK=parity_tests.mutants:apply=
NAME[:SIZE]`` makes every worker call :func:`apply` right before it builds its engine. Mutants change
the **tf** backend only (a torch worker ignores them), by patching its engine or model builder inside
that worker process; the run's records (spec, lr, ids) stay what the spec says, unless the mutant is
about the records themselves (``swap_id``). ``dualtrain compare`` must then fail with the cause named
in :data:`MUTANTS`. parity_tests/test_mutants.py applies each one; parity_tests/detection_power.py
measures the smallest detected size (docs/parity.md §7).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str
    """The semantic difference, as a user would meet it."""
    size: float | None
    """The size the issue names (None: the mutant has no size)."""
    unit: str
    cause: str
    """The cause dualtrain compare must name (dualtrain.compare.diagnose)."""
    spec: str
    """Which parity_tests.test_mutants spec exercises it."""
    seen_by: str = "reference_loss"
    """The reference check that must fail (a mutant that changes only evaluation leaves the loss)."""


MUTANTS = {m.name: m for m in [
    Mutant("adam_eps", "Adam eps x (1 + size): 1e-8 vs Keras's default 1e-7 at size 9", 9.0,
           "relative change of eps", "semantics differ", "adam"),
    Mutant("lr_scale", "the update uses lr x (1 + size)", 1e-6, "relative change of lr",
           "semantics differ", "sgd"),
    Mutant("momentum", "SGD momentum 0.9 + size", 1e-6, "added to momentum", "semantics differ", "sgd"),
    Mutant("weight_decay", "weight decay 0 + size (coupled, as torch's SGD)", 1e-6,
           "weight decay added", "semantics differ", "sgd"),
    Mutant("keras_momentum", "Keras-form SGD momentum (v = m v - lr g; p += v) under a changing lr",
           None, "", "semantics differ", "sgd"),
    Mutant("mean_of_means", "loss = mean of per-replica means (Keras/DDP default) on a partial batch",
           None, "", "semantics differ", "sgd"),
    Mutant("clip_before_allreduce", "global-norm clipping per replica before the all-reduce (Keras "
           "clipnorm/global_clipnorm under a strategy) instead of after it", None, "",
           "semantics differ", "sgd"),
    Mutant("swap_id", "one sample id swapped for another at one step, on one replica", None, "",
           "different sample ids", "sgd"),
    Mutant("same_padding_asym", "a stride-2 conv with padding 1 built as Keras padding='same' (pads "
           "bottom/right only)", None, "", "semantics differ", "stride2"),
    Mutant("keras_bn_variance", "batchnorm running_var from the biased batch variance (Keras's "
           "moving_variance) instead of torch's unbiased one", None, "", "semantics differ", "bn",
           seen_by="reference_weights"),
    Mutant("keras_bn_replica_stats", "unsync batchnorm: every replica keeps its own running "
           "statistics and evaluates with them (Keras under tf.distribute) instead of replica 0's",
           None, "", "semantics differ", "bn", seen_by="reference_eval"),
]}

SWAP_STEP = 3

# 1,001 samples in global batches of 128 over 2 replicas: 7 full steps (64/64), then 105 samples split
# 53/52 (a partial, uneven batch), 2 epochs; lr follows a cosine schedule; clipping at 0.5 is active.
DATA = ("data.train_limit=1001", "data.batch_size=128", "data.test_limit=500", "train.epochs=2",
        "distribution.world_size=2", "precision.dtype=fp64")
SPECS = {
    "sgd": (*DATA, "optimizer.lr=0.1", "optimizer.momentum=0.9", "optimizer.schedule.name=cosine",
            "optimizer.clip_grad_norm=0.5"),
    "adam": (*DATA, "optimizer.name=adam", "optimizer.lr=0.001"),
    "stride2": (*DATA, "optimizer.lr=0.05", "optimizer.momentum=0.9",
                "model.preset=null", "model.layers=[{type: conv2d, filters: 8, kernel_size: 3, "
                "stride: 2, padding: 1}, {type: relu}, {type: flatten}, {type: dense, units: 10}]"),
    "bn": (*DATA, "optimizer.lr=0.05", "optimizer.momentum=0.9", "model.preset=null",
           "model.layers=[{type: conv2d, filters: 8, kernel_size: 3}, {type: batchnorm}, {type: relu}, "
           "{type: maxpool2d, pool_size: 2}, {type: flatten}, {type: dense, units: 32}, "
           "{type: batchnorm}, {type: relu}, {type: dense, units: 10}]"),
}


def hook(name: str, size: float | None = None) -> dict[str, str]:
    """The environment that makes a run's tf workers apply mutant ``name`` (at ``size``)."""
    from dualtrain.entry import TEST_HOOK

    root = str(Path(__file__).resolve().parent.parent)
    arg = name if size is None else f"{name}:{size!r}"
    return {TEST_HOOK: f"parity_tests.mutants:apply={arg}",
            "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}


def apply(backend: str, argument: str) -> None:
    """The DUALTRAIN_TEST_HOOK entry: ``argument`` is NAME or NAME:SIZE."""
    if backend != "tf":
        return
    name, _, size_text = argument.partition(":")
    if name not in MUTANTS:
        raise ValueError(f"unknown mutant {name!r} (known: {', '.join(MUTANTS)})")
    size = float(size_text) if size_text else MUTANTS[name].size
    globals()[f"_{name}"](size)


# ---- the mutants (each patches the tf backend in this worker process) -------------------------------

def _engine():
    from dualtrain.backends.tf import engine

    return engine.TFEngine


def _change_optimizer(**change) -> None:
    """Build the engine from a spec whose optimizer differs; the TrainLoop keeps the real spec, so the
    records (and the lr it hands in) are unchanged."""
    cls = _engine()
    init = cls.__init__

    def mutated(self, spec, *args, **kwargs):
        o = spec.optimizer
        new = {k: f(getattr(o, k)) for k, f in change.items()}
        init(self, spec.replace(optimizer=dataclasses.replace(o, **new)), *args, **kwargs)

    cls.__init__ = mutated


def _adam_eps(size: float) -> None:
    _change_optimizer(eps=lambda eps: eps * (1.0 + size))


def _momentum(size: float) -> None:
    _change_optimizer(momentum=lambda m: m + size)


def _weight_decay(size: float) -> None:
    _change_optimizer(weight_decay=lambda wd: wd + size)


def _lr_scale(size: float) -> None:
    cls = _engine()
    step = cls.train_step

    def mutated(self, ids, *, lr, **kwargs):
        return step(self, ids, lr=lr * (1.0 + size), **kwargs)

    cls.train_step = mutated


def _keras_momentum(size: float) -> None:
    import tensorflow as tf

    cls = _engine()

    def apply_one(self, p, g, apply, lr, k):
        # Keras SGD: v = momentum * v - lr * g; p += v (the old lrs stay baked into v).
        v = self.buf[k]
        new_v = v * self.opt.momentum - tf.cast(lr, p.dtype) * g
        return tf.group(v.assign(new_v), p.assign_add(new_v))

    cls._apply_one = apply_one


def _mean_of_means(size: float) -> None:
    import tensorflow as tf

    cls = _engine()
    step = cls._replica_step

    def mutated(self, ids_flat, offsets, poison, global_count, *rest):
        # Each replica differentiates its local mean / R, as DDP with a mean loss and Keras do.
        i = self._local_index()
        local = tf.cast(offsets[i + 1] - offsets[i], tf.float32)
        replicas = float(self.strategy.num_replicas_in_sync)
        return step(self, ids_flat, offsets, poison, tf.maximum(local, 1.0) * replicas, *rest)

    cls._replica_step = mutated


def _clip_before_allreduce(size: float) -> None:
    import tensorflow as tf

    cls = _engine()
    init, step = cls.__init__, cls._replica_step
    clip_of: dict[int, float] = {}

    def mutated_init(self, spec, *args, **kwargs):
        # No clipping after the all-reduce (the engine is built without it) ...
        clip_of[id(self)] = spec.optimizer.clip_grad_norm
        o = dataclasses.replace(spec.optimizer, clip_grad_norm=None)
        init(self, spec.replace(optimizer=o), *args, **kwargs)

    def mutated_step(self, *args):
        # ... but per replica, on the replica's own gradient, before it. The replica functions of a
        # MirroredStrategy run in threads: the context class is patched once and left patched.
        ctx_cls = type(tf.distribute.get_replica_context())
        if not getattr(ctx_cls, "_dualtrain_mutant", False):
            all_reduce = ctx_cls.all_reduce
            clip = clip_of[id(self)]
            n_params = len(self.params)

            def clipped(ctx, op, value, options=None):
                if isinstance(value, list) and len(value) == n_params:  # the gradient all-reduce
                    norm = tf.norm(tf.stack([tf.norm(tf.reshape(g, [-1])) for g in value]))
                    coef = tf.minimum(tf.constant(clip, value[0].dtype) / (norm + 1e-6), 1.0)
                    value = [g * coef for g in value]
                return all_reduce(ctx, op, value, options)

            ctx_cls.all_reduce = clipped
            ctx_cls._dualtrain_mutant = True
        return step(self, *args)

    cls.__init__ = mutated_init
    cls._replica_step = mutated_step


def _swap_id(size: float) -> None:
    import numpy as np

    cls = _engine()
    step = cls.train_step
    calls = {"n": 0}

    def mutated(self, ids, **kwargs):
        calls["n"] += 1
        if calls["n"] == SWAP_STEP and len(ids[0]):
            ids = [a.copy() for a in ids]
            n = int(self.train_y.shape[0])
            ids[0][0] = (int(ids[0][0]) + n // 2) % n  # another sample, fed (and recorded) instead
            ids[0] = ids[0].astype(np.int64)
        return step(self, ids, **kwargs)

    cls.train_step = mutated


def _same_padding_asym(size: float) -> None:
    import keras

    from dualtrain.backends.tf import model

    conv2d = model.conv2d

    def mutated(x, s, name, policy):
        if isinstance(s.padding, int) and s.padding and (s.stride or 1) > 1:
            return x, keras.layers.Conv2D(s.filters, s.kernel_size, strides=s.stride, padding="same",
                                          name=name, dtype=policy)
        return conv2d(x, s, name, policy)

    model.conv2d = mutated


def _keras_bn_variance(size: float) -> None:
    from dualtrain import batchnorm

    stats = batchnorm.batch_stats

    def mutated(ops, x, sync):
        mean, var, _ = stats(ops, x, sync)
        return mean, var, var

    batchnorm.batch_stats = mutated


def _keras_bn_replica_stats(size: float) -> None:
    from dualtrain import batchnorm

    cls = _engine()

    def mutated(self, ctx, stats):
        # no broadcast: each replica's running statistics follow its own batches; the exported
        # weights (the first device's copy) stay replica 0's, only evaluation on replica 1 differs
        return [batchnorm.update_running(r.read_value(), stat, self._norms[k // 2][0])
                for k, (r, stat) in enumerate(zip(self.running, stats))]

    cls._running_updates = mutated

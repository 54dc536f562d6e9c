"""The semantic mutants (:data:`MUTANTS`, tf only): each changes what the TF backend computes in
every precision, so the fp64 reference pair must fail, with the cause named here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from dualtrain.core import batchnorm
from dualtrain.core import data as data_mod
from tools.mutants.patching import tf_engine, tf_forward, tf_step, tf_update


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str
    """The semantic difference, as a user would meet it."""
    size: float | None
    """The size the issue names (None: the mutant has no size)."""
    unit: str
    cause: str
    """The cause dualtrain compare must name (dualtrain.parity.diagnose)."""
    spec: str
    """Which parity_tests.test_mutants spec exercises it."""
    seen_by: str = "reference_loss"
    """The reference check that must fail (a mutant that changes only evaluation leaves the
    loss)."""


MUTANTS = {
    m.name: m
    for m in [
        Mutant(
            "adam_eps",
            "Adam eps x (1 + size): 1e-8 vs Keras's default 1e-7 at size 9",
            9.0,
            "relative change of eps",
            "semantics differ",
            "adam",
        ),
        Mutant(
            "lr_scale",
            "the update uses lr x (1 + size)",
            1e-6,
            "relative change of lr",
            "semantics differ",
            "sgd",
        ),
        Mutant(
            "momentum",
            "SGD momentum 0.9 + size",
            1e-6,
            "added to momentum",
            "semantics differ",
            "sgd",
        ),
        Mutant(
            "weight_decay",
            "weight decay 0 + size (coupled, as torch's SGD)",
            1e-6,
            "weight decay added",
            "semantics differ",
            "sgd",
        ),
        Mutant(
            "keras_momentum",
            "Keras-form SGD momentum (v = m v - lr g; p += v) under a changing lr",
            None,
            "",
            "semantics differ",
            "sgd",
        ),
        Mutant(
            "mean_of_means",
            "loss = mean of per-replica means (Keras/DDP default) on a partial batch",
            None,
            "",
            "semantics differ",
            "sgd",
        ),
        Mutant(
            "clip_before_allreduce",
            "global-norm clipping per replica before the all-reduce (Keras "
            "clipnorm/global_clipnorm under a strategy) instead of after it",
            None,
            "",
            "semantics differ",
            "sgd",
        ),
        Mutant(
            "swap_id",
            "one sample id swapped for another at one step, on one replica",
            None,
            "",
            "different sample ids",
            "sgd",
        ),
        Mutant(
            "same_padding_asym",
            "a stride-2 conv with padding 1 built as Keras padding='same' (pads bottom/right only)",
            None,
            "",
            "semantics differ",
            "stride2",
        ),
        Mutant(
            "keras_bn_variance",
            "batchnorm running_var from the biased batch variance (Keras's "
            "moving_variance) instead of torch's unbiased one",
            None,
            "",
            "semantics differ",
            "bn",
            seen_by="reference_weights",
        ),
        Mutant(
            "keras_bn_replica_stats",
            "unsync batchnorm: every replica keeps its own running "
            "statistics and evaluates with them (Keras under tf.distribute) instead of replica 0's",
            None,
            "",
            "semantics differ",
            "bn_mw",
            seen_by="reference_eval",
        ),
        Mutant(
            "mse_half",
            "squared error halved (the 1/2 (o - t)^2 convention) instead of (o - t)^2",
            None,
            "",
            "semantics differ",
            "mse",
        ),
        Mutant(
            "bce_label_smoothing",
            "binary cross-entropy with label smoothing (targets t (1 - size) + size / 2, Keras's "
            "BinaryCrossentropy(label_smoothing=size))",
            1e-6,
            "label smoothing",
            "semantics differ",
            "bce",
        ),
        Mutant(
            "validation_tail",
            "the validation split evaluated on the training split's last samples (Keras's "
            "validation_split) instead of the recorded ids",
            None,
            "",
            "semantics differ",
            "val",
            seen_by="reference_eval",
        ),
    ]
}


#: the step whose ids the swap_id mutant swaps between the replicas
SWAP_STEP = 3


# ---- the mutants (each patches the tf backend in this worker process) ----------------------------


def _change_optimizer(**change) -> None:
    """Build the engine from a spec whose optimizer differs; the TrainLoop keeps the real spec, so
    the records (and the lr it hands in) are unchanged."""
    cls = tf_engine()
    init = cls.__init__

    def mutated(self, spec, *args, **kwargs):
        o = spec.optimizer
        new = {k: f(getattr(o, k)) for k, f in change.items()}
        init(self, spec.replace(optimizer=dataclasses.replace(o, **new)), *args, **kwargs)

    cls.__init__ = mutated


def adam_eps(size: float) -> None:
    _change_optimizer(eps=lambda eps: eps * (1.0 + size))


def momentum(size: float) -> None:
    _change_optimizer(momentum=lambda m: m + size)


def weight_decay(size: float) -> None:
    _change_optimizer(weight_decay=lambda wd: wd + size)


def lr_scale(size: float) -> None:
    cls = tf_engine()
    step = cls.train_step

    def mutated(self, ids, *, lr, **kwargs):
        return step(self, ids, lr=lr * (1.0 + size), **kwargs)

    cls.train_step = mutated


def keras_momentum(size: float) -> None:
    import tensorflow as tf  # lazy: framework

    cls = tf_update()

    def apply_one(self, p, g, apply, lr, k):
        # Keras SGD: v = momentum * v - lr * g; p += v (the old lrs stay baked into v).
        v = self.state.optimizer.slots["momentum_buffer"][k]
        new_v = v * self.state.opt.momentum - tf.cast(lr, p.dtype) * g
        return tf.group(v.assign(new_v), p.assign_add(new_v))

    cls.apply_one = apply_one


def mean_of_means(size: float) -> None:
    import tensorflow as tf  # lazy: framework

    cls = tf_step()
    step = cls.replica_step

    def mutated(self, ids_flat, offsets, poison, global_count, *rest):
        # Each replica differentiates its local mean / R, as DDP with a mean loss and Keras do.
        i = self.local_index()
        local = tf.cast(offsets[i + 1] - offsets[i], tf.float32)
        replicas = float(self.state.strategy.num_replicas_in_sync)
        return step(self, ids_flat, offsets, poison, tf.maximum(local, 1.0) * replicas, *rest)

    cls.replica_step = mutated


def clip_before_allreduce(size: float) -> None:
    import tensorflow as tf  # lazy: framework

    cls, parts = tf_engine(), tf_step()
    init, step = cls.__init__, parts.replica_step
    clip_of: dict[int, float] = {}  # by the id of the spec the engine was built with

    def mutated_init(self, spec, *args, **kwargs):
        # No clipping after the all-reduce (the engine is built without it) ...
        o = dataclasses.replace(spec.optimizer, clip_grad_norm=None)
        built = spec.replace(optimizer=o)
        clip_of[id(built)] = spec.optimizer.clip_grad_norm
        init(self, built, *args, **kwargs)

    def mutated_step(self, *args):
        # ... but per replica, on the replica's own gradient, before it. The replica functions of a
        # MirroredStrategy run in threads: the context class is patched once and left patched.
        ctx_cls = type(tf.distribute.get_replica_context())
        if not getattr(ctx_cls, "_dualtrain_mutant", False):
            all_reduce = ctx_cls.all_reduce
            clip = clip_of[id(self.state.spec)]
            n_params = len(self.state.params)

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
    parts.replica_step = mutated_step


def swap_id(size: float) -> None:
    cls = tf_engine()
    step = cls.train_step
    calls = {"n": 0}

    def mutated(self, ids, **kwargs):
        calls["n"] += 1
        if calls["n"] == SWAP_STEP and len(ids[0]):
            ids = [a.copy() for a in ids]
            n = self.data.size("train")
            ids[0][0] = (int(ids[0][0]) + n // 2) % n  # another sample, fed (and recorded) instead
            ids[0] = ids[0].astype(np.int64)
        return step(self, ids, **kwargs)

    cls.train_step = mutated


def same_padding_asym(size: float) -> None:
    import keras  # lazy: framework

    from dualtrain.backends.tf import model  # lazy: framework

    conv2d = model.conv2d

    def mutated(x, s, name, policy, inference=False):
        if isinstance(s.padding, int) and s.padding and (s.stride or 1) > 1:
            return x, keras.layers.Conv2D(
                s.filters, s.kernel_size, strides=s.stride, padding="same", name=name, dtype=policy
            )
        return conv2d(x, s, name, policy, inference)

    model.conv2d = mutated


def keras_bn_variance(size: float) -> None:
    stats = batchnorm.batch_stats

    def mutated(ops, x, sync):
        mean, var, _ = stats(ops, x, sync)
        return mean, var, var

    batchnorm.batch_stats = mutated


def keras_bn_replica_stats(size: float) -> None:
    cls = tf_step()

    def mutated(self, ctx, stats):
        # no broadcast: each replica's running statistics follow its own batches; the exported
        # weights (the chief's copy) stay replica 0's, only worker 1's evaluation differs (spec
        # bn_mw)
        values = [r.read_value() for r in self.state.running]
        for micro in stats:  # one list per micro-batch (train.accumulate)
            values = [
                batchnorm.update_running(v, stat, self.state.norms[k // 2][0])
                for k, (v, stat) in enumerate(zip(values, micro, strict=True))
            ]
        return values

    cls.running_updates = mutated


def mse_half(size: float) -> None:
    import tensorflow as tf  # lazy: framework

    cls = tf_forward()
    loss_sum = cls.loss_sum

    def mutated(self, logits, y):
        return loss_sum(self, logits, y) * tf.constant(0.5, self.state.dtype)

    cls.loss_sum = mutated


def bce_label_smoothing(size: float) -> None:
    cls = tf_forward()
    loss_sum = cls.loss_sum

    def mutated(self, logits, y):
        return loss_sum(self, logits, y * (1.0 - size) + size / 2)

    cls.loss_sum = mutated


def validation_tail(size: float) -> None:
    cls = tf_engine()
    evaluate = cls.evaluate

    def mutated(self, split, ranges):
        if split == data_mod.VALIDATION:
            val = self.data.splits[data_mod.VALIDATION]
            n = len(val) + len(self.data.splits[data_mod.TRAIN])
            tail = data_mod.Split(np.arange(n - len(val), n, dtype=np.int64))
            self.data.splits[data_mod.VALIDATION] = tail
            try:
                return evaluate(self, split, ranges)
            finally:
                self.data.splits[data_mod.VALIDATION] = val
        return evaluate(self, split, ranges)

    cls.evaluate = mutated

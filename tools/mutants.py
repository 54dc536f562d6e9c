"""Semantic mutants: one backend computes something slightly different on purpose (tests only).

A mutant is applied through dualtrain's test hook: ``DUALTRAIN_TEST_HOOK=tools.mutants:apply=
[BACKEND/]NAME[:SIZE]`` makes every worker call :func:`apply` right before it builds its engine. A
mutant changes one backend (tf unless BACKEND says torch; a worker of the other backend ignores it),
by patching its engine or model builder inside that worker process; the run's records (spec, lr,
ids) stay what the spec says, unless the mutant is about the records themselves (``swap_id``).

Two kinds:

* :data:`MUTANTS`, **semantic** mutants (tf only): they change what the backend computes in every
  precision, so the fp64 reference pair must fail, with the cause named here;
* :data:`PRECISION_MUTANTS`, **precision-path** mutants (either backend): active only in runs of
  their precision path (``path``), so the fp64 pair cannot see them; ``dualtrain compare`` must fail
  with "numerics: <backend> <path> path", found by the one-step probes (dualtrain.parity.local);
  :data:`TOKEN_PRECISION_MUTANTS` are the same kind in the token layers (on :data:`TOKEN_SPEC`).

parity_tests/test_mutants.py and test_precision_mutants.py apply each one;
tools/detection_power.py measures the smallest detected sizes (docs/parity.md §7).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dualtrain.core import batchnorm, stopping
from dualtrain.core import data as data_mod
from dualtrain.core.kernels import round_to
from dualtrain.runtime.entry import TEST_HOOK


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


@dataclass(frozen=True)
class PrecisionMutant:
    name: str
    what: str
    path: str
    """The precision path it lives in (fp32, fp16, bf16): the mutant is active only in such runs."""
    size: float | None
    unit: str = ""
    seen_by: str = "local_grad"
    """The local check that must fail."""


PRECISION_MUTANTS = {
    m.name: m
    for m in [
        PrecisionMutant(
            "unscale_factor",
            "fp16 gradients unscaled with a wrong factor: divided by the loss scale x (1 + size)",
            "fp16",
            1.0,
            "relative error of the unscale factor",
        ),
        PrecisionMutant(
            "ce_low_precision",
            "the cross-entropy's batch sum held in bfloat16: each per-sample loss rounded to "
            "bfloat16 and summed in sample order, rounded to bfloat16 after every addition, "
            "instead of a float32 sum (the same arithmetic on both backends, whatever kernels "
            "the CPU has)",
            "bf16",
            None,
            seen_by="local_loss",
        ),
        PrecisionMutant(
            "allreduce_low",
            "gradients all-reduced in float16 (a compression hook, as "
            "torch's fp16_compress_hook, without its division) in an fp32 run",
            "fp32",
            None,
        ),
        PrecisionMutant(
            "optimizer_state_low",
            "SGD's momentum buffer kept in bfloat16 (the optimizer state "
            "in a low precision) in an fp32 run",
            "fp32",
            None,
            seen_by="local_update",
        ),
        PrecisionMutant(
            "fp32_update_branch",
            "the float32 branch of the update uses lr x (1 + size) (the "
            "float64 branch, which the fp64 pair runs, is right)",
            "fp32",
            1e-3,
            "relative change of lr in the float32 update",
            seen_by="local_update",
        ),
    ]
}

#: The spec the precision mutants are measured on (MLP, SGD momentum 0.9, cosine, world 2, 2,600
#: samples: a partial last batch; 1 epoch, 21 steps, 6 probe steps), with the mutant's precision.
PRECISION_SPEC = (
    "data.train_limit=2600",
    "data.test_limit=500",
    "train.epochs=1",
    "distribution.world_size=2",
)

SWAP_STEP = 3

#: Precision-path mutants of the token layers (issue 33), measured on TOKEN_SPEC: a ViT-like model
#: whose LayerNorms, attention and position embedding the MLP of PRECISION_SPEC does not have.
TOKEN_PRECISION_MUTANTS = {
    m.name: m
    for m in [
        PrecisionMutant(
            "layernorm_grad_low",
            "the LayerNorms' gamma and beta gradients (each element a sum over the N x T token "
            "rows) summed in bfloat16 in an fp32 run: each row's term rounded to bfloat16 and "
            "added in row order, rounded to bfloat16 after every addition (the class of TF's "
            "BiasAddGrad summed in a lower dtype than the run's; the same arithmetic on both "
            "backends, whatever kernels the CPU has: bf16_row_sum)",
            "fp32",
            None,
        ),
        PrecisionMutant(
            "position_grad_low",
            "the position embedding's gradient (each element a sum over the batch) summed in "
            "bfloat16 in an fp32 run, in sample order (bf16_row_sum)",
            "fp32",
            None,
        ),
        PrecisionMutant(
            "patches_bias_grad_low",
            "the patch embedding's bias (a stride = kernel convolution's) with its gradient (a "
            "sum over the N x T patches) summed in bfloat16 in an fp32 run, in row order "
            "(bf16_row_sum; on tf every Conv2D's, of which TOKEN_SPEC has only the patches)",
            "fp32",
            None,
        ),
        PrecisionMutant(
            "attention_bias_grad_low",
            "the attention's packed q/k/v projection bias (in_proj_bias) with its gradient (a "
            "sum over the N x T token rows) summed in bfloat16 in an fp32 run, in row order "
            "(bf16_row_sum): TF's BiasAddGrad class in a token layer",
            "fp32",
            None,
        ),
    ]
}

#: The token spec the token mutants are measured on: parity_tests/test_new_layers_optimizers.py's
#: tokens-w2 (patches 7x7 -> 16 tokens of 16, a position embedding, a pre-LN block of 2-head
#: self-attention with dropout and an MLP block, a final LayerNorm, the first token), AdamW, world
#: 2, 1,001 samples for 2 epochs (16 steps, a partial last batch).
TOKEN_BLOCK = (
    "{type: residual, body: [{type: layernorm}, {type: attention, heads: 2}, "
    "{type: dropout, rate: 0.1}]}, {type: residual, body: [{type: layernorm}, "
    "{type: dense, units: 32}, {type: gelu, approximate: tanh}, {type: dense, units: 16}]}"
)
TOKEN_SPEC = (
    "data.train_limit=1001",
    "data.batch_size=128",
    "data.test_limit=500",
    "train.epochs=2",
    "model.preset=null",
    f"model.layers=[{{type: patches, size: 7, dim: 16}}, {{type: position}}, {TOKEN_BLOCK}, "
    "{type: layernorm}, {type: token_pool, pool: first}, {type: silu}, {type: dense, units: 10}]",
    "optimizer.name=adamw",
    "optimizer.lr=0.003",
    "distribution.world_size=2",
)


# 1,001 samples in global batches of 128 over 2 replicas: 7 full steps (64/64), then 105 samples
# split 53/52 (a partial, uneven batch), 2 epochs; lr follows a cosine schedule; clipping at 0.5 is
# active.
DATA = (
    "data.train_limit=1001",
    "data.batch_size=128",
    "data.test_limit=500",
    "train.epochs=2",
    "distribution.world_size=2",
    "precision.dtype=fp64",
)
TABLE = (
    "data.train_limit=null",
    "data.test_limit=null",
    "data.batch_size=32",
    "train.epochs=3",
    "distribution.world_size=2",
    "precision.dtype=fp64",
    "optimizer.name=adam",
    "model.preset=null",
    "model.layers=[{type: dense, units: 16}, {type: relu}, {type: dense, units: 1}]",
)
SPECS = {
    "sgd": (
        *DATA,
        "optimizer.lr=0.1",
        "optimizer.momentum=0.9",
        "optimizer.schedule.name=cosine",
        "optimizer.clip_grad_norm=0.5",
    ),
    "adam": (*DATA, "optimizer.name=adam", "optimizer.lr=0.001"),
    "stride2": (
        *DATA,
        "optimizer.lr=0.05",
        "optimizer.momentum=0.9",
        "model.preset=null",
        "model.layers=[{type: conv2d, filters: 8, kernel_size: 3, "
        "stride: 2, padding: 1}, {type: relu}, {type: flatten}, {type: dense, units: 10}]",
    ),
    # the other losses and the validation split, on scikit-learn's bundled tables (all rows)
    "mse": (
        *TABLE,
        "data.dataset=diabetes",
        "model.inputs=[{name: x, shape: [10]}]",
        "model.loss=mse",
        "optimizer.lr=0.01",
    ),
    "bce": (
        *TABLE,
        "data.dataset=breast_cancer",
        "model.inputs=[{name: x, shape: [30]}]",
        "model.loss=binary_cross_entropy",
        "optimizer.lr=0.001",
    ),
    "val": (
        *TABLE,
        "data.dataset=wine",
        "model.inputs=[{name: x, shape: [13]}]",
        "data.validation=0.2",
        "optimizer.lr=0.001",
        "model.layers=[{type: dense, units: 16}, {type: relu}, {type: dense, units: 3}]",
    ),
    "bn": (
        *DATA,
        "optimizer.lr=0.05",
        "optimizer.momentum=0.9",
        "model.preset=null",
        "model.layers=[{type: conv2d, filters: 8, kernel_size: 3}, {type: batchnorm}, "
        "{type: relu}, {type: maxpool2d, pool_size: 2}, {type: flatten}, {type: dense, units: 32}, "
        "{type: batchnorm}, {type: relu}, {type: dense, units: 10}]",
    ),
}
# The bn spec with the TF run as two worker processes (MultiWorkerMirroredStrategy): each worker
# evaluates its ranges on the host with its own copy of the variables, so a replica whose running
# statistics drifted from replica 0's shows in the evaluation. In one mirrored process evaluation
# reads the primary copy (replica 0's) for every range, and per-replica statistics never reach an
# output (tf.strategy is cosmetic: the torch run is the bn spec's).
SPECS["bn_mw"] = (*SPECS["bn"], "tf.strategy=multi_worker")


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


def hook(name: str, size: float | None = None, backend: str = "tf") -> dict[str, str]:
    """The environment that makes a run's ``backend`` workers apply mutant ``name`` (at
    ``size``)."""
    root = str(Path(__file__).resolve().parent.parent)
    arg = name if size is None else f"{name}:{size!r}"
    if backend != "tf":
        arg = f"{backend}/{arg}"
    return {
        TEST_HOOK: f"tools.mutants:apply={arg}",
        "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }


def apply(backend: str, argument: str) -> None:
    """The DUALTRAIN_TEST_HOOK entry: ``argument`` is [BACKEND/]NAME[:SIZE] (BACKEND: tf if
    absent)."""
    target, _, argument = argument.rpartition("/")
    if backend != (target or "tf"):
        return
    name, _, size_text = argument.partition(":")
    if name in PRECISION_MUTANTS or name in TOKEN_PRECISION_MUTANTS:
        m = PRECISION_MUTANTS.get(name) or TOKEN_PRECISION_MUTANTS[name]
        size = float(size_text) if size_text else m.size
        globals()[f"_{backend}_{name}"](m.path, size)
        return
    if name in BACKEND_MUTANTS:
        globals()[f"_{backend}_{name}"]()
        return
    if name not in MUTANTS or backend != "tf":
        raise ValueError(
            f"unknown {backend} mutant {name!r} (known: {', '.join(MUTANTS)} (tf), "
            f"{', '.join([*PRECISION_MUTANTS, *TOKEN_PRECISION_MUTANTS])} (either))"
        )
    size = float(size_text) if size_text else MUTANTS[name].size
    globals()[f"_{name}"](size)


# ---- the mutants (each patches the tf backend in this worker process) ----------------------------


def _engine():
    from dualtrain.backends.tf import engine  # lazy: framework

    return engine.TFEngine


def _change_optimizer(**change) -> None:
    """Build the engine from a spec whose optimizer differs; the TrainLoop keeps the real spec, so
    the records (and the lr it hands in) are unchanged."""
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
    import tensorflow as tf  # lazy: framework

    cls = _engine()

    def apply_one(self, p, g, apply, lr, k):
        # Keras SGD: v = momentum * v - lr * g; p += v (the old lrs stay baked into v).
        v = self.optimizer.slots["momentum_buffer"][k]
        new_v = v * self.opt.momentum - tf.cast(lr, p.dtype) * g
        return tf.group(v.assign(new_v), p.assign_add(new_v))

    cls._apply_one = apply_one


def _mean_of_means(size: float) -> None:
    import tensorflow as tf  # lazy: framework

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
    import tensorflow as tf  # lazy: framework

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
    cls = _engine()
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


def _same_padding_asym(size: float) -> None:
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


def _keras_bn_variance(size: float) -> None:
    stats = batchnorm.batch_stats

    def mutated(ops, x, sync):
        mean, var, _ = stats(ops, x, sync)
        return mean, var, var

    batchnorm.batch_stats = mutated


def _keras_bn_replica_stats(size: float) -> None:
    cls = _engine()

    def mutated(self, ctx, stats):
        # no broadcast: each replica's running statistics follow its own batches; the exported
        # weights (the chief's copy) stay replica 0's, only worker 1's evaluation differs (spec
        # bn_mw)
        values = [r.read_value() for r in self.running]
        for micro in stats:  # one list per micro-batch (train.accumulate)
            values = [
                batchnorm.update_running(v, stat, self._norms[k // 2][0])
                for k, (v, stat) in enumerate(zip(values, micro, strict=True))
            ]
        return values

    cls._running_updates = mutated


def _mse_half(size: float) -> None:
    import tensorflow as tf  # lazy: framework

    cls = _engine()
    loss_sum = cls._loss_sum

    def mutated(self, logits, y):
        return loss_sum(self, logits, y) * tf.constant(0.5, self.dtype)

    cls._loss_sum = mutated


def _bce_label_smoothing(size: float) -> None:
    cls = _engine()
    loss_sum = cls._loss_sum

    def mutated(self, logits, y):
        return loss_sum(self, logits, y * (1.0 - size) + size / 2)

    cls._loss_sum = mutated


def _validation_tail(size: float) -> None:
    cls = _engine()
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


# ---- the precision-path mutants (each patches one backend, active only in its precision path) ----


def _active(spec, path: str) -> bool:
    return spec.precision.dtype.value == path


def _torch_engine():
    from dualtrain.backends.torch import engine  # lazy: framework

    return engine


def _torch_unscale_factor(path: str, size: float) -> None:
    cls = _torch_engine().TorchEngine
    unscale = cls._unscale

    def mutated(self):
        unscale(self)
        if _active(self.spec, path):
            for p in self.params:
                if p.grad is not None:
                    p.grad.div_(1.0 + size)

    cls._unscale = mutated


def _tf_unscale_factor(path: str, size: float) -> None:
    cls = _engine()
    unscale = cls._unscale

    def mutated(self, grads, scale):
        grads = unscale(self, grads, scale)
        if _active(self.spec, path):
            grads = [g / (1.0 + size) for g in grads]
        return grads

    cls._unscale = mutated


def ce_low_sum(per_sample: np.ndarray) -> float:
    """The ce_low_precision mutant's batch sum, stated once in NumPy (both backends' mutants
    compute exactly this; tests/backends/torch/test_torch_kernels.py and
    tests/integration/test_tf_kernels.py hold them to it): each float32 per-sample loss rounded to
    bfloat16 (to nearest), then summed in sample order with a rounding to bfloat16 after every
    addition. Its error depends on the values only, not on which kernels
    the CPU runs."""
    total = np.float32(0.0)
    for v in round_to(np.asarray(per_sample, np.float32), "bf16"):
        total = round_to(np.array([total + v], np.float32), "bf16")[0]
    return float(total)


def _torch_ce_low_precision(path: str, size: float) -> None:
    import torch  # lazy: framework
    import torch.nn.functional as F  # lazy: framework

    cls = _torch_engine().TorchEngine
    loss_sum = cls._loss_sum

    def mutated(self, logits, y):
        if not _active(self.spec, path):
            return loss_sum(self, logits, y)
        # ce_low_sum's arithmetic (each per-sample loss rounded to bfloat16, summed in sample
        # order, rounded to bfloat16 after every addition)
        per = F.cross_entropy(logits.to(self.dtype), y, reduction="none").to(torch.bfloat16)
        total = torch.zeros((), dtype=torch.bfloat16, device=per.device)
        for v in per:
            total = total + v
        return total.to(self.dtype)

    cls._loss_sum = mutated


def _tf_ce_low_precision(path: str, size: float) -> None:
    import tensorflow as tf  # lazy: framework

    cls = _engine()
    loss_sum = cls._loss_sum

    def mutated(self, logits, y):
        if not _active(self.spec, path):
            return loss_sum(self, logits, y)
        # ce_low_sum's arithmetic, as on torch
        out = tf.cast(logits, self.dtype)
        per = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=out)
        total = tf.foldl(
            lambda acc, v: acc + v,
            tf.cast(per, tf.bfloat16),
            initializer=tf.zeros((), tf.bfloat16),
        )
        return tf.cast(total, self.dtype)

    cls._loss_sum = mutated


def _torch_allreduce_low(path: str, size: float) -> None:
    import torch  # lazy: framework
    import torch.distributed as dist  # lazy: framework

    engine = _torch_engine()
    init = engine.TorchEngine.__init__
    active = {"on": False}

    def hook(state, bucket):
        if not active["on"]:
            return engine_hook(state, bucket)
        buf = bucket.buffer()
        low = buf.to(torch.float16)
        fut = dist.all_reduce(low, async_op=True).get_future()

        def back(fut):
            buf.copy_(fut.value()[0])
            return buf

        return fut.then(back)

    engine_hook = engine.sum_hook

    def mutated_init(self, spec, *args, **kwargs):
        active["on"] = _active(spec, path)
        init(self, spec, *args, **kwargs)

    engine.sum_hook = hook
    engine.TorchEngine.__init__ = mutated_init


def _tf_allreduce_low(path: str, size: float) -> None:
    import tensorflow as tf  # lazy: framework

    cls = _engine()
    step = cls._replica_step

    def mutated_step(self, *args):
        ctx_cls = type(tf.distribute.get_replica_context())
        if _active(self.spec, path) and not getattr(ctx_cls, "_dualtrain_low", False):
            all_reduce = ctx_cls.all_reduce
            n_params = len(self.params)

            def low(ctx, op, value, options=None):
                if isinstance(value, list) and len(value) == n_params:  # the gradient all-reduce
                    out = all_reduce(ctx, op, [tf.cast(g, tf.float16) for g in value], options)
                    return [tf.cast(g, v.dtype) for g, v in zip(out, value, strict=True)]
                return all_reduce(ctx, op, value, options)

            ctx_cls.all_reduce = low
            ctx_cls._dualtrain_low = True
        return step(self, *args)

    cls._replica_step = mutated_step


def _torch_optimizer_state_low(path: str, size: float) -> None:
    import torch  # lazy: framework

    cls = _torch_engine().TorchEngine
    step = cls.train_step

    def mutated(self, *args, **kwargs):
        if _active(
            self.spec, path
        ):  # the state is held in bfloat16: torch.optim updates it in place
            for state in self.opt.state.values():
                if torch.is_tensor(state.get("momentum_buffer")):
                    state["momentum_buffer"] = state["momentum_buffer"].to(torch.bfloat16)
        return step(self, *args, **kwargs)

    cls.train_step = mutated


def _tf_optimizer_state_low(path: str, size: float) -> None:
    import tensorflow as tf  # lazy: framework

    cls = _engine()
    apply_one = cls._apply_one

    def mutated(self, p, g, apply, lr, k):
        if not (
            _active(self.spec, path)
            and self.opt.momentum
            and self.optimizer.slots["momentum_buffer"]
        ):
            return apply_one(self, p, g, apply, lr, k)
        buf = self.optimizer.slots["momentum_buffer"][k]
        first = tf.equal(self.applied, 0)
        new_buf = tf.where(first, g, buf * self.opt.momentum + g)
        new_buf = tf.cast(tf.cast(new_buf, tf.bfloat16), new_buf.dtype)  # stored in bfloat16
        return tf.group(buf.assign(new_buf), p.assign(self.ops.fma(p, -lr, new_buf)))

    cls._apply_one = mutated


def _torch_fp32_update_branch(path: str, size: float) -> None:
    cls = _torch_engine().TorchEngine
    step = cls.train_step

    def mutated(self, ids, *, lr, **kwargs):
        if _active(self.spec, path):  # torch.optim on float32 parameters: lr off by (1 + size)
            lr = lr * (1.0 + size)
        return step(self, ids, lr=lr, **kwargs)

    cls.train_step = mutated


def _tf_fp32_update_branch(path: str, size: float) -> None:
    import tensorflow as tf  # lazy: framework

    cls = _engine()
    init = cls.__init__

    def mutated_init(self, spec, *args, **kwargs):
        if _active(spec, path):  # the engine's namespace, before __init__ traces the step
            fma = cls.ops.fma

            def mutated(a, alpha, b):
                if a.dtype == tf.float64:
                    return fma(a, alpha, b)
                return fma(a, alpha * (1.0 + size), b)  # the float32 branch only

            self.ops = dataclasses.replace(cls.ops, fma=mutated)
        init(self, spec, *args, **kwargs)

    cls.__init__ = mutated_init


# ---- the token layers' precision-path mutants (TOKEN_PRECISION_MUTANTS) --------------------------


def bf16_row_sum(rows: np.ndarray) -> np.ndarray:
    """The token mutants' reduction, stated once in NumPy (both backends' mutants compute exactly
    this): ``rows`` (R, K) of float32 terms, each rounded to bfloat16 (to nearest), summed in row
    order with a rounding to bfloat16 after every addition; (K,). Its error depends on the values
    only, not on which kernels the CPU runs."""
    total = np.zeros(rows.shape[-1], np.float32)
    for r in round_to(np.asarray(rows, np.float32), "bf16"):
        total = round_to(total + r, "bf16")
    return total


def _torch_low():
    """(low_sum, low_add) in torch: bf16_row_sum's arithmetic, and ``x + p`` (p broadcast over
    x's leading axes) whose gradient for p is that sum over the leading axes."""
    import torch  # lazy: framework

    def low_sum(rows):
        total = torch.zeros(rows.shape[-1], dtype=torch.bfloat16, device=rows.device)
        for r in rows.to(torch.bfloat16):
            total = total + r
        return total

    class LowAdd(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, p):
            ctx.shape, ctx.dtype = p.shape, p.dtype
            return x + p

        @staticmethod
        def backward(ctx, g):
            rows = g.reshape(-1, int(np.prod(ctx.shape)))
            return g, low_sum(rows).to(ctx.dtype).reshape(ctx.shape)

    return low_sum, LowAdd.apply


def _tf_low():
    """(low_sum, low_add) in TensorFlow, the same arithmetic as :func:`_torch_low`'s."""
    import tensorflow as tf  # lazy: framework

    def low_sum(rows):
        return tf.foldl(
            lambda acc, r: acc + r,
            tf.cast(rows, tf.bfloat16),
            initializer=tf.zeros([rows.shape[-1]], tf.bfloat16),
        )

    @tf.custom_gradient
    def low_add(x, p):
        def grad(g):
            rows = tf.reshape(g, [-1, int(np.prod(p.shape))])
            return g, tf.reshape(tf.cast(low_sum(rows), p.dtype), p.shape)

        return x + p, grad

    return low_sum, low_add


def _on_init(cls, path: str, patch) -> None:
    """Run ``patch()`` when an engine of ``cls`` is made for a run of precision ``path``, before it
    builds its model (and, on TF, traces its step)."""
    init = cls.__init__

    def mutated_init(self, spec, *args, **kwargs):
        if _active(spec, path):
            patch()
        init(self, spec, *args, **kwargs)

    cls.__init__ = mutated_init


def _torch_layernorm_grad_low(path: str, size: float) -> None:
    import torch  # lazy: framework
    import torch.nn.functional as F  # lazy: framework
    from torch import nn  # lazy: framework

    low_sum, _ = _torch_low()

    class Affine(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x_hat, gamma, beta):
            ctx.save_for_backward(x_hat, gamma)
            return x_hat * gamma + beta

        @staticmethod
        def backward(ctx, g):
            x_hat, gamma = ctx.saved_tensors
            d = g.shape[-1]
            dgamma = low_sum((x_hat * g).reshape(-1, d)).to(gamma.dtype)
            return g * gamma, dgamma, low_sum(g.reshape(-1, d)).to(gamma.dtype)

    forward = nn.LayerNorm.forward

    def mutated(self, x):
        if self.weight is None or self.bias is None:
            return forward(self, x)
        x_hat = F.layer_norm(x, self.normalized_shape, None, None, self.eps)
        return Affine.apply(x_hat, self.weight, self.bias)

    _on_init(_torch_engine().TorchEngine, path, lambda: setattr(nn.LayerNorm, "forward", mutated))


def _tf_layernorm_grad_low(path: str, size: float) -> None:
    import keras  # lazy: framework
    import tensorflow as tf  # lazy: framework

    low_sum, _ = _tf_low()

    def mutated(self, inputs):
        x = tf.cast(inputs, self.dtype)  # the variable dtype: float32 in an fp32 run
        x_hat = keras.ops.layer_normalization(x, None, None, self.axis, self.epsilon)

        @tf.custom_gradient
        def affine(x_hat, gamma, beta):
            def grad(g):
                d = g.shape[-1]
                dgamma = tf.cast(low_sum(tf.reshape(x_hat * g, [-1, d])), gamma.dtype)
                return g * gamma, dgamma, tf.cast(low_sum(tf.reshape(g, [-1, d])), beta.dtype)

            return x_hat * gamma + beta, grad

        out = affine(x_hat, tf.convert_to_tensor(self.gamma), tf.convert_to_tensor(self.beta))
        return tf.cast(out, self.compute_dtype)

    cls = keras.layers.LayerNormalization
    _on_init(_engine(), path, lambda: setattr(cls, "call", mutated))


def _torch_position_grad_low(path: str, size: float) -> None:
    from dualtrain.backends.torch import tokens  # lazy: framework

    _, low_add = _torch_low()

    def mutated(self, x):
        return low_add(x, self.weight)

    _on_init(
        _torch_engine().TorchEngine, path, lambda: setattr(tokens.Position, "forward", mutated)
    )


def _tf_position_grad_low(path: str, size: float) -> None:
    import tensorflow as tf  # lazy: framework

    from dualtrain.backends.tf import tokens  # lazy: framework

    _, low_add = _tf_low()

    def mutated(self, x):
        return low_add(x, tf.cast(self.weight, x.dtype))

    _on_init(_engine(), path, lambda: setattr(tokens.Position, "call", mutated))


def _torch_patches_bias_grad_low(path: str, size: float) -> None:
    import torch.nn.functional as F  # lazy: framework

    from dualtrain.backends.torch import tokens  # lazy: framework

    _, low_add = _torch_low()
    forward = tokens.Patches.forward

    def mutated(self, x):  # tokens.Patches.forward, its bias added by low_add
        if self.bias is None:
            return forward(self, x)
        out = F.conv2d(x, self.weight, None, self.stride, self.padding, self.dilation, self.groups)
        return low_add(out.flatten(2).transpose(1, 2), self.bias)

    cls = tokens.Patches
    _on_init(_torch_engine().TorchEngine, path, lambda: setattr(cls, "forward", mutated))


def _tf_patches_bias_grad_low(path: str, size: float) -> None:
    import tensorflow as tf  # lazy: framework

    from dualtrain.backends.tf import layers  # lazy: framework

    _, low_add = _tf_low()

    def mutated(self, inputs):  # layers.Conv2D.call, its bias added by low_add (NHWC rows: the
        out = self.convolution_op(inputs, self.kernel)  # order of torch's tokens)
        return low_add(out, tf.cast(self.bias, out.dtype)) if self.use_bias else out

    _on_init(_engine(), path, lambda: setattr(layers.Conv2D, "call", mutated))


def _torch_attention_bias_grad_low(path: str, size: float) -> None:
    import torch  # lazy: framework
    import torch.nn.functional as F  # lazy: framework

    from dualtrain.backends.torch import tokens  # lazy: framework

    _, low_add = _torch_low()

    def mutated(self, x):  # tokens.SelfAttention.forward, its bias added by low_add
        n, t, d = x.shape
        h, b = self.heads, self.in_proj_bias
        qkv = F.linear(x, self.in_proj_weight)
        if b is not None:
            qkv = low_add(qkv, torch.cat([b[:d], b.new_zeros(d), b[2 * d :]]))
        if self.tap is not None:
            self.tap(x, qkv)
        q, k, v = (a.reshape(n, t, h, d // h).transpose(1, 2) for a in qkv.split(d, dim=-1))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        if self.causal:
            scores = scores.masked_fill(tokens.causal_mask(t, x.device), float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
        return self.out_proj(out.transpose(1, 2).reshape(n, t, d))

    cls = tokens.SelfAttention
    _on_init(_torch_engine().TorchEngine, path, lambda: setattr(cls, "forward", mutated))


def _tf_attention_bias_grad_low(path: str, size: float) -> None:
    import tensorflow as tf  # lazy: framework

    from dualtrain.backends.tf import tokens  # lazy: framework
    from dualtrain.backends.tf.layers import scaled  # lazy: framework

    _, low_add = _tf_low()

    def mutated(self, x):  # tokens.SelfAttention.call, its bias added by low_add
        c = x.dtype
        n, t = tf.shape(x)[0], tf.shape(x)[1]
        d, h = self.dim, self.heads
        qkv = tf.matmul(x, tf.cast(self.in_proj_weight, c), transpose_b=True)
        if self.in_proj_bias is not None:
            b = self.in_proj_bias
            qkv = low_add(
                qkv, tf.cast(tf.concat([b[:d], tf.zeros([d], b.dtype), b[2 * d :]], 0), c)
            )
        q, k, v = (self.split_heads(a, n, t, h, d // h) for a in tf.split(qkv, 3, axis=-1))
        scores = scaled(tf.matmul(q, k, transpose_b=True), 1.0 / math.sqrt(d // h))
        if self.causal:
            later = tf.logical_not(tf.cast(tf.linalg.band_part(tf.ones([t, t]), -1, 0), tf.bool))
            scores = tf.where(later, tf.constant(-np.inf, c), scores)
        p = tf.cast(tf.nn.softmax(tf.cast(scores, tf.float32 if c != tf.float64 else c), -1), c)
        out = tf.reshape(tf.transpose(tf.matmul(p, v), [0, 2, 1, 3]), [n, t, d])
        out = tf.matmul(out, tf.cast(self.out_kernel, c))
        return out if self.out_bias is None else out + tf.cast(self.out_bias, c)

    cls = tokens.SelfAttention
    _on_init(_engine(), path, lambda: setattr(cls, "call", mutated))


# ---- mutants on either backend (BACKEND_MUTANTS) ------------------------------------------------


def _tf_pair_bn_own_stats() -> None:
    cls = _engine()
    updates = cls._running_updates

    def mutated(self, ctx, stats):
        if self.layout is None:
            return updates(self, ctx, stats)
        return [r.read_value() for r in self.running]  # as the forward left them: no broadcast

    cls._running_updates = mutated


def _torch_pair_bn_own_stats() -> None:
    cls = _torch_engine().TorchEngine
    init = cls.__init__

    def mutated(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if self._pair:  # a pair's broadcast holds its own batchnorm layers' statistics only
            self._broadcast = []

    cls.__init__ = mutated


def _tf_accumulate_micro_mean() -> None:
    import tensorflow as tf  # lazy: framework

    cls = _engine()
    micro_step = cls._micro_step

    def mutated(self, ids, x, y, global_count, step, scale, **kw):
        count = tf.cast(tf.maximum(tf.size(ids), 1), tf.float32)
        per = count * self.accumulate * self.strategy.num_replicas_in_sync
        return micro_step(self, ids, x, y, per, step, scale, **kw)

    cls._micro_step = mutated


def _torch_accumulate_micro_mean() -> None:
    cls = _torch_engine().TorchEngine
    micro_step = cls._micro_step

    def mutated(self, ids, step, global_count, measure_scale, **kw):
        per = max(len(ids), 1) * self.accumulate * self.world
        return micro_step(self, ids, step, per, measure_scale, **kw)

    cls._micro_step = mutated


def _torch_ps_mean_of_means() -> None:
    cls = _torch_engine().TorchEngine
    micro_step = cls._micro_step

    def mutated(self, ids, step, global_count, measure_scale, **kw):
        if self.server:  # a parameter-server replica only: the all-reduce path is untouched
            global_count = max(len(ids), 1) * self.world
        return micro_step(self, ids, step, global_count, measure_scale, **kw)

    cls._micro_step = mutated


def _tf_ps_mean_of_means() -> None:
    import tensorflow as tf  # lazy: framework

    from dualtrain.backends.tf import ps  # lazy: framework

    cls = ps.PSEngine
    micro_step = cls._micro_step

    def mutated(self, ids, x, y, global_count, step, scale, **kw):
        own = tf.cast(tf.maximum(tf.size(ids), 1) * self.n_local, tf.float32)
        return micro_step(self, ids, x, y, own, step, scale, **kw)

    cls._micro_step = mutated


def _early_stop_late() -> None:
    update = stopping.Stopper.update

    def mutated(self, value, step):
        improved, stop = update(self, value, step)
        stop = self.patience is not None and self.wait > self.patience
        self.stopped_at = step if stop else None
        return improved, stop

    stopping.Stopper.update = mutated


_tf_early_stop_late = _torch_early_stop_late = _early_stop_late


def _tf_ema_decay_swapped() -> None:
    cls = _engine()
    ema = cls.ema

    def mutated(self, action, decay):
        return ema(self, action, 1.0 - decay)

    cls.ema = mutated


def _torch_ema_decay_swapped() -> None:
    cls = _torch_engine().TorchEngine
    ema = cls.ema

    def mutated(self, action, decay):
        return ema(self, action, 1.0 - decay)

    cls.ema = mutated

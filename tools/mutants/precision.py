"""The precision-path mutants (:data:`PRECISION_MUTANTS`, either backend): each is active only in
runs of its precision path, so the fp64 pair cannot see it; the one-step probes must."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from dualtrain.core.kernels import round_to
from tools.mutants.patching import (
    active,
    tf_engine,
    tf_forward,
    tf_step,
    tf_update,
    torch_engine,
    torch_forward,
    torch_update,
)


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


# ---- the precision-path mutants (each patches one backend, active only in its precision path) ----


def torch_unscale_factor(path: str, size: float) -> None:
    cls = torch_update()
    unscale = cls.unscale

    def mutated(self):
        unscale(self)
        if active(self.state.spec, path):
            for p in self.state.params:
                if p.grad is not None:
                    p.grad.div_(1.0 + size)

    cls.unscale = mutated


def tf_unscale_factor(path: str, size: float) -> None:
    cls = tf_update()
    unscale = cls.unscale

    def mutated(self, grads, scale):
        grads = unscale(self, grads, scale)
        if active(self.state.spec, path):
            grads = [g / (1.0 + size) for g in grads]
        return grads

    cls.unscale = mutated


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


def torch_ce_low_precision(path: str, size: float) -> None:
    import torch  # lazy: framework
    import torch.nn.functional as F  # lazy: framework

    cls = torch_forward()
    loss_sum = cls.loss_sum

    def mutated(self, logits, y):
        if not active(self.state.spec, path):
            return loss_sum(self, logits, y)
        # ce_low_sum's arithmetic (each per-sample loss rounded to bfloat16, summed in sample
        # order, rounded to bfloat16 after every addition)
        dtype = self.state.dtype
        per = F.cross_entropy(logits.to(dtype), y, reduction="none").to(torch.bfloat16)
        total = torch.zeros((), dtype=torch.bfloat16, device=per.device)
        for v in per:
            total = total + v
        return total.to(dtype)

    cls.loss_sum = mutated


def tf_ce_low_precision(path: str, size: float) -> None:
    import tensorflow as tf  # lazy: framework

    cls = tf_forward()
    loss_sum = cls.loss_sum

    def mutated(self, logits, y):
        if not active(self.state.spec, path):
            return loss_sum(self, logits, y)
        # ce_low_sum's arithmetic, as on torch
        out = tf.cast(logits, self.state.dtype)
        per = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=out)
        total = tf.foldl(
            lambda acc, v: acc + v,
            tf.cast(per, tf.bfloat16),
            initializer=tf.zeros((), tf.bfloat16),
        )
        return tf.cast(total, self.state.dtype)

    cls.loss_sum = mutated


def torch_allreduce_low(path: str, size: float) -> None:
    import torch  # lazy: framework
    import torch.distributed as dist  # lazy: framework

    engine = torch_engine()
    init = engine.TorchEngine.__init__
    on = {"path": False}  # this engine's run is in the mutant's precision path

    def hook(state, bucket):
        if not on["path"]:
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
        on["path"] = active(spec, path)
        init(self, spec, *args, **kwargs)

    engine.sum_hook = hook
    engine.TorchEngine.__init__ = mutated_init


def tf_allreduce_low(path: str, size: float) -> None:
    import tensorflow as tf  # lazy: framework

    cls = tf_step()
    step = cls.replica_step

    def mutated_step(self, *args):
        ctx_cls = type(tf.distribute.get_replica_context())
        if active(self.state.spec, path) and not getattr(ctx_cls, "_dualtrain_low", False):
            all_reduce = ctx_cls.all_reduce
            n_params = len(self.state.params)

            def low(ctx, op, value, options=None):
                if isinstance(value, list) and len(value) == n_params:  # the gradient all-reduce
                    out = all_reduce(ctx, op, [tf.cast(g, tf.float16) for g in value], options)
                    return [tf.cast(g, v.dtype) for g, v in zip(out, value, strict=True)]
                return all_reduce(ctx, op, value, options)

            ctx_cls.all_reduce = low
            ctx_cls._dualtrain_low = True
        return step(self, *args)

    cls.replica_step = mutated_step


def torch_optimizer_state_low(path: str, size: float) -> None:
    import torch  # lazy: framework

    cls = torch_engine().TorchEngine
    step = cls.train_step

    def mutated(self, *args, **kwargs):
        if active(
            self.spec, path
        ):  # the state is held in bfloat16: torch.optim updates it in place
            for state in self.state.opt.state.values():
                if torch.is_tensor(state.get("momentum_buffer")):
                    state["momentum_buffer"] = state["momentum_buffer"].to(torch.bfloat16)
        return step(self, *args, **kwargs)

    cls.train_step = mutated


def tf_optimizer_state_low(path: str, size: float) -> None:
    import tensorflow as tf  # lazy: framework

    cls = tf_update()
    apply_one = cls.apply_one

    def mutated(self, p, g, apply, lr, k):
        st = self.state
        if not (
            active(st.spec, path) and st.opt.momentum and st.optimizer.slots["momentum_buffer"]
        ):
            return apply_one(self, p, g, apply, lr, k)
        buf = st.optimizer.slots["momentum_buffer"][k]
        first = tf.equal(st.applied, 0)
        new_buf = tf.where(first, g, buf * st.opt.momentum + g)
        new_buf = tf.cast(tf.cast(new_buf, tf.bfloat16), new_buf.dtype)  # stored in bfloat16
        return tf.group(buf.assign(new_buf), p.assign(st.ops.fma(p, -lr, new_buf)))

    cls.apply_one = mutated


def torch_fp32_update_branch(path: str, size: float) -> None:
    cls = torch_engine().TorchEngine
    step = cls.train_step

    def mutated(self, ids, *, lr, **kwargs):
        if active(self.spec, path):  # torch.optim on float32 parameters: lr off by (1 + size)
            lr = lr * (1.0 + size)
        return step(self, ids, lr=lr, **kwargs)

    cls.train_step = mutated


def tf_fp32_update_branch(path: str, size: float) -> None:
    import tensorflow as tf  # lazy: framework

    cls = tf_engine()
    init = cls.__init__

    def mutated_init(self, spec, *args, **kwargs):
        if active(spec, path):  # the engine's namespace, before __init__ traces the step
            fma = cls.ops.fma

            def mutated(a, alpha, b):
                if a.dtype == tf.float64:
                    return fma(a, alpha, b)
                return fma(a, alpha * (1.0 + size), b)  # the float32 branch only

            self.ops = dataclasses.replace(cls.ops, fma=mutated)
        init(self, spec, *args, **kwargs)

    cls.__init__ = mutated_init

"""How each script reduces and reports its loss, read from step 1 of two runs that start from the
same weights: a sum against a mean (the local batch's ratio; Keras reports a sum over the global
batch), gradients summed over the replicas instead of averaged, and a loss recorded scaled (one
micro-batch's ``loss / accum``, a custom train_step's loss divided by the replicas, a DDP loop's
loss all-reduced and not divided); an optimizer stepping with no gradient at all (``zero_grad``
between ``backward`` and ``step``)."""

from __future__ import annotations

import numpy as np

from dualtrain.audit import penalties as P
from dualtrain.audit.clipping import clips
from dualtrain.audit.finding import fix
from dualtrain.audit.pairing import paired_weights
from dualtrain.audit.read import Recorded
from dualtrain.audit.replicas import out_of_step
from dualtrain.records.verdict import Finding


def same_weights(a: Recorded, b: Recorded) -> bool:
    """Both runs start from the same initial weights, bit for bit: their step-1 gradients are
    comparable (from other weights a gradient's ratio says nothing of the reduction)."""
    pairs = paired_weights(a, b)
    return not isinstance(pairs, str) and all(np.array_equal(p.va, p.vb) for p in pairs)


def reduction(a: Recorded, b: Recorded) -> list[Finding]:
    """A sum-reduced loss is ~ the local batch times a mean one; a gradient summed over the
    replicas instead of averaged is ~ the world size times larger (at step 1, same weights)."""
    if not a.steps or not b.steps:
        return []
    (sa, sb), out = (a.steps[0], b.steps[0]), []
    ratio = sa.loss / sb.loss if sb.loss else 0.0
    local = sa.samples / max(a.world_size, 1)
    for r, tag, run, other in ((ratio, "A", a, "B"), (1 / ratio if ratio else 0, "B", b, "A")):
        # a Keras sum-reduced loss is reported over the global batch (the replicas' sums)
        rows = float(sa.samples) if run.framework == "tf" and run.world_size > 1 else local
        if rows > 2 and abs(r / rows - 1) < 0.25:
            change = (
                "reduction='mean' (the local batch's mean; DDP averages the replicas)"
                if run.framework == "torch"
                else "reduction='sum_over_batch_size'"
            )
            out.append(
                Finding(
                    "per-replica loss reduction (sum vs mean)",
                    f"step 1: {tag}'s loss is {r:.1f}x {other}'s, about the "
                    f"{'global' if rows != local else 'local'} batch ({rows:g} rows): {tag} sums "
                    f"its rows' losses where {other} averages",
                    [fix(run, tag, ("reduction=", "reduction", "loss"), change)],
                    step=1,
                )
            )
    ga, gb = float(sa.grad_norm or 0), float(sb.grad_norm or 0)
    # a clipped gradient's norm says nothing of the reduction (clipping is named on its own)
    same_start = same_weights(a, b) and not out
    same_start = same_start and not clips(a) and not clips(b)
    # replicas out of step: their gradient norms are no one model's (replicas_apart names it)
    same_start = same_start and not out_of_step(a) and not out_of_step(b)
    world = a.world_size
    if same_start and ga and gb and world > 1 and abs(ratio - 1) < 0.1:
        for r, tag in ((ga / gb, "A"), (gb / ga, "B")):
            if abs(r / world - 1) < 0.15:
                out.append(
                    Finding(
                        "per-replica loss reduction (local mean vs global batch)",
                        f"step 1: the same loss but {tag}'s gradient is {r:.2f}x the other's, "
                        f"about "
                        f"the {world} replicas: {tag} sums the replicas' local-mean gradients "
                        f"instead of averaging them (divide each replica's loss by the replicas)",
                        [_summed_fix(a if tag == "A" else b, tag)],
                        step=1,
                    )
                )
    if same_start and ga and gb and world > 1 and not out:
        out += _divided_twice(a, b, ratio, ga / gb)
    return out


def _divided_twice(a: Recorded, b: Recorded, ratio: float, grads: float) -> list[Finding]:
    """Loss and gradient both 1/W of the other run's at step 1: a DDP loop that divides each
    replica's loss by the global batch (its rows times the replicas) while DDP averages the
    replicas' gradients as well: every step at 1/W of the lr."""
    for run, tag, r, g in ((a, "A", ratio, grads), (b, "B", 1 / ratio, 1 / grads)):
        w = run.world_size
        if run.framework != "torch" or w < 2 or abs(r * w - 1) > 0.1 or abs(g * w - 1) > 0.1:
            continue
        return [
            Finding(
                "per-replica loss reduction (divided by the global batch under DDP)",
                f"step 1: {tag}'s loss and gradient are both 1/{1 / r:.2f} of the other's, "
                f"about its {w} replicas: {tag} divides each replica's loss by the global batch "
                f"where DDP already averages the replicas' gradients (each step at 1/{w} of "
                f"the lr)",
                [
                    fix(
                        run,
                        tag,
                        ("reduction=", "/ (", "loss"),
                        "divide by the local batch (reduction='mean'): DDP's average over the "
                        "replicas makes it the global batch's mean",
                    )
                ],
                step=1,
            )
        ]
    return []


def _summed_fix(run: Recorded, tag: str) -> str:
    """Where ``run`` sums the replicas' gradients: a DDP-less loop's all_reduce, else its loss."""
    if run.framework == "torch" and run.config.ddp is False:
        return fix(
            run,
            tag,
            ("all_reduce(", "loss"),
            "divide the all-reduced gradients by the world size (all_reduce sums them)",
        )
    return fix(
        run, tag, ("loss",), "scale each replica's loss by 1/num_replicas (Keras: the global batch)"
    )


def _micro_batches(run: Recorded) -> int:
    """Micro-batches per optimizer step (the torch recorder's ``rec.batch`` calls), when every
    step of replica 0 has the same number; else 1."""
    counts = {
        1 if r.batches is None else r.batches for (_, rep), r in run.replicas.items() if rep == 0
    }
    return counts.pop() if len(counts) == 1 else 1


def reported_loss(a: Recorded, b: Recorded) -> list[Finding]:
    """The same gradient at step 1 but a loss 1/k of the other's: the script reports a scaled
    loss (a micro-batch's ``loss / accum``; a custom train_step's ``compute_loss``, divided by
    the replicas for the all-reduce), so the trajectories part while the training does not."""
    if not a.steps or not b.steps or not same_weights(a, b):
        return []
    (sa, sb), out = (a.steps[0], b.steps[0]), []
    la, lb = sa.loss, sb.loss
    ga, gb = float(sa.grad_norm or 0), float(sb.grad_norm or 0)
    if not (la > 0 and lb > 0 and ga > 0 and gb > 0) or abs(ga / gb - 1) > 0.05:
        return []
    for run, tag, ratio in ((a, "A", lb / la), (b, "B", la / lb)):
        micro = _micro_batches(run)
        if run.framework == "torch" and micro > 1 and abs(ratio / micro - 1) < 0.15:
            out.append(
                Finding(
                    "loss of one micro-batch recorded (gradient accumulation)",
                    f"step 1: the same gradient, but {tag}'s loss is 1/{ratio:.2f} of the "
                    f"other's, about its {micro} micro-batches per step: {tag} records one "
                    f"micro-batch's `loss / {micro}`",
                    [
                        fix(
                            run,
                            tag,
                            ("rec.step(",),
                            "rec.step(the sum of the step's "
                            f"micro-batch losses `loss / {micro}`: the step's mean)",
                        )
                    ],
                    step=1,
                )
            )
        elif (
            run.framework == "torch"
            and run.world_size > 1
            and abs(ratio * run.world_size - 1) < 0.15
        ):
            out.append(
                Finding(
                    "loss recorded summed over the replicas",
                    f"step 1: the same gradient, but {tag}'s loss is {1 / ratio:.2f}x the "
                    f"other's, about its {run.world_size} replicas: {tag} records a loss "
                    f"all-reduced (summed) over the replicas and not divided by them",
                    [
                        fix(
                            run,
                            tag,
                            ("all_reduce(", "rec.step("),
                            "rec.step(this replica's own loss), or divide the all-reduced loss "
                            "by the world size",
                        )
                    ],
                    step=1,
                )
            )
        elif (
            run.framework == "tf" and run.world_size > 1 and abs(ratio / run.world_size - 1) < 0.15
        ):
            out.append(
                Finding(
                    "loss reported divided by the replicas (a custom train_step)",
                    f"step 1: the same gradient, but {tag}'s loss is 1/{ratio:.2f} of the "
                    f"other's, about its {run.world_size} replicas: its train_step feeds the "
                    f"loss tracker `compute_loss`'s value, which Keras divides by the replicas "
                    f"for the all-reduce",
                    [
                        fix(
                            run,
                            tag,
                            ("update_state(loss", "update_state("),
                            "update the "
                            "tracker with `loss * self.distribute_strategy.num_replicas_in_sync`",
                        )
                    ],
                    step=1,
                )
            )
    return out


#: two frameworks' float32 forward passes of the same weights on the same rows give losses this
#: close: measured 2.1e-7 relative at most (python -m tools.loss_gap: torch against Keras, MLPs
#: of width 128 and 1024, batches of 64 and 512 MNIST rows; 1.9e-7 under the avx2 kernel
#: setting), so 1e-4 leaves 500x; further apart, the loss itself differs. Judged in float32 and
#: float64 only (a float16 or bfloat16 forward rounds far more)
LOSS_AGREES = 1e-4
EXACT_ENOUGH = ("float32", "float64")

#: the lines that make a script's loss
LOSS_LINES = ("loss=", "compile(", "CrossEntropyLoss(", "cross_entropy(", "loss_fn", "criterion")


def computed_loss(a: Recorded, b: Recorded) -> list[Finding]:
    """Step 1 from the same weights on the same rows (every replica's, exact digests), neither
    model drawing random numbers (dropout), both computing in float32 or float64, yet another
    loss: the scripts compute the loss otherwise (a regularizer or add_loss, label smoothing,
    class or sample weights, another function). Named where the reduction and the reported-loss
    findings do not explain it."""
    if not a.steps or not b.steps or not same_weights(a, b):
        return []
    rows = a.global_rows(1, "exact")
    if not rows or rows != b.global_rows(1, "exact"):
        return []
    if a.config.random_layers != () or b.config.random_layers != ():
        return []  # random masks of their own (or not recorded): the losses may differ
    if any(r.config.precision.compute_dtype not in EXACT_ENOUGH for r in (a, b)):
        return []  # a half-precision forward: its rounding alone parts the losses
    la, lb = a.steps[0].loss, b.steps[0].loss
    if not (np.isfinite(la) and np.isfinite(lb)):
        return []
    if abs(la - lb) <= LOSS_AGREES * max(abs(la), abs(lb)) or reduction(a, b):
        return []
    if reported_loss(a, b):
        return []
    change = (
        "the loss the other script computes: the same function and reduction, the same "
        "regularizers (Keras adds kernel_regularizer and add_loss terms to the loss it reports and "
        "differentiates), label smoothing, and class or sample weights"
    )
    terms = [(tag, P.said(run)) for tag, run in (("A", a), ("B", b)) if P.said(run)]
    keras = next((r for r in (a, b) if r.framework == "tf" and P.said(r)), None)
    fixes = [fix(a, "A", LOSS_LINES, change), fix(b, "B", LOSS_LINES, change)]
    if keras is not None:  # what the Keras loss adds, as values on either side
        fixes = [
            fix(run, tag, LOSS_LINES, P.to_match(run, keras) or change)
            for run, tag in ((a, "A"), (b, "B"))
        ]
    return [
        Finding(
            "different loss",
            f"step 1: the same initial weights and the same rows on every replica, and no random "
            f"layer in either model, yet the loss is {la:.6g} in A and {lb:.6g} in B "
            f"({(la - lb) / abs(lb):+.3%}): the scripts compute the loss otherwise"
            + "".join(f"; {tag}'s compiled loss has {t}" for tag, t in terms),
            fixes,
            step=1,
        )
    ]


def _empty(run: Recorded) -> int:
    """Steps taken with no gradient: the torch recorder's norm is None (every ``.grad`` None)
    or 0 at ``optimizer.step()``."""
    return sum(
        1 for s in run.steps if not s.skipped and (s.grad_norm is None or s.grad_norm == 0.0)
    )


def no_gradients(a: Recorded, b: Recorded) -> list[Finding]:
    """A torch run whose optimizer stepped with no gradient at most steps while the other run's
    had them: nothing trained (``zero_grad()`` between ``backward()`` and ``step()``)."""
    out = []
    for run, tag, other in ((a, "A", b), (b, "B", a)):
        n = len(run.steps)
        if run.framework != "torch" or not n or _empty(run) < 0.9 * n or _empty(other) > 0.1 * n:
            continue
        out.append(
            Finding(
                "optimizer steps without gradients",
                f"{tag}'s optimizer stepped with no gradient at {_empty(run)} of its {n} steps "
                f"(every parameter's .grad None or zero at optimizer.step()): its weights did "
                f"not train from the loss",
                [
                    fix(
                        run,
                        tag,
                        ("zero_grad(",),
                        "optimizer.zero_grad() before loss.backward() (it clears what backward "
                        "computed), not between backward() and step()",
                    )
                ],
                step=1,
            )
        )
    return out

"""Whether each run's replicas trained one model: the same parameters at the first step and at the
end (every rank's digests, config.replicas) and the same gradient at every step (each replica's
``grad_norm`` in replicas.jsonl). DDP makes them so: it broadcasts rank 0's weights when it wraps
the model and averages the gradients in backward. A forward through ``ddp_model.module``, a model
never wrapped, gradients averaged by hand on some parameters only, ranks seeded apart without a
broadcast: each leaves the replicas training models of their own, which the chief's record alone
does not show (its loss and weights are one replica's). A Keras model under a tf.distribute
strategy holds one value per variable for every replica (a MirroredVariable), so a Keras record
is in step by construction.
"""

from __future__ import annotations

import math

from dualtrain.audit.config import Replicas
from dualtrain.audit.finding import fix
from dualtrain.audit.read import Recorded
from dualtrain.records.verdict import FAIL, NOT_JUDGED, PASS, Check, Finding, judged_check

#: the relative difference of two replicas' gradient norms that counts: the norms of bit-equal
#: gradients are equal (one kernel, one order, on each rank), so any difference is another
#: gradient; the margin only leaves room for a device whose reduction order varies run to run
NORM_RTOL = 1e-6


def _norms_apart(run: Recorded) -> tuple[int, list[float]] | None:
    """The first step whose replicas stepped with different gradients (or some skipped it), and
    their norms."""
    for s in run.steps:
        rows = run.rows(s.step)
        norms = [r.grad_norm for r in rows if r.grad_norm is not None]
        live = [n for n in norms if not math.isnan(n)]
        if len(norms) < 2 or not live:
            continue
        if len(live) < len(norms) or max(live) - min(live) > NORM_RTOL * max(map(abs, live)):
            return s.step, norms
    return None


def out_of_step(run: Recorded) -> list[tuple[str, int, str]]:
    """(what, step, evidence) for each way ``run``'s replicas left one model (0: before
    training; the last step + 1: at the end)."""
    info = run.config.replicas
    if run.framework != "torch" or run.world_size < 2 or info is None:
        return []
    arrays = info.arrays
    out = []
    for when, what, step in (
        ("init", "start from different weights", 0),
        ("final", "end with different weights", len(run.steps) + 1),
    ):
        ranks, counts = info.apart(when)
        for rank, names in sorted(ranks.items()):
            count = counts.get(rank, len(names))
            out.append(
                (
                    what,
                    step,
                    f"{'at the first step' if step == 0 else 'at the end'}, rank {rank}'s "
                    f"parameters differ from rank 0's in {count} of {arrays} arrays "
                    f"({', '.join(names)})",
                )
            )
            break
    apart = _norms_apart(run)
    if apart is not None:
        step, norms = apart
        shown = ", ".join(f"rank {r}: {n:.6g}" for r, n in enumerate(norms))
        out.append(("step with different gradients", step, f"step {step}'s gradient norms {shown}"))
    return out


def _unjudged(run: Recorded) -> bool:
    """A torch run of several ranks recorded before the replicas' digests were."""
    return run.framework == "torch" and run.world_size > 1 and run.config.replicas is None


def check_replicas(a: Recorded, b: Recorded) -> Check:
    judged = (
        "in each run, every replica's parameters against rank 0's at the first step and at the "
        "end (bit for bit), and every replica's gradient norm at each step; a Keras run's "
        "replicas share each variable (a MirroredVariable) and are in step by construction"
    )
    not_judged = "buffers (BatchNorm's running statistics are each DDP rank's own)"
    failed = [
        f"{tag}'s replicas {what}"
        + ("" if step == 0 or step > len(run.steps) else f" (step {step})")
        for tag, run in (("A", a), ("B", b))
        for what, step, _ in out_of_step(run)
    ]
    if failed:
        return judged_check("replicas in step", FAIL, "; ".join(failed), judged, not_judged)
    old = [tag for tag, run in (("A", a), ("B", b)) if _unjudged(run)]
    if old:
        why = f"{' and '.join(old)}: recorded before the recorder digested every replica's weights"
        return judged_check("replicas in step", NOT_JUDGED, why, judged, not_judged)
    return judged_check(
        "replicas in step", PASS, "each run's replicas trained one model", judged, not_judged
    )


def _fixes(run: Recorded, tag: str, what: str) -> list[str]:
    if what.startswith("start"):
        return [
            fix(
                run,
                tag,
                ("manual_seed", "DistributedDataParallel(", "DDP("),
                "the same seed on every rank before the model is built (DDP also broadcasts "
                "rank 0's weights as it wraps the model; a script averaging gradients by hand "
                "must broadcast them itself)",
            )
        ]
    if run.config.ddp and _unfrozen_later(run):
        return [
            fix(
                run,
                tag,
                ("requires_grad_(False)", "requires_grad = False", "DistributedDataParallel("),
                "make them trainable before DDP wraps the model (keep them out of the optimizer, "
                "or at lr 0, until they train), or wrap the model in DDP again after unfreezing: "
                "DDP's reducer leaves out the parameters frozen as it wraps the model, so each "
                "rank trains them on its own gradients",
            )
        ]
    if run.config.ddp and not run.line_of(".module") and run.line_of("retain_graph"):
        return [
            fix(
                run,
                tag,
                ("retain_graph",),
                "one backward() per forward: DDP all-reduces the gradients of the first; a "
                "second backward (retain_graph=True) adds each rank's own gradients, not "
                "averaged (sum the losses, then one backward)",
            )
        ]
    if run.config.ddp:
        return [
            fix(
                run,
                tag,
                (".module(", ".module", "no_sync"),
                "call the DDP model itself, `model(x)`, not `model.module(x)` (a forward "
                "through .module skips DDP's gradient all-reduce; no_sync only on micro-batches "
                "before the last)",
            )
        ]
    return [
        fix(
            run,
            tag,
            ("all_reduce", "DistributedDataParallel(", "model = "),
            "average every parameter's gradient over the replicas before optimizer.step() "
            "(wrap the model in DistributedDataParallel)",
        )
    ]


def _unfrozen_later(run: Recorded) -> bool:
    """Every parameter that ends apart was frozen (``requires_grad=False``) as the recorder was
    made, so as DDP wrapped the model: unfrozen later, outside DDP's all-reduce."""
    info, frozen = run.config.replicas or Replicas(), run.config.frozen
    apart = {n for names in info.final.values() for n in names}
    return bool(apart) and apart <= set(frozen)


def replicas_apart(a: Recorded, b: Recorded) -> list[Finding]:
    """Each run whose replicas did not train one model, with where it shows first."""
    out = []
    for tag, run in (("A", a), ("B", b)):
        found = out_of_step(run)
        if not found:
            continue
        what, step, evidence = min(found, key=lambda f: f[1])
        out.append(
            Finding(
                f"replicas out of step ({tag}'s replicas {what})",
                "; ".join(e for _, _, e in found)
                + " (the chief's record is one replica's: its loss and weights are not the "
                "others')",
                _fixes(run, tag, what),
                step=step if step <= len(run.steps) else None,
            )
        )
    return out


__all__ = ["check_replicas", "out_of_step", "replicas_apart"]

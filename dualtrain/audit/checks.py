"""The checks that apply to two recorded runs (scripts dualtrain did not drive), each saying what
it judged and what it could not:

* ``steps``: the same optimizer steps per epoch;
* ``samples``: every replica fed the same rows at every step (by content digest);
* ``initial weights``: the same arrays (paired in order, torch's layout) with the same values;
* ``learning rate``: the same lr at every step;
* ``loss scaling``: the same loss scale at every step and the same skipped steps;
* ``settings``: the same optimizer, loss-scale rule, BatchNorm conventions and precision;
* ``loss trajectory``: the loss over windows of steps within the stated bound.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dualtrain.audit.pairing import paired_weights
from dualtrain.audit.read import Recorded
from dualtrain.audit.replicas import check_replicas
from dualtrain.audit.settings import SETTINGS_DIAGNOSES
from dualtrain.audit.trajectory import check_loss, loss_windows
from dualtrain.records.verdict import FAIL, PASS, Check, judged_check

#: the lr's relative tolerance: a float32 lr (Keras keeps it in a float32 variable) is within
#: 2**-24 ~ 6e-8 of torch's float64 one; 1e-6 leaves room for a float32 schedule's arithmetic
LR_RTOL = 1e-6
#: a schedule a framework computes in float32 (Keras's LearningRateSchedules: CosineDecay's
#: ``1 + cos`` near its end, a warmup's ``step / warmup_steps``) errs by a few float32 ulps of
#: the schedule's magnitude, its peak, not of the step's lr: near a cosine's end that is more
#: than LR_RTOL of the small lr. Each of the ~6 float32 operations adds at most half an ulp of
#: its result (all at most the peak): 8 ulps of the peak bound them with room.
LR_F32_ULPS = 8 * 2.0**-24


def lr_close(x: float, y: float, peak: float) -> bool:
    """Two lrs the same within the lr check's tolerance, ``peak`` the larger run's peak lr."""
    return abs(x - y) <= max(LR_RTOL * max(abs(x), abs(y)), LR_F32_ULPS * peak)


def lr_peak(*runs: Recorded) -> float:
    return max((abs(float(x)) for r in runs for x in r.series("lr") if x is not None), default=0)


def check_steps(a: Recorded, b: Recorded) -> Check:
    ea, eb = a.epochs(), b.epochs()
    per_a = {e: len(s) for e, s in ea.items()}
    per_b = {e: len(s) for e, s in eb.items()}
    judged = "the number of optimizer steps in each epoch"
    not_judged = "steps the scripts took outside the recorder (before it started, after close)"
    blind = [t for t, r in (("A", a), ("B", b)) if r.config.epochs == "unknown"]
    if blind:  # a torch recorder given no loader, sampler or epoch=: its epochs are unknown
        why = f"{' and '.join(blind)}'s epochs unknown (no loader, sampler or epoch= recorded)"
        same = len(a.steps) == len(b.steps)
        return judged_check(
            "steps",
            PASS if same else FAIL,
            f"{len(a.steps)} steps in A, {len(b.steps)} in B; {why}",
            "the number of optimizer steps",
            f"the steps per epoch ({why}); {not_judged}",
            first_step=None
            if len(a.steps) == len(b.steps)
            else min(len(a.steps), len(b.steps)) + 1,
        )
    if per_a == per_b:
        return judged_check(
            "steps", PASS, f"{len(a.steps)} steps, {len(ea)} epoch(s) in both", judged, not_judged
        )
    diff = [e for e in sorted(set(per_a) | set(per_b)) if per_a.get(e) != per_b.get(e)]
    e = diff[0]
    first = min(ea.get(e, [0]) + eb.get(e, [0])) if (ea.get(e) or eb.get(e)) else None
    return judged_check(
        "steps",
        FAIL,
        f"epoch {e}: {per_a.get(e, 0)} steps in A, {per_b.get(e, 0)} in B "
        f"({len(a.steps)} and {len(b.steps)} in all)",
        judged,
        not_judged,
        first_step=first,
    )


def check_samples(a: Recorded, b: Recorded) -> Check:
    judged = "the rows each replica fed at each common step, as multisets of content digests"
    not_judged = (
        "the labels (not recorded), the order of rows inside a replica's batch, augmentation "
        "inside the model"
    )
    if a.world_size != b.world_size:
        return judged_check(
            "samples",
            FAIL,
            f"{a.world_size} replicas in A, {b.world_size} in B: no replica has a counterpart",
            judged,
            not_judged,
            first_step=1,
        )
    n = min(len(a.steps), len(b.steps))
    first_exact = first_pattern = None
    for s in range(1, n + 1):
        for ra, rb in zip(a.rows(s), b.rows(s), strict=False):
            if first_exact is None and sorted(ra.exact) != sorted(rb.exact):
                first_exact = s
            if first_pattern is None and sorted(ra.pattern) != sorted(rb.pattern):
                first_pattern = s
        if first_pattern is not None:
            break
    if first_exact is None:
        return judged_check(
            "samples",
            PASS,
            f"the same rows on every replica at all {n} common steps",
            judged,
            not_judged,
        )
    if first_pattern is None:
        return judged_check(
            "samples",
            FAIL,
            f"the same samples on every replica at all {n} common steps, but fed with different "
            f"values from step {first_exact} (the inputs are normalised differently)",
            judged,
            not_judged,
            first_step=first_exact,
        )
    return judged_check(
        "samples",
        FAIL,
        f"step {first_pattern}: the replicas fed different samples",
        judged,
        not_judged,
        first_step=first_pattern,
    )


def check_init(a: Recorded, b: Recorded) -> Check:
    judged = (
        "every initial array, paired by name (a weight map's), else in order (torch's layout, "
        "Keras's converted), else by its values (a converter's port), exactly"
    )
    not_judged = (
        "what the layers compute (activations, dropout, the flatten order): arrays only; "
        "buffers Keras does not expose"
    )
    pairs = paired_weights(a, b)
    if isinstance(pairs, str):
        return judged_check(
            "initial weights",
            FAIL,
            f"different architectures: {pairs}",
            judged,
            not_judged,
            first_step=0,
        )
    worst, where = 0.0, ""
    for p in pairs:
        d = float(np.max(np.abs(p.va.astype(np.float64) - p.vb), initial=0.0))
        if d > worst:
            worst, where = d, f"{p.a} / {p.b}"
    valued = sum(p.by_values for p in pairs)
    if worst == 0.0:
        return judged_check(
            "initial weights",
            PASS,
            f"{len(pairs)} arrays, bit-identical values"
            + (
                f" ({valued} paired by their values: a converter's layout, whose arrangement "
                f"is not judged here)"
                if valued
                else ""
            ),
            judged,
            not_judged,
            value=0.0,
            bound=0.0,
        )
    return judged_check(
        "initial weights",
        FAIL,
        f"values differ (max |diff| {worst:.3g} in {where})",
        judged,
        not_judged,
        first_step=0,
        value=worst,
        bound=0.0,
    )


def group_lrs(run: Recorded) -> list[list[float | None]]:
    """Each step's lr per parameter group (``lrs``, recorded where an optimizer has several),
    else its one lr."""
    return [list(s.lrs or [s.lr]) for s in run.steps]


def lr_pairs(ga: list[Any], gb: list[Any]) -> list[tuple[int, Any, Any]]:
    """(group, A's lr, B's lr) to compare at one step: group by group where both have as many
    groups; one lr for all parameters against each of the other's groups; else the first only."""
    if len(ga) == len(gb):
        return [(g, x, y) for g, (x, y) in enumerate(zip(ga, gb, strict=True))]
    if len(ga) == 1 or len(gb) == 1:
        return [(g, ga[min(g, len(ga) - 1)], gb[min(g, len(gb) - 1)])
                for g in range(max(len(ga), len(gb)))]  # fmt: skip
    return [(0, ga[0], gb[0])]


def check_lr(a: Recorded, b: Recorded) -> Check:
    judged = (
        f"the lr at each common step, every parameter group (matched by position; one lr for "
        f"all parameters against each of the other run's groups), relative tolerance {LR_RTOL:g} "
        f"of the lr or 8 float32 ulps of the run's peak lr (a schedule computed in float32)"
    )
    not_judged = (
        "which parameters each group holds; groups beyond the first where the runs have several, "
        "in different numbers"
    )
    la, lb = group_lrs(a), group_lrs(b)
    peak = max((abs(v) for run in (la, lb) for g in run for v in g if v is not None), default=0)
    for s, (ga, gb) in enumerate(zip(la, lb, strict=False), 1):
        for g, x, y in lr_pairs(ga, gb):
            if x is None or y is None:
                continue
            if lr_close(x, y, peak):
                continue
            where = f"parameter group {g}: " if max(len(ga), len(gb)) > 1 else ""
            return judged_check(
                "learning rate",
                FAIL,
                f"step {s}: {where}lr {x:.6g} in A, {y:.6g} in B",
                judged,
                not_judged,
                first_step=s,
            )
    return judged_check(
        "learning rate",
        PASS,
        f"the same lr at all {min(len(la), len(lb))} common steps",
        judged,
        not_judged,
    )


def check_scaling(a: Recorded, b: Recorded) -> Check:
    judged = "the loss scale at each step's start and which steps were skipped"
    not_judged = "why a step overflowed (the gradients themselves are not recorded)"
    sa, sb = a.series("loss_scale"), b.series("loss_scale")
    on_a, on_b = any(x is not None for x in sa), any(x is not None for x in sb)
    if not on_a and not on_b:
        return judged_check("loss scaling", PASS, "neither run scales the loss", judged, not_judged)
    if on_a != on_b:
        who = "A" if on_a else "B"
        return judged_check(
            "loss scaling", FAIL, f"only {who} scales the loss", judged, not_judged, first_step=1
        )
    ka, kb = a.series("skipped"), b.series("skipped")
    for s, (x, y, p, q) in enumerate(zip(sa, sb, ka, kb, strict=False), 1):
        if x != y or bool(p) != bool(q):
            return judged_check(
                "loss scaling",
                FAIL,
                f"step {s}: scale {x:g} {'(skipped) ' if p else ''}in A, {y:g} "
                f"{'(skipped) ' if q else ''}in B",
                judged,
                not_judged,
                first_step=s,
            )
    return judged_check(
        "loss scaling", PASS, "the same scale and skips at every common step", judged, not_judged
    )


def check_settings(a: Recorded, b: Recorded) -> Check:
    judged = (
        "the settings read from the scripts' objects: the optimizer (type and options, each "
        "framework's defaults under the other's names), the loss-scale rule, BatchNorm's momentum "
        "and eps, the parameters' and the compute dtype (Keras's policy, torch's autocast) and "
        "(torch) the steps trained in eval mode"
    )
    not_judged = (
        "what the recorders cannot read: autocast entered inside the model's forward, sample and "
        "class weights, the loss's own options; a torch script's parameter groups beyond the "
        "first against a Keras run's one"
    )
    found = [f for d in SETTINGS_DIAGNOSES for f in d(a, b) if not f.inherent]
    if found:
        return judged_check("settings", FAIL, "; ".join(f.name for f in found), judged, not_judged)
    return judged_check("settings", PASS, "no setting differs", judged, not_judged)


CHECKS = (
    check_steps,
    check_samples,
    check_init,
    check_replicas,
    check_lr,
    check_scaling,
    check_settings,
    check_loss,
)


def run_checks(a: Recorded, b: Recorded) -> list[Check]:
    return [c(a, b) for c in CHECKS]


__all__ = ["CHECKS", "loss_windows", "run_checks"]

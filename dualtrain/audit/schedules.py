"""The learning-rate diagnoses of two recorded runs: a different base lr, a schedule that sets
step 1's own, a schedule of another shape or stepped per epoch against per step, a parameter
group's own lr, a scheduler stepped before the optimizer; each with the lines to change (the
schedule's, the optimizer's, the lr callbacks')."""

from __future__ import annotations

from dualtrain.audit import conventions as C
from dualtrain.audit.checks import (
    LR_F32_ULPS,
    group_lrs,
    lr_close,
    lr_pairs,
    lr_peak,
)
from dualtrain.audit.finding import fix, hf_trainer, opt_lines, schedule_lines
from dualtrain.audit.optimizers import describe
from dualtrain.audit.read import Recorded
from dualtrain.audit.warmups import (
    Warmup,
    schedule_to_write,
    warmup_findings,
    warmup_of,
    written_lrs,
)
from dualtrain.records.verdict import LR_SCALE, LR_SERIES, Edit, Finding


def _change_points(run: Recorded) -> tuple[list[int], bool]:
    """Steps where the lr changes, and whether every change falls on an epoch's first step."""
    starts = {steps[0] for steps in run.epochs().values()}
    points = run.lr_changes()
    return points, all(p in starts for p in points)


def schedule(a: Recorded, b: Recorded) -> list[Finding]:
    pa, epoch_a = _change_points(a)
    pb, epoch_b = _change_points(b)
    if any(r.config.scheduler.get("before_optimizer") for r in (a, b)):
        return _shape(a, b, pa, pb)  # step 1's lr is a step of the schedule (scheduler_first)
    wa, wb = warmup_of(a), warmup_of(b)
    warm = warmup_findings(a, b, wa, wb)
    if warm or (wa and wb):
        return warm + _after_warmup(a, b, wa, wb)
    if pa and pb and epoch_a != epoch_b:
        return _granularity(a, b, pa, pb, epoch_a)
    start = _scheduled_start(a, b)
    if start:
        return start
    if epoch_a and epoch_b and _epoch_lengths(a) != _epoch_lengths(b):
        return _base_lr(a, b) + _per_epoch(a, b)  # step k is another point of each schedule
    return _base_lr(a, b) + _shape(a, b, pa, pb)


def _epoch_lengths(run: Recorded) -> list[int]:
    return [len(steps) for steps in run.epochs().values()]


def _after_warmup(a: Recorded, b: Recorded, wa: Warmup | None, wb: Warmup | None) -> list[Finding]:
    """After the warmups (the longer one's steps): the lr each reached, then the schedule's
    granularity and shape relative to it."""
    skip = max(w.steps for w in (wa, wb) if w)
    peak_a, peak_b = (w.peak if w else float(r.steps[0].lr or 0) for w, r in ((wa, a), (wb, b)))
    if not lr_close(peak_a, peak_b, lr_peak(a, b)):
        return _base_lr(a, b, (peak_a, peak_b), "the warmups' peaks")
    pa, pb = ([p for p in _change_points(r)[0] if p > skip] for r in (a, b))
    starts = [{steps[0] for steps in r.epochs().values()} for r in (a, b)]
    epoch_a, epoch_b = (all(p in s for p in ps) for ps, s in ((pa, starts[0]), (pb, starts[1])))
    if pa and pb and epoch_a != epoch_b:
        return _granularity(a, b, pa, pb, epoch_a)
    return _shape(a, b, pa, pb, skip, (peak_a, peak_b))


def _per_epoch(a: Recorded, b: Recorded) -> list[Finding]:
    """Two schedules that change the lr only at epoch starts, over epochs of other lengths:
    compared epoch by epoch, relative to epoch 1's lr."""
    ea, eb = a.epochs(), b.epochs()
    lr_a = {s.step: float(s.lr or 0) for s in a.steps}
    lr_b = {s.step: float(s.lr or 0) for s in b.steps}
    ref_a, ref_b = lr_a[ea[1][0]], lr_b[eb[1][0]]
    if not ref_a or not ref_b:
        return []
    for e in sorted(set(ea) & set(eb)):
        x, y = lr_a[ea[e][0]] / ref_a, lr_b[eb[e][0]] / ref_b
        if C.same_value(x, y) or abs(x - y) <= LR_F32_ULPS * (1 + max(x, y)):
            continue
        return [
            Finding(
                "different lr schedules",
                f"relative to epoch 1, the lr at epoch {e}: {x:.4g}x in A, {y:.4g}x in B (both "
                f"change it only at epoch starts; A's epochs are {len(ea[1])} steps, B's "
                f"{len(eb[1])})",
                [
                    fix(a, "A", schedule_lines(a), schedule_to_write(a, b, "B")),
                    fix(b, "B", schedule_lines(b), schedule_to_write(b, a, "A")),
                ],
                edits=_written(a, b),
                step=min(ea[e][0], eb[e][0]),
            )
        ]
    return []


def _set_lr(run: Recorded) -> float | None:
    """The lr a torch script made its optimizer with, where a scheduler set step 1's own
    (LinearLR's start_factor, a LambdaLR's factor at step 0): the group's ``initial_lr``."""
    opt = run.config.optimizer
    if run.framework != "torch" or not run.config.scheduler or not run.steps:
        return None
    made = opt.get("initial_lr")
    return None if made is None or C.same_value(made, run.steps[0].lr) else float(made)


def _scheduled_start(a: Recorded, b: Recorded) -> list[Finding]:
    """Step 1's lrs differ, the optimizers were made with one lr: a scheduler set step 1's."""
    sa, sb = _set_lr(a), _set_lr(b)
    first = first_lrs(a, b)
    if first is None or (sa is None and sb is None):
        return []
    la, lb = first
    made = (sa if sa is not None else la, sb if sb is not None else lb)
    if lr_close(la, lb, lr_peak(a, b)) or not C.same_value(*made):
        return []
    starts = [
        f"{tag}'s {run.config.scheduler.type} sets step 1's lr to {lr / m:.4g}x of it"
        for tag, run, s, lr, m in (("A", a, sa, la, made[0]), ("B", b, sb, lb, made[1]))
        if s is not None
    ]
    return [
        Finding(
            "different lr schedules",
            f"step 1: lr {la:.6g} in A, {lb:.6g} in B; both optimizers are made with lr "
            f"{made[0]:.6g}: {', '.join(starts)}",
            [
                fix(a, "A", schedule_lines(a), "the schedule B follows, from its first step"),
                fix(b, "B", schedule_lines(b), "the schedule A follows, from its first step"),
            ],
            step=1,
        )
    ]


def first_lrs(a: Recorded, b: Recorded) -> tuple[float, float] | None:
    """Step 1's lr in A and in B (None: a record without steps, or without its lr)."""
    la = a.steps[0].lr if a.steps else None
    lb = b.steps[0].lr if b.steps else None
    return None if la is None or lb is None else (la, lb)


def _base_lr(
    a: Recorded, b: Recorded, lrs: tuple[float, float] | None = None, what: str = "step 1"
) -> list[Finding]:
    """Step 1's lrs (or ``lrs``, what ``what`` names) apart."""
    first = lrs or first_lrs(a, b)
    if first is None or lr_close(*first, lr_peak(a, b)):
        return []  # (within the lr check's tolerance: a float32 schedule's step 1)
    la, lb = first
    return [
        Finding(
            "different base learning rate",
            f"{what}: lr {la:.6g} in A, {lb:.6g} in B (each optimizer's own default or "
            f"setting: A {describe(a)}, B {describe(b)})",
            [_lr_fix(a, "A", lb), _lr_fix(b, "B", la)],
            step=1,
            edits=[[Edit("A", LR_SCALE, lb / la)], [Edit("B", LR_SCALE, la / lb)]]
            if la and lb
            else [],
        )
    ]


#: torch schedulers that set the lr from their own peak (the optimizer's lr is overridden)
PEAK_SCHEDULERS = {"OneCycleLR": "max_lr", "CyclicLR": "max_lr"}


def _lr_fix(run: Recorded, tag: str, lr: float) -> str:
    """The line that sets ``run``'s first lr, and what to write there."""
    sched = run.config.scheduler.type
    if run.framework == "torch" and sched in PEAK_SCHEDULERS:
        return fix(
            run,
            tag,
            (f"{sched}(",),
            f"a {PEAK_SCHEDULERS[sched]} whose schedule starts at lr={lr:.6g} (step 1's lr "
            f"comes from the {sched}, not the optimizer)",
        )
    name = "lr" if run.framework == "torch" and not hf_trainer(run) else "learning_rate"
    return fix(run, tag, opt_lines(run), f"{name}={lr:.6g}")


def _shape(
    a: Recorded,
    b: Recorded,
    pa: list[int],
    pb: list[int],
    start: int = 0,
    peaks: tuple[float, float] | None = None,
) -> list[Finding]:
    """The same granularity, another schedule: the lr relative to step 1's (to the peak's where
    a warmup starts from 0; to the warmups' ``peaks`` from step ``start`` + 1) parts."""
    ra, rb = [float(x or 0) for x in a.series("lr")], [float(x or 0) for x in b.series("lr")]
    if not ra or not rb or not max(ra) or not max(rb):
        return []
    if peaks:
        base, (ref_a, ref_b) = "the warmup's peak", peaks
    else:
        base = "step 1" if ra[0] and rb[0] else "the peak"
        ref_a, ref_b = (ra[0], rb[0]) if base == "step 1" else (max(ra), max(rb))
    rel_a, rel_b = [x / ref_a for x in ra], [x / ref_b for x in rb]
    # a schedule computed in float32 (check_lr's): each lr within LR_F32_ULPS of the peak, the
    # reference's error scaling every part with it, so a part x errs by up to ulps*peak/ref*(1+x)
    top = max(*rel_a, *rel_b)
    pairs = list(zip(rel_a, rel_b, strict=False))
    first = next(
        (
            i + 1
            for i, (x, y) in enumerate(pairs)
            if i >= start
            and not C.same_value(x, y)
            and abs(x - y) > LR_F32_ULPS * top * (1 + max(x, y))
        ),
        None,
    )
    if first is None:
        return []
    return [
        Finding(
            "different lr schedules",
            f"relative to {base}, the lr parts at step {first}: {rel_a[first - 1]:.4g}x in A "
            f"(changes at steps {pa[:6]}), {rel_b[first - 1]:.4g}x in B (changes at steps "
            f"{pb[:6]})",
            [
                fix(a, "A", schedule_lines(a), schedule_to_write(a, b, "B")),
                fix(b, "B", schedule_lines(b), schedule_to_write(b, a, "A")),
            ],
            step=first,
            edits=_written(a, b),
        )
    ]


def _written(a: Recorded, b: Recorded) -> list[list[Edit]]:
    """Each side's schedule written, as the lrs it gives (unchecked where it is words)."""
    out = []
    for tag, run, like in (("A", a, b), ("B", b, a)):
        lrs = written_lrs(run, like)
        out.append([] if lrs is None else [Edit(tag, LR_SERIES, lrs)])
    return out


def _granularity(
    a: Recorded, b: Recorded, pa: list[int], pb: list[int], epoch_a: bool
) -> list[Finding]:
    per_epoch, per_step = (a, "A") if epoch_a else (b, "B"), (b, "B") if epoch_a else (a, "A")
    fixes = []
    for (run, tag), how in ((per_epoch, "per epoch"), (per_step, "per step")):
        if run.framework == "torch":
            change = (
                f"this scheduler steps {how}: call `scheduler.step()` once per "
                f"{'optimizer step (inside the batch loop)' if how == 'per epoch' else 'epoch'}"
                " like the other script"
            )
            fixes.append(fix(run, tag, ("scheduler.step()", "lr_scheduler"), change, ran(run)))
        else:
            change = (
                "the lr set per epoch (a LearningRateScheduler, a callback's on_epoch_begin); "
                "a `keras.optimizers.schedules.LearningRateSchedule` sets it per step: use the "
                "other script's granularity"
                if how == "per epoch"
                else "this LearningRateSchedule sets the lr at every step; per epoch is "
                "`staircase=True` with decay_steps the steps of an epoch (ExponentialDecay, "
                "InverseTimeDecay) or a LearningRateScheduler callback: use the other script's "
                "granularity"
            )
            needles = (  # the per-epoch run's own line first; a per-step one's schedule's
                ("LearningRateScheduler", "on_epoch_begin", "learning_rate.assign")
                + (".learning_rate =", *schedule_lines(run))
                if how == "per epoch"
                else schedule_lines(run)
            )
            fixes.append(fix(run, tag, needles, change))
    return [
        Finding(
            "scheduler stepped per epoch vs per step",
            f"{per_epoch[1]}'s lr changes only at epoch starts (steps "
            f"{(pa if epoch_a else pb)[:6]}); {per_step[1]}'s inside epochs (first at step "
            f"{(pb if epoch_a else pa)[0]})",
            fixes,
            step=min(pa[0], pb[0]),
        )
    ]


def group_lr(a: Recorded, b: Recorded) -> list[Finding]:
    """A parameter group beyond the first at another lr while the first agrees: a head or a
    no-decay group given its own lr in one script (``add_param_group``, a group's ``"lr"``)."""
    peak = lr_peak(a, b)
    for s, (ga, gb) in enumerate(zip(group_lrs(a), group_lrs(b), strict=False), 1):
        pairs = lr_pairs(ga, gb)
        if not pairs or None in pairs[0][1:] or not lr_close(pairs[0][1], pairs[0][2], peak):
            return []  # the first group differs: the schedule's or base lr's finding
        bad = [
            (g, x, y) for g, x, y in pairs[1:] if None not in (x, y) and not lr_close(x, y, peak)
        ]
        if not bad:
            continue
        g, x, y = bad[0]
        fixes = [
            fix(run, tag, ("add_param_group(", '"lr"', "'lr'", *opt_lines(run)), change)
            if len(mine) > 1
            else fix(run, tag, opt_lines(run), f"a parameter group for {other}'s group {g}")
            for run, tag, mine, change, other in (
                (a, "A", ga, f"group {g}'s lr as B's ({y:.6g} at this step)", "B"),
                (b, "B", gb, f"group {g}'s lr as A's ({x:.6g} at this step)", "A"),
            )
            if run.framework == "torch"
        ]
        return [
            Finding(
                "different lr in a parameter group",
                f"step {s}: parameter group {g}'s lr {x:.6g} in A, {y:.6g} in B (group 0's "
                f"agree: {pairs[0][1]:.6g})"
                + ("; a Keras fit has one lr for every variable" if len(fixes) < 2 else ""),
                fixes,
                step=s,
            )
        ]
    return []


def ran(run: Recorded) -> int | None:
    """The first line of ``run``'s script the torch recorder saw step its scheduler."""
    lines = run.config.scheduler.get("step_lines") or []
    return int(lines[0]) if lines else None


def scheduler_first(a: Recorded, b: Recorded) -> list[Finding]:
    """A torch scheduler stepped before the first optimizer step (torch warns once): every lr
    comes one scheduler step early, the schedule's first value skipped."""
    out = []
    for run, other, tag in ((a, b, "A"), (b, a, "B")):
        sched = run.config.scheduler
        if sched.get("before_optimizer") and not other.config.scheduler.get("before_optimizer"):
            out.append(
                Finding(
                    "scheduler stepped before optimizer.step()",
                    f"{tag}'s {sched.get('type')} had stepped before the first optimizer step: "
                    f"each lr comes a scheduler step early (its first value skipped)",
                    [
                        fix(
                            run,
                            tag,
                            ("scheduler.step()", "sched.step()", *schedule_lines(run)),
                            "call scheduler.step() after optimizer.step()",
                            ran(run),
                        )
                    ],
                    step=1,
                )
            )
    return out

"""Warmups: a run whose lr rises over its first steps. Compared as warmups (their lengths, their
rise relative to the peak) and the lr after them, never by step 1's lr alone: a warmup's first lr
is a fraction of the lr the script set, and the steps that rise inside an epoch are no scheduler
stepped per step. Each fix is the warmup to write, in the run's framework's words."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dualtrain.audit import conventions as C
from dualtrain.audit.checks import LR_F32_ULPS, lr_close, lr_peak
from dualtrain.audit.finding import fix, hf_trainer, opt_lines, schedule_lines
from dualtrain.audit.read import Recorded
from dualtrain.records.verdict import LR_SERIES, Edit, Finding


@dataclass(frozen=True)
class Warmup:
    """The lr rising from step 1 to its ``peak`` at step ``steps``."""

    lrs: tuple[float, ...]
    """The lr of steps 1..steps."""

    @property
    def steps(self) -> int:
        return len(self.lrs)

    @property
    def start(self) -> float:
        return self.lrs[0]

    @property
    def peak(self) -> float:
        return self.lrs[-1]

    def relative(self) -> list[float]:
        return [x / self.peak for x in self.lrs]

    def linear(self) -> bool:
        """Each step adds the same lr (LinearLR, Keras's warmup_target): within float32's error."""
        n = self.steps - 1
        line = [self.start + (self.peak - self.start) * i / n for i in range(self.steps)]
        return all(
            abs(x - y) <= LR_F32_ULPS * self.peak for x, y in zip(self.lrs, line, strict=True)
        )


def warmup_of(run: Recorded) -> Warmup | None:
    """``run``'s warmup: its lr rising at each of its first steps (beyond the lr check's
    tolerance), to step 2 at least; None when step 2's lr is not above step 1's."""
    lrs = run.series("lr")
    peak = lr_peak(run)
    rise: list[float] = []
    for x in lrs:
        if x is None or (rise and (x <= rise[-1] or lr_close(x, rise[-1], peak))):
            break
        rise.append(float(x))
    return Warmup(tuple(rise)) if len(rise) >= 2 else None


def starts_at_peak(run: Recorded) -> bool:
    """No lr of ``run`` is above its step 1's: a run with no warmup of any granularity."""
    lrs = [float(x) for x in run.series("lr") if x is not None]
    return bool(lrs) and all(x <= lrs[0] or lr_close(x, lrs[0], lrs[0]) for x in lrs)


def same_warmup(wa: Warmup, wb: Warmup) -> bool:
    """The same length, the same rise relative to each peak (the peaks themselves may differ:
    that is the base lr's finding)."""
    return wa.steps == wb.steps and all(
        C.same_value(x, y) or abs(x - y) <= 2 * LR_F32_ULPS
        for x, y in zip(wa.relative(), wb.relative(), strict=True)
    )


def _optimizer_name(run: Recorded) -> str:
    """The variable the script's optimizer is bound to (``opt = torch.optim.SGD(``)."""
    found = run.line_of(*opt_lines(run)) or ""
    m = re.search(r":\s*(\w+)\s*=\s*[\w.]*(optim|optimizers)\.", found)
    return m.group(1) if m else "optimizer"


def torch_warmup(w: Warmup, opt: str) -> str:
    """The torch scheduler that makes warmup ``w`` (stepped once per optimizer step)."""
    n = w.steps - 1
    if w.linear() and w.start > 0:
        made = f"LinearLR({opt}, start_factor={w.start / w.peak:.6g}, total_iters={n})"
    elif w.linear():  # LinearLR refuses a start_factor of 0
        made = f"LambdaLR({opt}, lambda s: min(1.0, s / {n}))"
    else:
        factors = ", ".join(f"{x:.6g}" for x in w.relative()[:-1])
        made = f"LambdaLR({opt}, lambda s: [{factors}][s] if s < {n} else 1.0)"
    return (
        f"{made}, stepped every optimizer step, before this schedule (SequentialLR or "
        f"ChainedScheduler; a per-epoch schedule chained per step needs its step_size in steps)"
    )


def keras_warmup(w: Warmup) -> str:
    """The Keras schedule that makes warmup ``w``."""
    n = w.steps - 1
    if w.linear():
        return (
            f"a warmup from {w.start:.6g} to {w.peak:.6g} over {n} steps: CosineDecay("
            f"initial_learning_rate={w.start:.6g}, decay_steps=1, alpha=1.0, "
            f"warmup_target={w.peak:.6g}, warmup_steps={n}) (constant after it; a decay's own "
            f"decay_steps and alpha in their place)"
        )
    shown = ", ".join(f"{x:.6g}" for x in w.lrs)
    return f"a LearningRateSchedule whose first {w.steps} lrs are {shown}"


def _add(run: Recorded, tag: str, w: Warmup, what: str) -> str:
    if hf_trainer(run) and w.linear() and w.start == 0:  # the Trainer's warmup: 0 to its lr
        change = f"warmup_steps={w.steps - 1} in TrainingArguments (learning_rate={w.peak:.6g})"
    elif run.framework == "torch":
        change = torch_warmup(w, _optimizer_name(run))
    else:
        change = keras_warmup(w)
    return fix(run, tag, schedule_lines(run), f"{what}: {change}")


def _drop(run: Recorded, tag: str, w: Warmup) -> str:
    if hf_trainer(run):
        change = f"warmup_steps=0 (learning_rate={w.peak:.6g} from step 1)"
    else:
        name = "lr" if run.framework == "torch" else "learning_rate"
        change = f"no warmup: {name}={w.peak:.6g} from step 1"
    return fix(run, tag, schedule_lines(run), change)


def warmup_findings(
    a: Recorded, b: Recorded, wa: Warmup | None, wb: Warmup | None
) -> list[Finding]:
    """A warmup in one run only (the other starting at its peak), or two warmups of another
    length or shape; [] where the warmups agree."""
    if wa and wb:
        if same_warmup(wa, wb):
            return []
        to = "" if lr_close(wa.peak, wb.peak, max(wa.peak, wb.peak)) else f" to {wb.peak:.6g}"
        return [
            Finding(
                "different warmups",
                f"A's lr rises to {wa.peak:.6g} over {wa.steps} steps (from {wa.start:.6g}), "
                f"B's{to} over {wb.steps} steps (from {wb.start:.6g})",
                [_add(a, "A", wb, "B's warmup"), _add(b, "B", wa, "A's warmup")],
                step=2,
                edits=[_series("A", a, wb, True), _series("B", b, wa, True)],
            )
        ]
    w, on, tag, off, otag = (wa, a, "A", b, "B") if wa else (wb, b, "B", a, "A")
    if w is None or not starts_at_peak(off):
        return []
    first = off.steps[0].lr
    fixes = sorted(  # (each fix with its edits, in the fixes' order)
        [
            (_add(off, otag, w, f"{tag}'s warmup"), _series(otag, off, w, True)),
            (_drop(on, tag, w), _series(tag, on, w, False)),
        ]
    )
    return [
        Finding(
            "warmup in one run only",
            f"{tag}'s lr rises from {w.start:.6g} at step 1 to {w.peak:.6g} at step {w.steps} "
            f"(a warmup); {otag}'s starts at {first:.6g}",
            [line for line, _ in fixes],
            step=1,
            edits=[edits for _, edits in fixes],
        )
    ]


def _series(tag: str, run: Recorded, w: Warmup, keep: bool) -> list[Edit]:
    return [Edit(tag, LR_SERIES, warmup_lrs(run, w, keep))]


def _constant(lrs: list[float]) -> bool:
    return bool(lrs) and all(lr_close(x, lrs[0], lrs[0]) for x in lrs)


def _linear_steps(lrs: list[float]) -> int | None:
    """N where the lrs fall linearly to 0 over N steps from step 1's (lr_1 * (1 - i / N));
    None for another shape."""
    if len(lrs) < 3 or not lrs[0] or lrs[1] >= lrs[0]:
        return None
    n = round(lrs[0] / (lrs[0] - lrs[1]))
    line = [max(lrs[0] * (1 - i / n), 0.0) for i in range(len(lrs))]
    return (
        n
        if all(abs(x - y) <= 2 * LR_F32_ULPS * lrs[0] for x, y in zip(lrs, line, strict=True))
        else None
    )


def written_lrs(run: Recorded, like: Recorded) -> list[float] | None:
    """The lr at each of ``run``'s steps under the schedule :func:`schedule_to_write` writes
    (``like``'s constant lr, or its linear decay to 0 over N steps: LinearLR stepped per step,
    PolynomialDecay, a Trainer's "linear", each lr_1 * (1 - i / N) from step i + 1); None where
    it writes words."""
    shape = _writable(like)
    if shape is None:
        return None
    lr, n = shape
    if n is None:
        return [lr] * len(run.steps)
    return [max(lr * (1 - i / n), 0.0) for i in range(len(run.steps))]


def _writable(like: Recorded) -> tuple[float, int | None] | None:
    """``like``'s schedule where one call writes it: (step 1's lr, None) for a constant lr,
    (step 1's lr, N) for a linear decay to 0 over N steps; None for another shape."""
    lrs = [float(x or 0) for x in like.series("lr")]
    n = _linear_steps(lrs)
    if not lrs or (not _constant(lrs) and n is None):
        return None
    return lrs[0], n


def warmup_lrs(run: Recorded, w: Warmup, keep: bool) -> list[float]:
    """``run``'s lrs with warmup ``w`` written (``keep``) over its first steps, its own lrs
    after it; or (not ``keep``) its warmup dropped: ``w``'s peak from step 1."""
    own = [float(x or 0) for x in run.series("lr")]
    head = list(w.lrs) if keep else [w.peak] * w.steps
    return head + own[w.steps :]


def schedule_to_write(run: Recorded, like: Recorded, tag: str) -> str:
    """What ``run``'s script writes to follow ``like``'s (run ``tag``'s) schedule, where that is
    a constant lr or a linear decay to 0 (a Hugging Face Trainer's default); else the words."""
    shape = _writable(like)
    if shape is None:
        return f"the schedule {tag} follows"
    lr, n = shape
    if hf_trainer(run):
        kind = "constant" if n is None else "linear"
        return f'lr_scheduler_type="{kind}" in TrainingArguments' + (
            f" (its decay ends with the training, here at step {n})" if n else ""
        )
    if run.framework == "torch":
        if n is None:
            return f"no scheduler (lr={lr:.6g} at every step)"
        opt = _optimizer_name(run)
        return (
            f"LinearLR({opt}, start_factor=1.0, end_factor=0.0, total_iters={n}), stepped every "
            f"optimizer step"
        )
    if n is None:
        return f"learning_rate={lr:.6g}, a number (no schedule)"
    decay = f"PolynomialDecay({lr:.6g}, decay_steps={n}, end_learning_rate=0.0)"
    return f"keras.optimizers.schedules.{decay}"

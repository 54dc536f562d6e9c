"""An epoch one script leaves early (a ``break`` after N batches, Keras's ``steps_per_epoch``
below the dataset's length): the same rows at each of its steps, then the other script's epoch
goes on. Read as a difference of data it sent the user to their split; it is a difference of
steps, and the step where the shorter epoch ends is the line to change."""

from __future__ import annotations

from dualtrain.audit.config import Options
from dualtrain.audit.finding import fix
from dualtrain.audit.read import Recorded
from dualtrain.audit.split import KIND
from dualtrain.records.verdict import Finding


def left_early_at(a: Recorded, b: Recorded) -> tuple[int, str, int, int] | None:
    """(epoch, the run that leaves it early, its steps, the other's) for the first epoch whose
    step counts differ, where the shorter epoch's steps feed the longer's first rows."""
    ea, eb = a.epochs(), b.epochs()
    for e in sorted(set(ea) & set(eb)):
        sa, sb = ea[e], eb[e]
        if len(sa) == len(sb):
            continue
        m = min(len(sa), len(sb))
        longer, steps = (a, sa) if len(sa) > len(sb) else (b, sb)
        last = longer.steps[steps[-1] - 1]  # the longer epoch's last step
        if len(sa) - len(sb) in (1, -1) and last.samples < longer.steps[0].samples:
            return None  # the one more step is a partial batch: drop_remainder's finding
        same = all(
            a.global_rows(x, KIND) == b.global_rows(y, KIND)
            for x, y in zip(sa[:m], sb[:m], strict=False)
        )
        return (e, "A" if len(sa) < len(sb) else "B", m, max(len(sa), len(sb))) if same else None
    return None


def left_early(a: Recorded, b: Recorded) -> list[Finding]:
    found = left_early_at(a, b)
    if found is None:
        return []
    epoch, tag, m, n = found
    run, other = (a, b) if tag == "A" else (b, a)
    steps = run.epochs()[epoch]
    longer = "steps_per_epoch" if other.framework == "tf" else "the loop"
    return [
        Finding(
            "an epoch left early",
            f"{tag} leaves epoch {epoch} after {m} steps, the other run after {n}: the same rows "
            f"at each of its {m} steps",
            [
                fix(
                    run,
                    tag,
                    ("break", "steps_per_epoch", "max_steps", "islice("),
                    f"every batch of the epoch, as the other script (or stop {longer} of the "
                    f"other after {m} steps)",
                )
            ],
            step=steps[-1] + 1,
        )
    ]


def stopped(a: Recorded, b: Recorded) -> list[Finding]:
    """A Keras EarlyStopping that stopped fit while the other run trains more epochs (the
    steps check FAILs on the epochs one run has not)."""
    out = []
    for run, tag, other, otag in ((a, "A", b, "B"), (b, "B", a, "A")):
        rule = run.config.early_stopping or Options()
        mine, theirs = len(run.epochs()), len(other.epochs())
        if not rule.get("stopped_epoch") or theirs <= mine:
            continue
        how = f"monitor {rule.get('monitor')!r}, patience {rule.get('patience')}, min_delta "
        how += f"{rule.get('min_delta')}, restore_best_weights={rule.get('restore_best_weights')}"
        out.append(
            Finding(
                "stopped early in one run (EarlyStopping)",
                f"{tag}'s EarlyStopping ({how}) stopped fit after epoch {mine}; {otag} trains "
                f"{theirs} epochs",
                [
                    fix(
                        run,
                        tag,
                        ("EarlyStopping(",),
                        "the same stopping rule in both scripts, or none (then compare runs of "
                        "the same epochs)",
                    ),
                    fix(
                        other,
                        otag,
                        ("EarlyStopping(", "for epoch", "epochs="),
                        f"stop as {tag}'s EarlyStopping does: when {rule.get('monitor')} has "
                        f"not improved by min_delta for patience epochs (a torch loop: break)",
                    ),
                ],
                step=len(run.steps) + 1,
            )
        )
    return out


__all__ = ["left_early", "left_early_at", "stopped"]

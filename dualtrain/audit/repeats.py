"""Rows fed again: an epoch's order repeated in every later epoch (set_epoch forgotten, a
sampler that does not shuffle) and a row fed twice in one epoch (a DistributedSampler's padding),
each named only on the rows' own evidence (the sampler's indices or exact digests)."""

from __future__ import annotations

from collections import Counter

from dualtrain.audit.finding import fix
from dualtrain.audit.read import Recorded
from dualtrain.audit.rows import DigestKind
from dualtrain.records.verdict import Finding

KIND: DigestKind = "pattern"  # the same sample under any normalisation


def epoch_rows(run: Recorded, epoch: int, kind: DigestKind = KIND) -> Counter[str]:
    total: Counter[str] = Counter()
    for s in run.epochs().get(epoch, []):
        total += run.global_rows(s, kind)
    return total


def epoch_indices(run: Recorded, epoch: int) -> Counter[int] | None:
    """The dataset indices ``run``'s replicas fed in ``epoch`` (None where a row has none)."""
    out: Counter[int] = Counter()
    for step in run.epochs().get(epoch, []):
        for row in run.rows(step):
            if row.indices is None:
                return None
            out.update(row.indices)
    return out


def repeated(run: Recorded, epoch: int = 1) -> tuple[int, str]:
    """(rows fed more than once in the epoch, counted how): by the sampler's dataset indices where
    every row has one, else by the rows' exact digests (distinct rows can share a pattern)."""
    indices = epoch_indices(run, epoch)
    if indices:
        return sum(n - 1 for n in indices.values() if n > 1), "by the sampler's indices"
    exact = epoch_rows(run, epoch, "exact")
    return sum(n - 1 for n in exact.values() if n > 1), "by the rows' exact digests"


def repeats_epochs(run: Recorded) -> bool:
    """Every later epoch feeds exactly epoch 1's global batches in epoch 1's order."""
    ep = run.epochs()
    if len(ep) < 2:
        return False
    first = [run.global_rows(s, KIND) for s in ep[1]]
    return all(
        [run.global_rows(s, KIND) for s in steps] == first for e, steps in ep.items() if e > 1
    )


def set_epoch(a: Recorded, b: Recorded) -> list[Finding]:
    out = []
    for run, other, tag in ((a, b, "A"), (b, a, "B")):
        if repeats_epochs(run) and not repeats_epochs(other):
            sampler = run.config.sampler.options
            name = "set_epoch forgotten (every epoch the same order)"
            if run.framework == "torch" and (
                sampler.get("shuffle") is False or sampler.type == "SequentialSampler"
            ):  # an order no set_epoch changes
                name = "no shuffling (every epoch the same order)"
                change = f"shuffle=True (this {sampler.get('type')} does not shuffle)" + (
                    ", with `sampler.set_epoch(epoch)` each epoch"
                    if "Distributed" in str(sampler.get("type"))
                    else ""
                )
                needles: tuple[str, ...] = (f"{sampler.get('type')}(", "shuffle=", "DataLoader(")
            elif run.framework == "torch":
                change, needles = _set_epoch_fix(run)
            else:
                change = "shuffle with `reshuffle_each_iteration=True` (the default)"
                needles = (".shuffle(",)
            stayed = _sampler_stayed(run)
            out.append(
                Finding(
                    name,
                    f"{tag} feeds epoch 1's batches again in the same order in every later epoch; "
                    f"the other run reshuffles"
                    + (f" (the sampler's epoch stayed {stayed} in every epoch)" if stayed else ""),
                    [fix(run, tag, needles, change)],
                    step=run.epochs()[2][0],
                )
            )
    return out


def _sampler_stayed(run: Recorded) -> str | None:
    """The epoch a torch sampler kept through every recorded epoch (the recorder reads its
    ``epoch`` at each epoch's first batch); None where it moved or was not read."""
    seen = run.config.sampler.epochs
    return str(seen[0]) if len(seen) > 1 and seen[0] is not None and len(set(seen)) == 1 else None


def _set_epoch_fix(run: Recorded) -> tuple[str, tuple[str, ...]]:
    """A script that calls set_epoch somewhere: that call, which did not move the training
    sampler; else its epoch loop, where the call goes."""
    if run.line_of(".set_epoch(") is None:
        return "call `sampler.set_epoch(epoch)` at the start of every epoch", ("for epoch",)
    stayed = _sampler_stayed(run)
    return (
        "this call did not move the training sampler"
        + (f" (its epoch stayed {stayed})" if stayed else "")
        + ": it must run every epoch, on the sampler the training DataLoader draws from, with "
        "the epoch's number (a branch that did not run, another sampler, or a constant leave "
        "the order as it was)",
        (".set_epoch(",),
    )


def padding(a: Recorded, b: Recorded) -> list[Finding]:
    """A DistributedSampler that pads, where its repeated rows are a difference: named only when
    the run fed a row twice in epoch 1 and the other run did not feed the same rows as often."""
    out = []
    for run, other, tag in ((a, b, "A"), (b, a, "B")):
        sampler = run.config.sampler
        size, total = sampler.dataset_size, sampler.options.get("total_size")
        if not (size and total and total > size):
            continue
        twice, how = repeated(run)
        again, _ = repeated(other)
        if not twice or epoch_rows(run, 1, "exact") == epoch_rows(other, 1, "exact"):
            continue  # nothing repeated, or the other run fed the very same rows as often
        if again == twice:
            continue  # the other run repeats as many: not this sampler's difference
        said = "feeds every row once" if not again else f"repeats {again} row(s)"
        out.append(
            Finding(
                "DistributedSampler padding",
                f"{tag}'s DistributedSampler pads {size} samples to {total} (a multiple of "
                f"{sampler.options.get('num_replicas')} replicas): {twice} row(s) fed twice in "
                f"epoch 1 "
                f"({how}); the other run {said}",
                [
                    fix(
                        run,
                        tag,
                        ("DistributedSampler(",),
                        "DistributedSampler(..., "
                        "drop_last=True), or a dataset size divisible by the replicas",
                    )
                ],
            )
        )
    return out

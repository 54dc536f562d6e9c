"""The diagnoses the sample digests support: which rows each replica fed at each step tells the
data pipelines' classic differences apart."""

from __future__ import annotations

from dualtrain.audit.config import Options
from dualtrain.audit.early import left_early, left_early_at
from dualtrain.audit.finding import fix
from dualtrain.audit.read import Recorded
from dualtrain.audit.repeats import (
    KIND,
    epoch_indices,
    epoch_rows,
    padding,
    repeats_epochs,
    set_epoch,
)
from dualtrain.audit.split import (
    duplicated,
    orders_in_words,
    policies,
    sampler_needles,
    sharding,
    sharding_convention,
    splits_differ,
)
from dualtrain.records.verdict import Finding


def batches(a: Recorded, b: Recorded) -> list[Finding]:
    """The global batch size, and drop_remainder (a last partial batch in one run only)."""
    out = []
    na, nb = a.steps[0].samples if a.steps else 0, b.steps[0].samples if b.steps else 0
    ka, kb = micro_batches(a), micro_batches(b)
    if na != nb and ka != kb and na * kb == nb * ka:  # the same micro-batch, accumulated
        return [_accumulation(a, b, na, nb, ka, kb)]
    if na != nb:
        out.append(
            Finding(
                "different global batch size",
                f"step 1 feeds {na} rows in A and {nb} in B (A: {a.world_size} replicas, B: "
                f"{b.world_size})",
                [
                    fix(a, "A", ("batch_size", "batch("), f"a global batch of {nb}"),
                    fix(b, "B", ("batch_size", ".batch("), f"a global batch of {na}"),
                ],
                step=1,
            )
        )
        return out
    ea, eb = a.epochs(), b.epochs()
    la, lb = len(ea.get(1, [])), len(eb.get(1, []))
    if abs(la - lb) == 1:
        longer, tag, shorter, stag = (a, "A", b, "B") if la > lb else (b, "B", a, "A")
        last = longer.steps[len(longer.epochs()[1]) - 1].samples
        whole = shorter.steps[len(shorter.epochs()[1]) - 1].samples == na  # else its own
        if last < na and whole:  # partial batch too: other rows (a validation_split), not a drop
            change_long = (
                "`.batch(GLOBAL_BATCH, drop_remainder=True)`"
                if longer.framework == "tf"
                else "`DataLoader(..., drop_last=True)` (and DistributedSampler(drop_last=True))"
            )
            change_short = (
                "`.batch(GLOBAL_BATCH, drop_remainder=False)`"
                if shorter.framework == "tf"
                else "`DataLoader(..., drop_last=False)`"
            )
            out.append(
                Finding(
                    "drop_remainder",
                    f"{tag} ends epoch 1 with a partial batch of {last} rows (step "
                    f"{len(longer.epochs()[1])}); {stag} drops it",
                    [
                        fix(
                            longer,
                            tag,
                            ("drop_last", "drop_remainder", ".batch(", "DataLoader("),
                            change_long,
                        ),
                        fix(
                            shorter,
                            stag,
                            ("drop_last", "drop_remainder", ".batch(", "DataLoader("),
                            change_short,
                        ),
                    ],
                    step=len(longer.epochs()[1]),
                )
            )
    return out


def micro_batches(run: Recorded) -> int:
    """The micro-batches each replica fed in step 1 (rec.batch calls; 1 where not recorded)."""
    return max((row.batches or 1 for row in run.rows(1)), default=1)


#: where a script accumulates gradients
ACCUMULATION_LINES = ("accumulate", "accumulation", "gradient_accumulation_steps")


def _accumulation(a: Recorded, b: Recorded, na: int, nb: int, ka: int, kb: int) -> Finding:
    """One run steps its optimizer every k micro-batches: k times the other's global batch."""
    many, tag, k, few, otag, j = (a, "A", ka, b, "B", kb) if ka > kb else (b, "B", kb, a, "A", ka)
    rows, other_rows = (na, nb) if many is a else (nb, na)
    keep = (
        f"gradient_accumulation_steps={k // j} in the optimizer, or a global batch of {rows} "
        f"(the same mean gradient)"
        if few.framework == "tf"
        else f"accumulate {k // j} batches a step (Lightning: Trainer(accumulate_grad_batches="
        f"{k // j})), or a global batch of {rows}"
    )
    drop = (
        "Trainer(accumulate_grad_batches=1): step the optimizer on every batch"
        if many.framework == "torch"
        else "no gradient_accumulation_steps"
    )
    return Finding(
        "gradient accumulation in one run only",
        f"{tag} steps its optimizer every {k} micro-batches ({rows} rows a step, {rows // k} a "
        f"micro-batch); {otag} every {j} ({other_rows} rows a step)",
        sorted(
            [
                fix(many, tag, ACCUMULATION_LINES, drop),
                fix(few, otag, ("batch_size", ".batch(", *ACCUMULATION_LINES), keep),
            ]
        ),
        step=1,
    )


def order(a: Recorded, b: Recorded) -> list[Finding]:
    """Different data, a different shuffle, or the same global batches split differently over
    the replicas (DistributedSampler's interleaving against MirroredStrategy's blocks)."""
    n = min(len(a.steps), len(b.steps))
    if not n or a.steps[0].samples != b.steps[0].samples or splits_differ(a, b):
        return []  # the split's own finding says it
    first_global = next(
        (s for s in range(1, n + 1) if a.global_rows(s, KIND) != b.global_rows(s, KIND)), None
    )
    if first_global is not None:
        if first_global > 1 and (repeats_epochs(a) or repeats_epochs(b)):
            return []  # set_epoch's finding says it
        if left_early_at(a, b) is not None:
            return []  # the same rows until one epoch ends early: its own finding says it
        epoch = a.epoch_of(first_global)
        rows_a, rows_b = epoch_rows(a, epoch), epoch_rows(b, epoch)
        only_a, only_b = sum((rows_a - rows_b).values()), sum((rows_b - rows_a).values())
        if 0 < max(only_a, only_b) < a.steps[0].samples and not (only_a and only_b):
            return []  # one epoch's rows hold the other's and less than a batch more: a partial
            # last batch one run keeps (drop_remainder's finding says it)
        if max(only_a, only_b) >= a.steps[0].samples or (only_a and only_b and not _drops(a, b)):
            if _same_indices(a, b, epoch):
                return [_augmented(a, b, epoch, first_global)]
            return [
                Finding(
                    "different data",
                    f"epoch {epoch} feeds different samples in A and B (another subset, split or "
                    f"dataset; or the same samples changed otherwise: an augmentation)",
                    [_data_fix(a, "A", "B"), _data_fix(b, "B", "A")],
                    step=first_global,
                )
            ]
        samplers = _sampler_options(a, b)
        return [
            *sharding_convention(a, b),
            Finding(
                "shuffle seeds",
                f"epoch {epoch} feeds the same samples in A and B but in another order from step "
                f"{first_global} "
                + (
                    f"(each run drops {only_a} other row(s) with its last partial batch) "
                    if only_a
                    else ""
                )
                + (
                    f"(A's {samplers[0]}, B's {samplers[1]})" if samplers else orders_in_words(a, b)
                ),
                [_shuffle_fix(a, "A", samplers[1] if samplers else None)]
                + [_shuffle_fix(b, "B", samplers[0] if samplers else None)],
                step=first_global,
            ),
        ]
    for s in range(1, n + 1):
        for ra, rb in zip(a.rows(s), b.rows(s), strict=False):
            if sorted(ra.digests(KIND)) != sorted(rb.digests(KIND)):
                return [sharding(a, b, s)]
    return []


def _same_indices(a: Recorded, b: Recorded, epoch: int) -> bool:
    ia, ib = epoch_indices(a, epoch), epoch_indices(b, epoch)
    return ia is not None and ib is not None and ia == ib and bool(ia)


def _augmented(a: Recorded, b: Recorded, epoch: int, step: int) -> Finding:
    """The samplers name the same dataset indices, the rows' values differ: the data pipeline
    changes the samples (a random augmentation, another seed of it, a transform)."""
    change = "the same transform, with the same seed, as the other script (or none in both)"

    def needles(run: Recorded) -> tuple[str, ...]:  # the recorded dataset's class first
        kind = run.config.loader.dataset if run.config.loader else None
        own = (f"{kind}(",) if kind and kind not in ("NoneType", "TensorDataset") else ()
        return (*own, "transform", "def __getitem__", ".map(", "augment", "Dataset(")

    return Finding(
        "same samples, other values (augmentation or preprocessing)",
        f"epoch {epoch}: both runs' samplers feed the same dataset indices, but the rows' "
        f"values differ from step {step}: the pipeline changes each sample otherwise (a random "
        f"augmentation or its seed, a transform)",
        [fix(a, "A", needles(a), change), fix(b, "B", needles(b), change)],
        step=step,
    )


def _drops(a: Recorded, b: Recorded) -> bool:
    """Both runs feed whole batches only (each drops its epochs' last partial batch): their
    epochs may leave out other rows where they shuffle otherwise."""
    return all(s.samples == r.steps[0].samples for r in (a, b) for s in r.steps)


def _sampler_options(a: Recorded, b: Recorded) -> tuple[str, str] | None:
    """Two torch runs' samplers of one type whose shuffle or seed differ, as their calls."""
    sa, sb = a.config.sampler.options, b.config.sampler.options
    keys = ("shuffle", "seed")
    if a.framework != "torch" or b.framework != "torch" or sa.type != sb.type:
        return None
    if all(sa.get(k) == sb.get(k) for k in keys) or not all(k in sa for k in keys):
        return None

    def shown(c: Options) -> str:
        return f"{c['type']}({', '.join(f'{k}={c.get(k)}' for k in keys)})"

    return shown(sa), shown(sb)


def _data_fix(run: Recorded, tag: str, other: str) -> str:
    """Where ``run``'s script picks its rows (a split, a subset)."""
    needles = {
        "torch": ("random_split(", "Subset(", "Dataset("),
        "tf": ("validation_split", ".take(", ".skip(", "from_tensor_slices("),
    }[run.framework]
    return fix(run, tag, needles, f"the rows {other} trains on (the same subset, split and data)")


def _shuffle_fix(run: Recorded, tag: str, other: str | None = None) -> str:
    """Feed one permutation both scripts read, in ``run``'s framework's words (two torch
    samplers: the other's ``other`` options)."""
    if other is not None:
        return fix(run, tag, (f"{other.split('(')[0]}(",), f"{other} as the other script")
    if run.framework == "torch":
        needles: tuple[str, ...] = (*sampler_needles(run), "shuffle=", "manual_seed", "seed")
        change = (
            "feed one permutation both scripts read, e.g. "
            "`np.random.default_rng(SEED).permutation(N)` (a Sampler over it)"
        )
    elif run.config.data.fit_shuffle:  # fit shuffles the arrays itself
        return fix(
            run,
            tag,
            ("shuffle=", ".fit("),
            "`fit(..., shuffle=False)` (fit shuffles NumPy arrays every epoch by default), the "
            "arrays indexed in the other script's order",
        )
    else:
        needles = (".shuffle(", "shuffle=", "set_random_seed", "seed")
        change = (
            "the same permutation both scripts read: index the arrays with "
            "`np.random.default_rng(SEED).permutation(N)`, no `.shuffle`"
        )
    return fix(run, tag, needles, change)


def _values(run: Recorded) -> dict[str, str] | None:
    """pattern digest -> exact digest, over the run's rows; None where patterns do not tell
    samples apart (tabular rows without ties: every mask is 'all but the argmin', so a row of
    20 features has 20 patterns), as fewer than 90% as many patterns as exact digests."""
    pairs = {
        (p, e)
        for row in run.replicas.values()
        for p, e in zip(row.digests(KIND), row.exact, strict=True)
    }
    values = dict(pairs)
    if len(values) < 0.9 * len({e for _, e in pairs}):
        return None
    return values


def normalisation(a: Recorded, b: Recorded) -> list[Finding]:
    va, vb = _values(a), _values(b)
    if va is None or vb is None:
        return []
    shared = set(va) & set(vb)
    differ = sum(va[p] != vb[p] for p in shared)
    if not shared or differ < len(shared) / 2:
        return []
    return [
        Finding(
            "input normalisation",
            f"{differ} of the {len(shared)} samples both runs fed have different values (the pixel "
            f"patterns match, the numbers do not: the scripts normalise their inputs "
            f"differently, or feed them in another dtype)",
            [
                fix(
                    a,
                    "A",
                    ("Normalize", "0.1307", "/ 255", "/= 255", "255"),
                    "the same normalisation as B",
                ),
                fix(
                    b,
                    "B",
                    ("Normalize", "0.1307", "/ 255", "/= 255", "255"),
                    "the same normalisation as A",
                ),
            ],
            step=1,
        )
    ]


SAMPLE_DIAGNOSES = (
    set_epoch,
    padding,
    batches,
    duplicated,
    policies,
    order,
    left_early,
    normalisation,
)

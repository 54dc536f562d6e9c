"""The diagnoses of how a run splits its data over the replicas, read from the rows each replica
fed and the split the Keras recorder read from fit's dataset: replicas that feed each other's
rows (no sharding), a different tf.data auto-shard policy between two multi-worker runs, and the
same global batches split another way (DistributedSampler's interleaving against
MirroredStrategy's blocks, two torch samplers)."""

from __future__ import annotations

from dualtrain.audit.finding import fix
from dualtrain.audit.read import Recorded
from dualtrain.audit.rows import DigestKind
from dualtrain.records.verdict import Finding

KIND: DigestKind = "pattern"  # the same sample under any normalisation


def duplicate_steps(run: Recorded) -> tuple[int, int]:
    """(steps at which every replica fed the same rows, steps with rows on 2+ replicas)."""
    same = judged = 0
    for s in run.steps:
        rows = [sorted(r.digests(KIND)) for r in run.rows(s.step) if r.digests(KIND)]
        if len(rows) > 1:
            judged += 1
            same += all(r == rows[0] for r in rows[1:])
    return same, judged


def duplicates(run: Recorded) -> bool:
    """Most steps feed every replica the same rows: the data is not split over them."""
    same, judged = duplicate_steps(run)
    return judged > 0 and same * 2 > judged


def duplicated(a: Recorded, b: Recorded) -> list[Finding]:
    """Replicas that feed each other's rows in one run only: a DDP script without a
    DistributedSampler, a tf.data pipeline with auto-sharding off (every worker reads every row),
    a distribute_datasets_from_function that does not shard by its input_pipeline_id."""
    out = []
    for run, tag, other in ((a, "A", b), (b, "B", a)):
        if not duplicates(run) or duplicates(other):
            continue
        same, judged = duplicate_steps(run)
        if run.framework == "torch":
            needles: tuple[str, ...] = ("DataLoader(", "sampler=")
            change = (
                "sampler=DistributedSampler(dataset) in the DataLoader (each replica a "
                "different 1/world of the data)"
            )
        else:
            needles = ("auto_shard_policy", "distribute_datasets_from_function", ".batch(")
            change = (
                "auto_shard_policy = AutoShardPolicy.DATA (OFF feeds every worker every row), "
                "or shard by input_context.input_pipeline_id in distribute_datasets_from_function"
            )
        out.append(
            Finding(
                "replicas feed the same rows (no sharding)",
                f"{tag}'s {run.world_size} replicas feed each other's rows at {same} of {judged} "
                f"steps: each sees the same data, so {tag} trains on 1/{run.world_size} of the "
                f"rows the other run does per step",
                [fix(run, tag, needles, change)],
                step=1,
            )
        )
    return out


def auto_shard(run: Recorded) -> str | None:
    """A multi-worker Keras run's tf.data auto-shard policy, as its recorder read it."""
    data = run.config.data
    if run.framework != "tf" or data.workers < 2:
        return None
    return data.auto_shard_policy


def policies(a: Recorded, b: Recorded) -> list[Finding]:
    """Two multi-worker Keras runs whose datasets split over the workers by another tf.data
    auto-shard policy (FILE: whole files per worker; DATA: every worker reads all and keeps its
    share of each batch): the same rows in another order and split, which is no shuffle."""
    pa, pb = auto_shard(a), auto_shard(b)
    if pa is None or pb is None or pa == pb or not _rows_differ(a, b):
        return []  # AUTO is DATA on a dataset that reads no files: the same rows, no finding
    return [
        Finding(
            "different tf.data auto-shard policy",
            f"A's workers split its dataset by AutoShardPolicy.{pa}, B's by {pb} (FILE hands "
            f"each worker whole files, DATA each worker its share of every batch, AUTO is FILE "
            f"where the dataset reads files, else DATA)",
            [
                fix(
                    b,
                    "B",
                    ("auto_shard_policy", "AutoShardPolicy", "experimental_distribute"),
                    f"options.experimental_distribute.auto_shard_policy = AutoShardPolicy.{pa}",
                )
            ],
            step=1,
        )
    ]


def _rows_differ(a: Recorded, b: Recorded) -> bool:
    steps = range(1, min(len(a.steps), len(b.steps)) + 1)
    return any(
        [sorted(r.digests(KIND)) for r in a.rows(s)] != [sorted(r.digests(KIND)) for r in b.rows(s)]
        for s in steps
    )


def splits_differ(a: Recorded, b: Recorded) -> bool:
    """Whether one of these diagnoses explains rows that differ between the runs."""
    return bool(duplicated(a, b) or policies(a, b))


def sampler_kind(run: Recorded) -> str:
    """How a torch run's replicas get their rows, in words: its sampler's type, or an
    IterableDataset's own split (DataLoader's _InfiniteConstantSampler)."""
    kind = str(run.config.sampler.type or "")
    if kind == "_InfiniteConstantSampler":
        return "IterableDataset (its own split over the ranks)"
    return kind or "loader (no sampler recorded)"


def orders_in_words(a: Recorded, b: Recorded) -> str:
    if a.framework == b.framework == "torch" and sampler_kind(a) != sampler_kind(b):
        return f"(A's {sampler_kind(a)}, B's {sampler_kind(b)}: another order or split)"
    if any(r.config.data.fit_shuffle for r in (a, b)):
        return "(the shuffles differ: fit shuffles its NumPy arrays every epoch by default)"
    return "(the shuffles differ: a seed, a sampler against tf.data's buffer)"


def sampler_needles(run: Recorded) -> tuple[str, ...]:
    """Where a torch script picks its rows: its recorded sampler's call first."""
    kind = str(run.config.sampler.type or "")
    if kind == "DistributedSampler":
        return ("DistributedSampler(",)
    own = (f"{kind}(",) if kind and not kind.startswith("_") else ()
    return (*own, "IterableDataset", "Sampler)", "def __iter__", "DataLoader(")


def sharding_convention(a: Recorded, b: Recorded) -> list[Finding]:
    """The split's convention, named from the configurations while the orders differ anyway."""
    kinds = {run.framework: run for run in (a, b)}
    torch_run, tf_run = kinds.get("torch"), kinds.get("tf")
    if torch_run is None or tf_run is None:
        return []
    if torch_run.config.sampler.type != "DistributedSampler":
        return []
    found = sharding(a, b, 0)
    found.evidence = (
        "not yet seen in the rows (the global orders differ first), but set up: "
        + found.evidence.partition(": ")[2]
    )
    found.step = None
    return [found]


def sharding(a: Recorded, b: Recorded, step: int) -> Finding:
    if a.framework == b.framework == "tf":  # two Keras runs: no DistributedSampler to name
        kinds = [r.config.data.kind or "fit's input" for r in (a, b)]
        return Finding(
            "global batches split differently over the replicas",
            f"step {step}: the same global batch, split differently over the replicas (A feeds "
            f"fit a {kinds[0]}, B a {kinds[1]}: contiguous blocks of each batch against a split "
            f"the script's dataset function makes)",
            [
                fix(
                    b,
                    "B",
                    ("distribute_datasets_from_function", "experimental_distribute_dataset"),
                    "split each global batch as A does (the same distributed dataset)",
                )
            ],
            step=step,
        )
    if a.framework == b.framework == "torch":  # two torch runs: each its own sampler
        return Finding(
            "global batches split differently over the replicas",
            f"step {step}: the same global batch, split differently over the replicas (A's "
            f"{sampler_kind(a)}, B's {sampler_kind(b)}; a DistributedSampler hands replica r "
            f"the rows r, r+W, ... of the order)",
            [
                fix(run, tag, sampler_needles(run), f"split each global batch as {other} does")
                for run, tag, other in ((a, "A", "B"), (b, "B", "A"))
            ],
            step=step,
        )
    fixes = []
    for run, tag in ((a, "A"), (b, "B")):
        if run.framework == "torch":
            fixes.append(
                fix(
                    run,
                    tag,
                    ("DistributedSampler(",),
                    "give rank r the contiguous "
                    "block r of each global batch (a batch sampler over the global "
                    "order), as MirroredStrategy splits a batch",
                )
            )
        else:
            fixes.append(
                fix(
                    run,
                    tag,
                    ("experimental_distribute_dataset", ".batch("),
                    "or feed replica r the rows r, r+W, ... of each global batch "
                    "(`strategy.distribute_datasets_from_function`)",
                )
            )
    return Finding(
        "DistributedSampler interleaving vs tf.data auto-shard",
        f"step {step}: the same global batch, split differently over the replicas "
        f"(DistributedSampler hands replica r the rows r, r+W, ... of the order; "
        f"MirroredStrategy splits each global batch into contiguous blocks)",
        fixes,
        step=step,
    )

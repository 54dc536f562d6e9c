"""The diagnoses of two recorded runs: the classic differences between a DDP script and a Keras
``fit`` script, each with its evidence and the line to change. The data pipeline's differences
are read from the sample digests (dualtrain.audit.samples); the rest from the lr, loss, gradient
norm and loss-scale records and the configuration the recorders read from the scripts' objects.
"""

from __future__ import annotations

from typing import Any

from dualtrain.audit import conventions as C
from dualtrain.audit.checks import paired_weights
from dualtrain.audit.finding import Finding, fix
from dualtrain.audit.read import Recorded
from dualtrain.audit.samples import SAMPLE_DIAGNOSES

OPT_LINES = ("optim.", "optimizers.")


def _change_points(run: Recorded) -> tuple[list[int], bool]:
    """Steps where the lr changes, and whether every change falls on an epoch's first step."""
    lr = run.series("lr")
    starts = {steps[0] for steps in run.epochs().values()}
    points = [i + 1 for i in range(1, len(lr)) if lr[i] != lr[i - 1]]
    return points, all(p in starts for p in points)


def schedule(a: Recorded, b: Recorded) -> list[Finding]:
    pa, epoch_a = _change_points(a)
    pb, epoch_b = _change_points(b)
    if pa and pb and epoch_a != epoch_b:
        return _granularity(a, b, pa, pb, epoch_a)
    return _base_lr(a, b) + _shape(a, b, pa, pb)


def _base_lr(a: Recorded, b: Recorded) -> list[Finding]:
    if not a.steps or not b.steps or C.same_value(a.steps[0]["lr"], b.steps[0]["lr"]):
        return []
    la, lb = a.steps[0]["lr"], b.steps[0]["lr"]
    return [
        Finding(
            "different base learning rate",
            f"step 1: lr {la:.6g} in A, {lb:.6g} in B (each optimizer's own default or "
            f"setting: A {_opt(a)}, B {_opt(b)})",
            [
                fix(a, "A", OPT_LINES, f"lr={lb:.6g}"),
                fix(b, "B", OPT_LINES, f"learning_rate={la:.6g}"),
            ],
            step=1,
        )
    ]


def _shape(a: Recorded, b: Recorded, pa: list[int], pb: list[int]) -> list[Finding]:
    """The same granularity, another schedule: the lr relative to step 1's parts."""
    ra, rb = a.series("lr"), b.series("lr")
    if not ra or not rb or not ra[0] or not rb[0]:
        return []
    rel_a = [float(x or 0) / float(ra[0]) for x in ra]
    rel_b = [float(x or 0) / float(rb[0]) for x in rb]
    pairs = zip(rel_a, rel_b, strict=False)
    first = next((i + 1 for i, (x, y) in enumerate(pairs) if not C.same_value(x, y)), None)
    if first is None:
        return []
    return [
        Finding(
            "different lr schedules",
            f"relative to step 1, the lr parts at step {first}: {rel_a[first - 1]:.4g}x in A "
            f"(changes at steps {pa[:6]}), {rel_b[first - 1]:.4g}x in B (changes at steps "
            f"{pb[:6]})",
            [
                fix(a, "A", ("StepLR", "lr_scheduler", "scheduler"), "the schedule B follows"),
                fix(
                    b,
                    "B",
                    ("LearningRateScheduler", "schedules.", "def decay"),
                    "the schedule A follows",
                ),
            ],
            step=first,
        )
    ]


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
            fixes.append(fix(run, tag, ("scheduler.step()", "lr_scheduler"), change))
        else:
            change = (
                "a LearningRateScheduler callback sets the lr per epoch; a "
                "`keras.optimizers.schedules.LearningRateSchedule` per step: use the other "
                "script's granularity"
            )
            fixes.append(fix(run, tag, ("LearningRateScheduler", "schedules."), change))
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


def _opt(run: Recorded) -> str:
    return C.describe_optimizer(run.framework, run.config.get("optimizer", {}))


def optimizer(a: Recorded, b: Recorded) -> list[Finding]:
    oa, ob = a.config.get("optimizer", {}), b.config.get("optimizer", {})
    if not oa or not ob:
        return []
    if a.framework == b.framework:
        diff = sorted(k for k in set(oa) | set(ob) if not C.same_value(oa.get(k), ob.get(k)))
        diff = [k for k in diff if k not in ("initial_lr", "lr", "learning_rate", "name")]
        if not diff:
            return []
        return [
            Finding(
                "different optimizer settings",
                f"A {_opt(a)}, B {_opt(b)} (differ in {', '.join(diff)})",
                [fix(a, "A", OPT_LINES, f"the same {', '.join(diff)} as B")],
            )
        ]
    (t, tt), (k, kt) = ((oa, "A"), (ob, "B")) if a.framework == "torch" else ((ob, "B"), (oa, "A"))
    trun, krun = (a, b) if a.framework == "torch" else (b, a)
    if C.SAME_OPTIMIZER.get(t.get("type", "")) != k.get("type"):
        return [
            Finding(
                "different optimizers",
                f"{tt} uses {_opt(trun)}, {kt} uses {_opt(krun)}",
                [
                    fix(trun, tt, OPT_LINES, f"the optimizer {kt} uses, with its options"),
                    fix(
                        krun,
                        kt,
                        OPT_LINES,
                        f"keras.optimizers.{C.SAME_OPTIMIZER.get(t['type'], t['type'])}"
                        f" with {tt}'s options",
                    ),
                ],
            )
        ]
    return _conventions(t, k, trun, krun, tt, kt)


def _conventions(
    t: dict[str, Any], k: dict[str, Any], trun: Recorded, krun: Recorded, tt: str, kt: str
) -> list[Finding]:
    out = []
    for tname, kname, what in C.OPTIONS.get(t["type"], []):
        tv, kv = C.torch_option(t, tname), k.get(kname)
        if not C.same_value(tv, kv):
            out.append(f"{what}: torch {tname}={tv!r}, Keras {kname}={kv!r}")
    if (
        t["type"] in ("Adam", "SGD", "RMSprop", "Adagrad", "Adadelta")
        and (t.get("weight_decay") or 0) > 0
    ):
        out.append(
            f"weight decay: torch {t['type']}'s weight_decay={t['weight_decay']} is an L2 term "
            f"in the gradient; Keras's weight_decay is decoupled (AdamW-style)"
        )
    if t["type"] == "SGD" and (t.get("momentum") or 0) > 0 and len(set(trun.series("lr"))) > 1:
        out.append(
            "momentum: torch's buffer holds gradients (lr applied after), Keras's holds "
            "lr-scaled steps: they part when the lr changes"
        )
    if not out:
        return []
    return [
        Finding(
            "optimizer conventions (momentum, epsilon, weight decay)",
            "; ".join(out),
            [
                fix(krun, kt, OPT_LINES, "the torch values under Keras's names"),
                fix(trun, tt, OPT_LINES, "or the Keras values under torch's names"),
            ],
        )
    ]


def loss_scale(a: Recorded, b: Recorded) -> list[Finding]:
    la, lb = a.config.get("loss_scale"), b.config.get("loss_scale")
    if not la and not lb:
        return []
    if not la or not lb:
        kind = (la or lb or {}).get("type")
        tag = "A" if la else "B"
        off, otag = (b, "B") if la else (a, "A")
        return [
            Finding(
                "loss scaling in one run only",
                f"{tag} scales the loss ({kind}), {otag} does not",
                [
                    fix(
                        off,
                        otag,
                        ("GradScaler", "LossScaleOptimizer", OPT_LINES[0], OPT_LINES[1]),
                        "scale the loss too (GradScaler / LossScaleOptimizer)",
                    )
                ],
                step=1,
            )
        ]
    diff = [
        f"{key} {la[key]:g} in A, {lb[key]:g} in B"
        for key in ("initial_scale", "growth_interval", "growth_factor", "backoff_factor")
        if not C.same_value(la[key], lb[key])
    ]
    if not diff:
        return []
    fixes = []
    for run, tag, other in ((a, "A", lb), (b, "B", la)):
        if run.framework == "torch":
            change = (
                f"GradScaler(init_scale={other['initial_scale']:g}, "
                f"growth_interval={other['growth_interval']})"
            )
        else:
            change = (
                f"LossScaleOptimizer(opt, initial_scale={other['initial_scale']:g}, "
                f"dynamic_growth_steps={other['growth_interval']})"
            )
        fixes.append(fix(run, tag, ("GradScaler", "LossScaleOptimizer"), change))
    return [
        Finding(
            "loss-scale defaults (LossScaleOptimizer 2**15 vs GradScaler 2**16)",
            "; ".join(diff) + " (Keras's LossScaleOptimizer starts at 2**15 and grows every 2000 "
            "steps; torch's GradScaler starts at 2**16, every 2000)",
            fixes[:1],
            step=1,
        )
    ]


def batchnorm(a: Recorded, b: Recorded) -> list[Finding]:
    ba, bb = a.config.get("batchnorm", []), b.config.get("batchnorm", [])
    out = []
    for x, y in zip(ba, bb, strict=False):
        # torch: running = (1 - m) running + m batch; Keras: running = m running + (1 - m) batch
        keep_x = 1 - x["momentum"] if x["convention"] == "torch" else x["momentum"]
        keep_y = 1 - y["momentum"] if y["convention"] == "torch" else y["momentum"]
        if not C.same_value(keep_x, keep_y):
            out.append(
                f"{x['name']}/{y['name']}: A keeps {keep_x:g} of the running statistics per step "
                f"(momentum={x['momentum']:g}, {x['convention']}'s convention), B {keep_y:g} "
                f"(momentum={y['momentum']:g}, {y['convention']}'s)"
            )
        if not C.same_value(x["eps"], y["eps"]):
            out.append(f"{x['name']}/{y['name']}: eps {x['eps']:g} in A, {y['eps']:g} in B")
    if not out:
        return []
    fixes = [
        fix(
            run,
            tag,
            ("BatchNorm",),
            "torch momentum m is Keras momentum 1 - m (torch 0.1 "
            "= Keras 0.9; Keras's default 0.99); eps 1e-5 (torch) vs 1e-3 (Keras)",
        )
        for run, tag in ((a, "A"), (b, "B"))
    ]
    return [Finding("BatchNorm momentum convention", "; ".join(out), fixes)]


def reduction(a: Recorded, b: Recorded) -> list[Finding]:
    """A sum-reduced loss is ~ the local batch times a mean one; a gradient summed over the
    replicas instead of averaged is ~ the world size times larger (at step 1, same weights)."""
    if not a.steps or not b.steps:
        return []
    (sa, sb), out = (a.steps[0], b.steps[0]), []
    ratio = float(sa["loss"]) / float(sb["loss"]) if float(sb["loss"]) else 0.0
    local = sa["samples"] / max(a.world_size, 1)
    for r, tag, run, other in ((ratio, "A", a, "B"), (1 / ratio if ratio else 0, "B", b, "A")):
        if local > 2 and abs(r / local - 1) < 0.25:
            change = (
                "reduction='mean' (the local batch's mean; DDP averages the replicas)"
                if run.framework == "torch"
                else "reduction='sum_over_batch_size'"
            )
            out.append(
                Finding(
                    "per-replica loss reduction (sum vs mean)",
                    f"step 1: {tag}'s loss is {r:.1f}x {other}'s, about the local batch "
                    f"({local:g} rows): {tag} sums its replica's losses where {other} averages",
                    [fix(run, tag, ("loss", "reduction"), change)],
                    step=1,
                )
            )
    ga, gb = float(sa.get("grad_norm") or 0), float(sb.get("grad_norm") or 0)
    same_start = not isinstance(paired_weights(a, b), str) and not out
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
                        [
                            fix(
                                a if tag == "A" else b,
                                tag,
                                ("loss",),
                                "scale each replica's loss by "
                                "1/num_replicas (Keras: the global batch size)",
                            )
                        ],
                        step=1,
                    )
                )
    return out


def architecture(a: Recorded, b: Recorded) -> list[Finding]:
    pairs = paired_weights(a, b)
    if isinstance(pairs, str):
        return [
            Finding(
                "different models",
                f"the initial arrays do not pair: {pairs}",
                [
                    fix(
                        b,
                        "B",
                        ("Sequential", "Conv2D", "nn.Module", "layers."),
                        "the same layers as A (then load A's weights_init.npz)",
                    )
                ],
                step=0,
            )
        ]
    return []


DIAGNOSES = (
    architecture,
    *SAMPLE_DIAGNOSES,
    schedule,
    optimizer,
    loss_scale,
    batchnorm,
    reduction,
)


def diagnose(a: Recorded, b: Recorded) -> list[Finding]:
    """Every classic difference the records show, earliest step first."""
    found = [f for d in DIAGNOSES for f in d(a, b)]
    return sorted(found, key=lambda f: -1 if f.step is None else f.step)

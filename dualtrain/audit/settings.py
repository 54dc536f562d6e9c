"""The diagnoses read from the settings the recorders took from the scripts' objects: the
optimizer and its conventions (momentum, epsilon, weight decay), the loss-scale rule, BatchNorm's
momentum convention, the precision policy. Each is a line of a script to change, except the
``inherent`` ones (a framework's convention no setting changes)."""

from __future__ import annotations

from typing import Any

import numpy as np

from dualtrain.audit import conventions as C
from dualtrain.audit.batchnorm import batchnorm, synchronized
from dualtrain.audit.clipping import clipping
from dualtrain.audit.cycles import OWNED, cycled, momentum_cycle, without_momentum
from dualtrain.audit.ema import ema
from dualtrain.audit.finding import OPT_LINES, fix, opt_lines
from dualtrain.audit.modes import eval_mode
from dualtrain.audit.plateau import plateau
from dualtrain.audit.read import Recorded
from dualtrain.records.verdict import Finding

#: parameter-group keys a torch scheduler owns (OneCycleLR, CyclicLR, SWALR): not settings
SCHEDULER_KEYS = ("lr", "initial_lr", "max_lr", "min_lr", "base_momentum", "max_momentum", "swa_lr")

#: torch optimizer options that pick an implementation of one update rule, not the rule
IMPLEMENTATION = ("foreach", "fused", "capturable", "differentiable")


def describe(run: Recorded) -> str:
    return C.describe_optimizer(run.framework, run.config.get("optimizer", {}))


def _group_differences(oa: dict[str, Any], ob: dict[str, Any]) -> list[str]:
    """``group N's OPTION`` for each option of a parameter group beyond the first that differs
    (the torch recorder's ``groups``: every group's options but its lr)."""
    ga, gb = oa.get("groups") or [], ob.get("groups") or []
    out = []
    for n, (x, y) in enumerate(zip(ga, gb, strict=False)):
        out += [
            f"group {n}'s {k}"
            for k in sorted(set(x) | set(y))
            if n > 0 and k not in IMPLEMENTATION and not C.same_value(x.get(k), y.get(k))
        ]
    if len(ga) != len(gb) and ga and gb:
        out.append(f"the number of parameter groups ({len(ga)} and {len(gb)})")
    return out


def optimizer(a: Recorded, b: Recorded) -> list[Finding]:
    oa, ob = a.config.get("optimizer", {}), b.config.get("optimizer", {})
    if not oa or not ob:
        return []
    if a.framework == b.framework:
        if cycled(a) or cycled(b):  # a scheduler's, judged by momentum_cycle
            oa, ob = without_momentum(oa), without_momentum(ob)
        diff = sorted(k for k in set(oa) | set(ob) if not C.same_value(oa.get(k), ob.get(k)))
        ignored = (*SCHEDULER_KEYS, *IMPLEMENTATION, "learning_rate", "name", "wrapper", "groups")
        keys = [k for k in diff if k not in ignored]
        diff = keys + _group_differences(oa, ob)
        if not diff:
            return []
        values = "; ".join(
            [f"{k}: {C.short(oa.get(k))} in A, {C.short(ob.get(k))} in B" for k in keys]
            + diff[len(keys) :]
        )
        return [
            Finding(
                "different optimizer settings",
                f"A {describe(a)}, B {describe(b)} (differ in {values})",
                [
                    fix(a, "A", opt_lines(a), f"the same {', '.join(diff)} as B"),
                    fix(b, "B", opt_lines(b), f"or the same {', '.join(diff)} as A"),
                ],
            )
        ]
    (t, tt), (k, kt) = ((oa, "A"), (ob, "B")) if a.framework == "torch" else ((ob, "B"), (oa, "A"))
    trun, krun = (a, b) if a.framework == "torch" else (b, a)
    if C.keras_class(t.get("type", "")) != k.get("type"):
        return [
            Finding(
                "different optimizers",
                f"{tt} uses {describe(trun)}, {kt} uses {describe(krun)}",
                [
                    fix(trun, tt, opt_lines(trun), f"the optimizer {kt} uses, with its options"),
                    fix(
                        krun,
                        kt,
                        opt_lines(krun),
                        f"keras.optimizers.{C.keras_class(t['type'])} with {tt}'s options"
                        if C.keras_class(t.get("type", ""))
                        else f"Keras has no {t.get('type')}: an optimizer both frameworks have "
                        f"(SGD, Adam, AdamW, RMSprop, ...) in both scripts",
                    ),
                ],
            )
        ]
    return _conventions(t, k, trun, krun, tt, kt)


def _conventions(
    t: dict[str, Any], k: dict[str, Any], trun: Recorded, krun: Recorded, tt: str, kt: str
) -> list[Finding]:
    out = []
    for tname, kname, what in C.keras_options(t["type"]):
        if tname in OWNED and cycled(trun):
            continue  # the scheduler's, judged by momentum_cycle
        tv, kv = C.torch_option(t, tname), k.get(kname)
        if not C.same_value(tv, kv):
            out.append(f"{what}: torch {tname}={tv!r}, Keras {kname}={kv!r}")
    out += _weight_decay(t, k)
    if t["type"] == "NAdam" and not C.same_value(t.get("momentum_decay", 4e-3), 1.0):
        out.append(
            f"NAdam's momentum schedule: torch's mu_t = beta1 (1 - 0.5 * 0.96**(t * "
            f"momentum_decay)) with momentum_decay={t.get('momentum_decay')}; Keras's Nadam "
            f"uses 0.96**t, which is torch's momentum_decay=1.0"
        )
    out += C.keras_only(t, k)
    found = []
    if out:
        found.append(
            Finding(
                "optimizer conventions (momentum, epsilon, weight decay)",
                "; ".join(out),
                [
                    fix(krun, kt, opt_lines(krun), "the torch values under Keras's names"),
                    fix(trun, tt, opt_lines(trun), "or the Keras values under torch's names"),
                ],
            )
        )
    both = (t.get("momentum") or 0) > 0 and (k.get("momentum") or 0) > 0  # else: an option's
    if t["type"] == "SGD" and both and len(set(trun.series("lr"))) > 1:
        found.append(
            Finding(
                "SGD momentum convention under a changing lr",
                "torch's momentum buffer holds gradients (the lr applied after), Keras's holds "
                "lr-scaled steps: the two part where the lr changes (no setting of either "
                "optimizer changes it)",
                [],
                inherent=True,
            )
        )
    return found


def _weight_decay(t: dict[str, Any], k: dict[str, Any]) -> list[str]:
    """torch's weight_decay is an L2 term in the gradient (but AdamW's, and Adam's or NAdam's
    with ``decoupled_weight_decay=True``); every Keras optimizer's is decoupled."""
    tw, kw = t.get("weight_decay") or 0, k.get("weight_decay") or 0
    if t["type"] == "AdamW":
        return []  # C.keras_options compares it
    if t.get("decoupled_weight_decay"):
        same = C.same_value(tw, kw)
        return [] if same else [f"weight decay: torch weight_decay={tw}, Keras weight_decay={kw}"]
    if tw > 0:
        return [
            f"weight decay: torch {t['type']}'s weight_decay={tw} is an L2 term in the "
            f"gradient; Keras's weight_decay is decoupled (AdamW-style)"
        ]
    if kw > 0:
        return [
            f"weight decay: Keras {k.get('type')}'s weight_decay={kw} decays the weights "
            f"(decoupled, AdamW-style); torch's {t['type']} has none (weight_decay=0)"
        ]
    return []


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


def precision(a: Recorded, b: Recorded) -> list[Finding]:
    """Parameters of another dtype (a float64 or bfloat16 model), or, where both recorders read
    one, another compute dtype (Keras's mixed_bfloat16 policy against float32)."""
    out: list[Finding] = []
    for key, what in (("param_dtype", "parameters"), ("compute_dtype", "compute dtype")):
        pa, pb = _precision(a, key), _precision(b, key)
        if key == "compute_dtype" and _own(a) and _own(b) and out:
            continue  # each computes in its parameters' dtype: that finding says it
        if pa and pb and pa != pb:
            out.append(
                Finding(
                    f"different {what} ({pa} vs {pb})",
                    f"A's {what}: {pa}, B's: {pb} (the precision the model trains in)",
                    [
                        _precision_fix(a, "A", key, pb, "B"),
                        _precision_fix(b, "B", key, pa, "A"),
                    ],
                )
            )
    return out


def _own(run: Recorded) -> bool:
    """The run computes in its parameters' dtype (no autocast, no mixed policy)."""
    return _precision(run, "compute_dtype") in (None, _precision(run, "param_dtype"))


def _precision_fix(run: Recorded, tag: str, key: str, dtype: str, other: str) -> str:
    """The line that sets ``run``'s precision; a torch compute dtype is autocast's (where the
    run used it, else its parameters' dtype's)."""
    autocast = (run.config.get("precision") or {}).get("autocast")
    if run.framework != "torch" or key != "compute_dtype" or not (autocast or dtype in HALF):
        floatx = ("set_floatx",) if run.framework == "tf" and key == "param_dtype" else ()
        return fix(run, tag, (*floatx, *PRECISION_LINES[run.framework]), f"{dtype}, as {other}")
    change = (
        f"`torch.autocast(device_type, dtype=torch.{dtype})` around the forward and the loss"
        if dtype in HALF
        else f"no autocast ({dtype}), as {other}"
    )
    return fix(run, tag, ("autocast(", *PRECISION_LINES["torch"]), change)


def _precision(run: Recorded, key: str) -> str | None:
    """A recorded precision fact (Keras's variables' dtype counts as the parameters')."""
    cfg = run.config.get("precision") or {}
    value = cfg.get(key) or (cfg.get("variable_dtype") if key == "param_dtype" else None)
    return None if value is None else str(value)


def held(a: Recorded, b: Recorded) -> list[Finding]:
    """Trainable parameters the recorded optimizer of one run does not hold and the other's does
    (a torch script's second optimizer, or parameters it never updates; a Keras ``fit`` updates
    every trainable variable): the lr and settings checks judge only what each recorder saw."""
    na, nb = (set((r.config.get("not_held") or {}).get("names", [])) for r in (a, b))
    if na == nb:
        return _moved_apart(a, b, na)
    out = []
    for run, tag, names in ((a, "A", na - nb), (b, "B", nb - na)):
        if names:
            listed = ", ".join(sorted(names)[:4]) + (", ..." if len(names) > 4 else "")
            of = (run.config.get("not_held") or {}).get("of", "?")
            out.append(
                Finding(
                    "parameters outside the recorded optimizer",
                    f"{tag}'s recorded optimizer does not hold {len(names)} of its {of} trainable "
                    f"parameters ({listed}), the other's does: a second optimizer steps them "
                    f"(its lr and options unjudged), or nothing does",
                    [
                        fix(
                            run,
                            tag,
                            opt_lines(run),
                            "one optimizer over every trainable parameter (a parameter group "
                            "for each lr and options)",
                        )
                    ],
                )
            )
    return out


def _moved(run: Recorded, names: set[str]) -> set[str]:
    init, final = run.weights_init, run.weights_final
    return {n for n in names if n in init and n in final and not np.array_equal(init[n], final[n])}


def _moved_apart(a: Recorded, b: Recorded, names: set[str]) -> list[Finding]:
    """The same parameters outside both recorded optimizers, updated in one run only (a second
    optimizer in one script, none in the other)."""
    ma, mb = _moved(a, names), _moved(b, names)
    if ma == mb:
        return []
    (on, tag, moved), (off, otag) = (
        ((a, "A", ma), (b, "B")) if ma - mb else ((b, "B", mb), (a, "A"))
    )
    listed = ", ".join(sorted(moved)[:4]) + (", ..." if len(moved) > 4 else "")
    return [
        Finding(
            "parameters outside the recorded optimizer updated in one run only",
            f"{tag}'s {listed} change during the run though its recorded optimizer does not hold "
            f"them (another optimizer steps them: its lr and options unjudged); {otag}'s stay as "
            f"they started",
            [fix(off, otag, opt_lines(off), f"update them as {tag} does (its other optimizer)")],
        )
    ]


def frozen(a: Recorded, b: Recorded) -> list[Finding]:
    """Parameters frozen in one run and trained in the other (torch ``requires_grad_(False)``,
    Keras ``trainable = False``): by name between two runs of a framework, by number of values
    across frameworks (their names differ); the finding goes to the run that freezes more."""
    fa, fb = ((r.config.get("frozen") or {}) for r in (a, b))
    same = a.framework == b.framework
    if (set(fa) == set(fb)) if same else (sum(fa.values()) == sum(fb.values())):
        return []
    out = []
    for run, tag, mine, theirs in ((a, "A", fa, fb), (b, "B", fb, fa)):
        only = sorted(set(mine) - set(theirs)) if same else sorted(mine)
        if not only or (not same and sum(mine.values()) < sum(theirs.values())):
            continue
        listed = ", ".join(only[:4]) + (", ..." if len(only) > 4 else "")
        values = sum(mine[n] for n in only)
        other = "trains them" if same else f"freezes {sum(theirs.values())} values"
        torch_run = run.framework == "torch"
        out.append(
            Finding(
                "parameters frozen in one run only",
                f"{tag} freezes {listed} ({values} values) where the other run {other}",
                [
                    fix(
                        run,
                        tag,
                        ("requires_grad",) if torch_run else ("trainable",),
                        "train them as the other run does (requires_grad_(True))"
                        if torch_run
                        else "train them as the other run does (the layers' trainable = True)",
                    )
                ],
            )
        )
    return out


#: where each framework's scripts set their precision
HALF = ("bfloat16", "float16")
PRECISION_LINES = {
    "torch": ("set_default_dtype", ".double()", ".half()", ".bfloat16()", ".to("),
    "tf": ("set_global_policy", "dtype_policy", "dtype="),
}

SETTINGS_DIAGNOSES = (
    optimizer,
    momentum_cycle,
    plateau,
    held,
    frozen,
    loss_scale,
    batchnorm,
    synchronized,
    precision,
    clipping,
    eval_mode,
    ema,
)

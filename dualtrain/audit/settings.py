"""The diagnoses read from the settings the recorders took from the scripts' objects: the
optimizer (dualtrain.audit.optimizers), the loss-scale rule, BatchNorm's momentum convention, the
precision policy, frozen and held parameters. Each is a line of a script to change, except the
``inherent`` ones (a framework's convention no setting changes)."""

from __future__ import annotations

import numpy as np

from dualtrain.audit import conventions as C
from dualtrain.audit.batchnorm import batchnorm, synchronized
from dualtrain.audit.clipping import clipping
from dualtrain.audit.config import LossScale
from dualtrain.audit.cycles import momentum_cycle
from dualtrain.audit.ema import ema
from dualtrain.audit.finding import OPT_LINES, fix, opt_lines
from dualtrain.audit.modes import eval_mode
from dualtrain.audit.optimizers import optimizer
from dualtrain.audit.plateau import plateau
from dualtrain.audit.read import Recorded
from dualtrain.records.verdict import Edit, Finding


def loss_scale(a: Recorded, b: Recorded) -> list[Finding]:
    la, lb = a.config.loss_scale, b.config.loss_scale
    if la is None or lb is None:
        scaled = la or lb
        if scaled is None:
            return []
        kind = scaled.type
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
        f"{key} {la.setting(key):g} in A, {lb.setting(key):g} in B"
        for key in LossScale.SETTINGS
        if not C.same_value(la.setting(key), lb.setting(key))
    ]
    if not diff:
        return []
    fixes, edits = [], []
    for run, tag, other in ((a, "A", lb), (b, "B", la)):
        keys = ("initial_scale", "growth_interval")
        edits.append([Edit(tag, ("loss_scale", key), getattr(other, key)) for key in keys])
        if run.framework == "torch":
            change = (
                f"GradScaler(init_scale={other.initial_scale:g}, "
                f"growth_interval={other.growth_interval})"
            )
        else:
            change = (
                f"LossScaleOptimizer(opt, initial_scale={other.initial_scale:g}, "
                f"dynamic_growth_steps={other.growth_interval})"
            )
        fixes.append(fix(run, tag, ("GradScaler", "LossScaleOptimizer"), change))
    return [
        Finding(
            "loss-scale defaults (LossScaleOptimizer 2**15 vs GradScaler 2**16)",
            "; ".join(diff) + " (Keras's LossScaleOptimizer starts at 2**15 and grows every 2000 "
            "steps; torch's GradScaler starts at 2**16, every 2000)",
            fixes[:1],
            step=1,
            edits=edits[:1],
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
    autocast = run.config.precision.autocast
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
    return run.config.precision.dtype(key)


def held(a: Recorded, b: Recorded) -> list[Finding]:
    """Trainable parameters the recorded optimizer of one run does not hold and the other's does
    (a torch script's second optimizer, or parameters it never updates; a Keras ``fit`` updates
    every trainable variable): the lr and settings checks judge only what each recorder saw."""
    na, nb = (set(r.config.not_held.names if r.config.not_held else ()) for r in (a, b))
    if na == nb:
        return _moved_apart(a, b, na)
    out = []
    for run, tag, names in ((a, "A", na - nb), (b, "B", nb - na)):
        if names:
            listed = ", ".join(sorted(names)[:4]) + (", ..." if len(names) > 4 else "")
            of = run.config.not_held.of if run.config.not_held else "?"
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
    fa, fb = (r.config.frozen for r in (a, b))
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

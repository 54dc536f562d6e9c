"""The optimizer diagnoses of two recorded runs: another optimizer, other settings of one (its
parameter groups' too), and a torch optimizer against its Keras counterpart under each
framework's conventions (momentum, epsilon, weight decay's coupling, NAdam's schedule), each fix
the values to write in that script's framework's names."""

import re
from collections.abc import Mapping
from typing import Any

from dualtrain.audit import conventions as C
from dualtrain.audit import penalties as P
from dualtrain.audit.cycles import OWNED, cycled, without_momentum
from dualtrain.audit.decay import Exclusion, exclude_call, exclusion, exclusion_differs
from dualtrain.audit.finding import fix, hf_trainer, opt_lines
from dualtrain.audit.read import Recorded
from dualtrain.records.verdict import Edit, Finding

#: parameter-group keys a torch scheduler owns (OneCycleLR, CyclicLR, SWALR): not settings
SCHEDULER_KEYS = ("lr", "initial_lr", "max_lr", "min_lr", "base_momentum", "max_momentum", "swa_lr")

#: what an optimizer's record holds beside its options (its lr, names, groups and their parameters)
NOT_OPTIONS = ("learning_rate", "name", "wrapper", "groups", "group_params")

#: torch optimizer options that pick an implementation of one update rule, not the rule
IMPLEMENTATION = ("foreach", "fused", "capturable", "differentiable")


def describe(run: Recorded) -> str:
    return C.describe_optimizer(run.framework, run.config.optimizer)


def _group_differences(oa: Mapping[str, Any], ob: Mapping[str, Any]) -> list[str]:
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
    oa, ob = a.config.optimizer, b.config.optimizer
    if not oa or not ob:
        return []
    if a.framework == b.framework:
        if cycled(a) or cycled(b):  # a scheduler's, judged by momentum_cycle
            oa, ob = without_momentum(oa), without_momentum(ob)
        diff = sorted(k for k in set(oa) | set(ob) if not C.same_value(oa.get(k), ob.get(k)))
        ignored = (*SCHEDULER_KEYS, *IMPLEMENTATION, *NOT_OPTIONS)
        keys = [k for k in diff if k not in ignored]
        diff = keys + _group_differences(oa, ob)
        if not diff:
            return []
        values = "; ".join(
            [f"{k}: {C.short(oa.get(k))} in A, {C.short(ob.get(k))} in B" for k in keys]
            + diff[len(keys) :]
        )
        edits = [  # (a parameter group's option is no value of the recorded optimizer's)
            [Edit(tag, ("optimizer", key), other.get(key)) for key in keys]
            for tag, other in (("A", ob), ("B", oa))
        ]
        return [
            Finding(
                "different optimizer settings",
                f"A {describe(a)}, B {describe(b)} (differ in {values})",
                [
                    fix(a, "A", opt_lines(a), _same_as(keys, ob, diff[len(keys) :], "B")),
                    fix(b, "B", opt_lines(b), "or " + _same_as(keys, oa, diff[len(keys) :], "A")),
                ],
                edits=[] if len(diff) > len(keys) else edits,
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


#: a Keras L2 regularizer on every weight, as the Keras recorder's loss_terms lists one
def _l2_everywhere(l2: float) -> list[dict[str, Any]]:
    return [{"layer": "*", "kind": kind, "type": "L2", "l2": l2} for kind in ("kernel", "bias")]


Decay = tuple[str, str, list[Edit], list[Edit]]

#: torch optimizers with a ``decoupled_weight_decay`` option (Keras's decay, AdamW-style)
DECOUPLABLE = ("Adam", "NAdam", "RAdam")


def _same_as(keys: list[str], other: Mapping[str, Any], groups: list[str], tag: str) -> str:
    """``eps=1e-07, betas=(0.8, 0.999) (as B)``: the other run's values, and the parameter
    groups' options that differ, named."""
    said = [f"{k}={C.short(other.get(k))}" for k in keys]
    if groups:
        said.append(f"the same {', '.join(groups)}")
    return f"{', '.join(said)} (as {tag})"


def _decay_values(
    t: Mapping[str, Any],
    k: Mapping[str, Any],
    krun: Recorded,
    tags: tuple[str, str],
    excluded: Exclusion | None,
) -> Decay:
    """The weight decay to write, in each framework's words (Keras's first), with its edits of
    the records, where one value on each side makes them agree: torch's coupled
    ``weight_decay=wd`` adds wd * w to each gradient, which is Keras's ``L2(wd / 2)``
    regularizer on every weight (L2(l2) adds 2 * l2 * w); torch's decoupled decay (AdamW,
    ``decoupled_weight_decay=True``) is Keras's ``weight_decay``. Where no torch option makes
    Keras's decay (SGD has no decoupled one): the Keras value alone, no torch edits. ``tags``:
    the torch run's and the Keras run's; ``excluded``: what torch's decay-free groups hold."""
    tt, kt = tags
    tw, kw = t.get("weight_decay") or 0, k.get("weight_decay") or 0
    decoupled = t["type"] == "AdamW" or t.get("decoupled_weight_decay")
    wd = ("optimizer", "weight_decay")
    regs = ("loss_terms", "regularizers")
    if decoupled:
        keras, keras_edits = f"weight_decay={C.short(tw)}", [Edit(kt, wd, tw)]
        if tw and excluded is not None:  # torch's decay-free groups: left out of Keras's too
            keras += f", {exclude_call(excluded)}"
            keras_edits.append(Edit(kt, ("optimizer", "no_decay"), excluded.variables))
        return keras, f"weight_decay={C.short(kw)}", keras_edits, [Edit(tt, wd, kw)]
    reg = P.common_l2(krun)
    if reg is not None and not kw:  # the Keras model's L2 regularizers are its decay
        keep = f"L2({C.short(tw / 2)}) on every weight" if tw else "no weight regularizers"
        as_regs = _l2_everywhere(tw / 2) if tw else []
        return (
            keep,
            f"weight_decay={C.short(2 * reg)}",
            [Edit(kt, regs, as_regs)],
            [Edit(tt, wd, 2 * reg)],
        )
    l2 = C.short(tw / 2)
    keras = (
        f"kernel_regularizer=keras.regularizers.L2({l2}) and bias_regularizer="
        f"keras.regularizers.L2({l2}) on every layer, weight_decay=None (torch's weight_decay="
        f"{C.short(tw)} adds {C.short(tw)} * w to each gradient)"
        if tw
        else "weight_decay=None"
    )
    keras_edits = [Edit(kt, wd, None)] + ([Edit(kt, regs, _l2_everywhere(tw / 2))] if tw else [])
    if not kw:
        return keras, "weight_decay=0", keras_edits, [Edit(tt, wd, 0)]
    if "decoupled_weight_decay" in t or t["type"] in DECOUPLABLE:
        torch_edits = [Edit(tt, ("optimizer", "decoupled_weight_decay"), True), Edit(tt, wd, kw)]
        torch = f"decoupled_weight_decay=True, weight_decay={C.short(kw)}"
        return keras, torch, keras_edits, torch_edits
    no_option = f"(torch's {t['type']} has no decoupled weight decay: the Keras side's fix)"
    return keras, no_option, keras_edits, []


def _value_fixes(
    t: Mapping[str, Any],
    values: list[tuple[str, str, Any, Any]],
    rest: list[str],
    tags: tuple[str, str],
    decay: Decay | None = None,
    excluded: Exclusion | None = None,
) -> tuple[str, str, list[list[Edit]]]:
    """The options to write: the torch values under Keras's names (``epsilon=1e-08``) and the
    Keras values under torch's (``betas=(0.8, 0.999)``: a tuple option whole), plus the topics
    of the evidence that are no single value (weight decay's coupling, NAdam's schedule); and
    each side's edits of the records (``tags``: the torch run's and the Keras run's), none
    where a topic is no value. ``excluded``: what torch's decay-free groups hold, left out of
    a Keras weight_decay the fix writes."""
    tt, kt = tags
    keras_side = [f"{kname}={C.short(tv)}" for _, kname, tv, _ in values]
    keras_edits = [Edit(kt, ("optimizer", kname), tv) for _, kname, tv, _ in values]
    torch_edits = [Edit(tt, ("optimizer", tname), kv) for tname, _, _, kv in values]
    if excluded is not None and any(k == "weight_decay" and tv for _, k, tv, _ in values):
        keras_side.append(exclude_call(excluded))
        keras_edits.append(Edit(kt, ("optimizer", "no_decay"), excluded.variables))
    torch_side: list[str] = []
    tuples: dict[str, list[Any]] = {}
    for tname, _, _, kv in values:
        key, _, idx = tname.partition(".")
        if idx:
            tuples.setdefault(key, list(t.get(key) or []))[int(idx)] = kv
        else:
            torch_side.append(f"{tname}={C.short(kv)}")
    torch_side += [f"{key}=({', '.join(map(C.short, v))})" for key, v in tuples.items()]
    topics = sorted({line.split(":", 1)[0] for line in rest})
    if decay and "weight decay" in topics:
        topics.remove("weight decay")
        if decay[0] not in ", ".join(keras_side):  # (the values' weight_decay said it)
            keras_side.append(decay[0])
        if decay[1] not in ", ".join(torch_side):
            torch_side.append(decay[1])
        keras_edits += decay[2]
        torch_edits = torch_edits + decay[3] if decay[3] else []  # no torch value: unchecked
    also = f" (and the {', '.join(topics)} the evidence names)" if topics else ""
    if not keras_side:  # neither an option's value nor the weight decay's
        return (
            f"the same {', '.join(topics)} as the torch script",
            f"the {', '.join(topics)} of the Keras script",
            [],
        )
    edits = [] if topics else [keras_edits, torch_edits]  # a topic no value writes: unchecked
    keras_side, torch_side = list(dict.fromkeys(keras_side)), list(dict.fromkeys(torch_side))
    return ", ".join(keras_side) + also, ", ".join(torch_side) + also, edits


def _conventions(
    t: Mapping[str, Any], k: Mapping[str, Any], trun: Recorded, krun: Recorded, tt: str, kt: str
) -> list[Finding]:
    out: list[str] = []
    values: list[tuple[str, str, Any, Any]] = []  # (torch option, Keras option, torch, Keras)
    for tname, kname, what in C.keras_options(t["type"]):
        if tname in OWNED and cycled(trun):
            continue  # the scheduler's, judged by momentum_cycle
        tv, kv = C.torch_option(t, tname), k.get(kname)
        if not C.same_value(tv, kv):
            out.append(f"{what}: torch {tname}={tv!r}, Keras {kname}={kv!r}")
            values.append((tname, kname, tv, kv))
    rest = _weight_decay(t, k, krun)
    if t["type"] == "NAdam" and not C.same_value(t.get("momentum_decay", 4e-3), 1.0):
        rest.append(
            f"NAdam's momentum schedule: torch's mu_t = beta1 (1 - 0.5 * 0.96**(t * "
            f"momentum_decay)) with momentum_decay={t.get('momentum_decay')}; Keras's Nadam "
            f"uses 0.96**t, which is torch's momentum_decay=1.0"
        )
    excluded = exclusion(trun, krun)
    rest += C.keras_only(t, k, groups_known=excluded is not None)
    differs = exclusion_differs(krun, excluded)
    rest += [differs] if differs else []
    found = []
    if out or rest:
        decay = _decay_values(t, k, krun, (tt, kt), excluded)
        keras_fix, torch_fix, edits = _value_fixes(t, values, rest, (tt, kt), decay, excluded)
        torch_fix = trainer_names(torch_fix) if hf_trainer(trun) else torch_fix
        found.append(
            Finding(
                "optimizer conventions (momentum, epsilon, weight decay)",
                "; ".join(out + rest),
                [
                    fix(krun, kt, opt_lines(krun), keras_fix),
                    fix(trun, tt, opt_lines(trun), f"or {torch_fix}"),
                ],
                edits=edits,
            )
        )
    both = (t.get("momentum") or 0) > 0 and (k.get("momentum") or 0) > 0  # else: an option's
    changed = next(iter(trun.lr_changes()), None)
    if t["type"] == "SGD" and both and changed is not None:
        found.append(
            Finding(
                "SGD momentum convention under a changing lr",
                "torch's momentum buffer holds gradients (the lr applied after), Keras's holds "
                "lr-scaled steps: the two part where the lr changes, first at step "
                f"{changed} (no setting of either optimizer changes it)",
                [],
                step=changed,
                inherent=True,
            )
        )
    return found


def trainer_names(change: str) -> str:
    """torch.optim's option names as a Hugging Face Trainer's TrainingArguments spell them
    (its AdamW's eps and betas are adam_epsilon, adam_beta1 and adam_beta2)."""
    change = re.sub(r"\beps=", "adam_epsilon=", change)
    change = re.sub(r"\blr=", "learning_rate=", change)
    return re.sub(r"\bbetas=\(([^,]+), ([^)]+)\)", r"adam_beta1=\1, adam_beta2=\2", change)


def _weight_decay(t: Mapping[str, Any], k: Mapping[str, Any], krun: Recorded) -> list[str]:
    """torch's weight_decay is an L2 term in the gradient (but AdamW's, and Adam's or NAdam's
    with ``decoupled_weight_decay=True``); every Keras optimizer's is decoupled. A Keras model's
    L2(l2) regularizers on every weight add the gradient torch's coupled ``weight_decay=2 * l2``
    does."""
    tw, kw = t.get("weight_decay") or 0, k.get("weight_decay") or 0
    l2 = P.common_l2(krun)
    if t["type"] == "AdamW":
        return []  # C.keras_options compares it
    coupled = not t.get("decoupled_weight_decay")
    if coupled and not kw and l2 is not None:
        if C.same_value(tw, 2 * l2):
            return []  # the same gradient (the reported losses differ by the penalty)
        return [
            f"weight decay: Keras's L2({l2:g}) regularizers add {2 * l2:g} * w to each gradient; "
            f"torch {t['type']}'s weight_decay={tw}"
        ]
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

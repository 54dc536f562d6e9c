"""The gradient-clipping diagnoses: clipping in one run only, a different clipping rule, and
Keras's clipping of each replica's gradient before its all-reduce. A Keras run's clipping is its
optimizer's options; a torch run's is the calls its recorder saw run (torch's optimizers have no
such option)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dualtrain.audit.config import Clipping
from dualtrain.audit.finding import OPT_LINES, fix, hf_trainer, opt_lines
from dualtrain.audit.read import Recorded
from dualtrain.records.verdict import Edit, Finding

CLIP_OPTIONS = ("clipnorm", "global_clipnorm", "clipvalue")
CLIP_CALLS = ("clip_grad_norm_(", "clip_grad_value_(", "clip_grad_norm(")


def clips(run: Recorded) -> str | None:
    """How a run clips its gradients: a Keras optimizer's clip option; a torch loop's
    ``clip_grad_norm_`` / ``clip_grad_value_`` calls as the recorder saw them run (a limit of
    inf measures the norm and clips nothing); for a record without them, the script's line
    (torch's optimizers have no such option; the text is the only evidence left)."""
    if run.framework == "tf":
        opt = run.config.optimizer
        on = [f"{k}={opt[k]:g}" for k in CLIP_OPTIONS if isinstance(opt.get(k), (int, float))]
        return ", ".join(on) or None
    seen = run.config.clipping
    if seen is None:
        return run.line_of(*CLIP_CALLS)
    said = []
    for call in seen.calls:
        limits = [float(x) for x in _limits(call)]
        if all(math.isinf(x) for x in limits):
            continue
        shown = "/".join(f"{x:g}" for x in limits)
        active = call.get("active_steps")
        where = f" (active on {active})" if active is not None else ""
        said.append(f"{call['function']}({shown}) on {call['steps']} of {seen.steps} steps{where}")
    return "; ".join(said) or None


#: what clips, in both frameworks' words: (kind, limit) pairs
_KINDS = {
    "clip_grad_norm_": "global norm",
    "global_clipnorm": "global norm",
    "clipnorm": "norm per variable",
    "clip_grad_value_": "value",
    "clipvalue": "value",
}
CLIP_LINES = {"torch": CLIP_CALLS, "tf": (*CLIP_OPTIONS, *OPT_LINES)}


def _rule(run: Recorded) -> frozenset[tuple[str, float]] | None:
    """The run's clipping as (kind, limit) pairs, comparable across frameworks (torch's
    clip_grad_norm_ is Keras's global_clipnorm); None where it is known only from the text."""
    if run.framework == "tf":
        opt = run.config.optimizer
        return frozenset(
            (_KINDS[k], float(opt[k])) for k in CLIP_OPTIONS if isinstance(opt.get(k), (int, float))
        )
    seen = run.config.clipping
    if seen is None:
        return None
    return frozenset(
        (_KINDS[c["function"]], float(x))
        for c in seen.calls
        for x in map(float, _limits(c))
        if not math.isinf(x)
    )


def _limits(call: Mapping[str, Any]) -> list[Any]:
    """A recorded call's limits (the record writes inf as "inf": float() reads it back)."""
    return call["limit"] if isinstance(call["limit"], list) else [call["limit"]]


def _said(rule: frozenset[tuple[str, float]] | None) -> str:
    return ", ".join(f"{kind} {x:g}" for kind, x in sorted(rule or ())) or "nothing"


def clipping(a: Recorded, b: Recorded) -> list[Finding]:
    """Gradient clipping in one run only; and Keras's clipping under a strategy, which clips each
    replica's gradient before the all-reduce (keras/src/optimizers/base_optimizer.py: the
    optimizer's ``_clip_gradients`` runs before the TensorFlow backend's
    ``_all_reduce_sum_gradients``), where torch's ``clip_grad_norm_`` after DDP's all-reduce
    clips the averaged gradient."""
    ca, cb = clips(a), clips(b)
    if ca and cb and None not in (_rule(a), _rule(b)) and _rule(a) != _rule(b):
        written = _written(b, "B", _rule(a) or frozenset())
        return [
            Finding(
                "different gradient clipping",
                f"A clips by {_said(_rule(a))} ({ca}), B by {_said(_rule(b))} ({cb})",
                [
                    fix(
                        b,
                        "B",
                        CLIP_LINES[b.framework],
                        written[0]
                        if written
                        else f"clip as A: {_said(_rule(a))} (torch has no clipping of each "
                        f"variable's norm alone: a clip_grad_norm_ per parameter)",
                    )
                ],
                edits=[written[1]] if written else [],
            )
        ]
    if bool(ca) != bool(cb):
        on, tag, off, otag = (a, "A", b, "B") if ca else (b, "B", a, "A")
        limit = next((f"{x:g}" for kind, x in _rule(on) or () if kind == "global norm"), None)
        if hf_trainer(off):
            change = f"max_grad_norm={limit or 'max_norm'} in TrainingArguments"
        elif off.framework == "torch":
            change = (
                f"torch.nn.utils.clip_grad_norm_(model.parameters(), {limit or 'max_norm'}) "
                f"after backward"
            )
        else:
            change = f"the optimizer's global_clipnorm={limit or 'max_norm'}"
        rule = frozenset(x for x in _rule(on) or () if x[0] == "global norm")
        edits = _written(off, otag, rule) if limit else None
        return [
            Finding(
                "gradient clipping in one run only",
                f"{tag} clips its gradients ({ca or cb}), {otag} does not",
                [
                    fix(
                        off,
                        otag,
                        opt_lines(off)
                        if off.framework == "tf" or hf_trainer(off)
                        else ("backward()",),
                        change,
                    )
                ],
                edits=[edits[1]] if edits else [],
            )
        ]
    out = []
    for run, tag, how, other in ((a, "A", ca, b), (b, "B", cb, a)):
        if how and run.framework == "tf" and run.world_size > 1 and other.framework == "torch":
            out.append(
                Finding(
                    "Keras clips each replica's gradient before the all-reduce",
                    f"{tag} ({how}) clips each of its {run.world_size} replicas' gradients, then "
                    f"sums them; a DDP script's clip_grad_norm_ clips the averaged gradient (no "
                    f"Keras setting clips the sum); {_active(run, tag, other)}",
                    [],
                    step=_first_over(run),
                    inherent=True,
                )
            )
    return out


#: each kind of clipping, as each framework writes it: a Keras option, a torch call
_WRITTEN = {
    "global norm": ("global_clipnorm", "clip_grad_norm_"),
    "norm per variable": ("clipnorm", None),
    "value": ("clipvalue", "clip_grad_value_"),
}


def _written(run: Recorded, tag: str, rule: frozenset[tuple[str, float]]) -> Any:
    """``(the line's change, its edits of the record)`` that make ``run`` clip by ``rule`` (a
    Keras optimizer's options; a torch loop's calls after backward), or None where ``run``'s
    framework has no such clipping (torch clips no variable's norm alone)."""
    if run.framework == "tf":
        opt = dict.fromkeys(CLIP_OPTIONS)
        for kind, x in rule:
            opt[_WRITTEN[kind][0]] = x
        said = ", ".join(f"{k}={v:g}" for k, v in opt.items() if v is not None) or "no clipping"
        return said, [Edit(tag, ("optimizer", k), v) for k, v in opt.items()]
    if any(_WRITTEN[kind][1] is None for kind, _ in rule):
        return None
    steps = len(run.steps)
    written = [(_WRITTEN[kind][1], x) for kind, x in sorted(rule)]
    calls = [{"function": fn, "limit": x, "steps": steps} for fn, x in written]
    said = "; ".join(
        f"torch.nn.utils.{fn}(model.parameters(), {x:g}) after backward" for fn, x in written
    )
    edits = [Edit(tag, ("clipping",), {"calls": calls, "steps": steps})]
    return said or "no clip_grad_* call", edits


def _first_over(keras_run: Recorded) -> int | None:
    """The first step whose summed gradient's norm passed the run's norm limit: where the
    per-replica clipping first shows (None: not seen)."""
    limit = _norm_limit(keras_run)
    return next((s.step for s in keras_run.steps if _over(s.grad_norm, limit)), None)


def _norm_limit(keras_run: Recorded) -> float | None:
    return min((x for kind, x in _rule(keras_run) or () if "norm" in kind), default=None)


def _over(norm: float | None, limit: float | None) -> bool:
    """A gradient norm past a clip's limit (beyond float32's rounding of the clipped norm)."""
    return limit is not None and norm is not None and norm > limit * (1 + 1e-6)


def _active(keras_run: Recorded, tag: str, torch_run: Recorded) -> str:
    """Where the two clippings part, by the records: the torch clip's active steps, the Keras
    run's summed gradient norms past its norm limit."""
    seen = torch_run.config.clipping or Clipping()
    calls = seen.calls
    other = "B" if tag == "A" else "A"
    said = [
        f"{other}'s {c['function']} was active on {c['active_steps']} of {seen.steps} steps"
        for c in calls
        if c.get("active_steps")
    ]
    limit = _norm_limit(keras_run)
    over = [float(s.grad_norm or 0) for s in keras_run.steps if _over(s.grad_norm, limit)]
    if over:
        said.append(
            f"{tag}'s summed gradient's norm passed {limit:g} on {len(over)} of "
            f"{len(keras_run.steps)} steps (up to {max(over):.3g})"
        )
    if said:
        return "; ".join(said) + ": the two part on those steps"
    known = calls and all(c.get("active_steps") is not None for c in calls)
    return (
        "no clip was active in either run: they agree here"
        if known
        else ("the two agree on steps where no clip is active")
    )

"""Momentum a torch scheduler cycles: OneCycleLR and CyclicLR (``cycle_momentum=True``, their
default) set SGD's ``momentum`` or Adam's ``betas[0]`` at every step, between ``base_momentum``
and ``max_momentum``, against the lr. The optimizer's own momentum is then the scheduler's
(OneCycleLR writes ``max_momentum`` over it as it is made); a Keras optimizer's ``beta_1`` and
``momentum`` stay what the script set."""

from __future__ import annotations

from dualtrain.audit.config import Options
from dualtrain.audit.finding import fix, opt_lines
from dualtrain.audit.read import Recorded
from dualtrain.records.verdict import Finding

#: torch schedulers that cycle the momentum (cycle_momentum=True is their default)
CYCLING = ("OneCycleLR", "CyclicLR")


def cycled(run: Recorded) -> tuple[float, float] | None:
    """(base_momentum, max_momentum) where ``run``'s scheduler cycles the momentum, else None."""
    sched = run.config.scheduler
    opt = run.config.optimizer
    if run.framework != "torch" or sched.get("type") not in CYCLING:
        return None
    if not sched.get("cycle_momentum", True) or opt.get("max_momentum") is None:
        return None
    return float(opt.get("base_momentum") or 0), float(opt["max_momentum"])


def momentum_name(run: Recorded) -> str:
    opt = run.config.optimizer
    if run.framework == "torch":
        return "beta1 (betas[0])" if "betas" in opt else "momentum"
    return "beta_1" if "beta_1" in opt else "momentum"


def _fixed(run: Recorded) -> str:
    opt = run.config.optimizer
    if run.framework == "torch":
        value = opt["betas"][0] if isinstance(opt.get("betas"), list) else opt.get("momentum")
    else:
        value = opt.get("beta_1", opt.get("momentum"))
    return f"stays {value:g}" if isinstance(value, (int, float)) else "stays fixed"


def momentum_cycle(a: Recorded, b: Recorded) -> list[Finding]:
    ca, cb = cycled(a), cycled(b)
    if ca == cb:
        return []
    parts, fixes = [], []
    for run, tag, c in ((a, "A", ca), (b, "B", cb)):
        sched = run.config.scheduler.type
        if c is None:
            parts.append(f"{tag}'s {momentum_name(run)} {_fixed(run)}")
            change = (
                "Keras's optimizers keep beta_1 and momentum fixed: change the torch script"
                if run.framework == "tf"
                else "the other run's momentum cycle (its scheduler's cycle_momentum)"
            )
            fixes.append(fix(run, tag, opt_lines(run), change))
            continue
        parts.append(
            f"{tag}'s {sched} cycles the optimizer's {momentum_name(run)} between {c[0]:g} and "
            f"{c[1]:g} each step (cycle_momentum=True, {sched}'s default; the optimizer's own "
            f"value is overridden)"
        )
        change = "cycle_momentum=False (the momentum the optimizer was made with)"
        if ca is not None and cb is not None:
            change = "the other run's base_momentum and max_momentum"
        fixes.append(fix(run, tag, (f"{sched}(",), change))
    return [Finding("momentum cycled by the scheduler", "; ".join(parts), fixes, step=1)]


#: the torch options a cycling scheduler sets each step
OWNED = ("momentum", "betas.0")


def without_momentum(cfg: Options) -> Options:
    """A torch optimizer's options without the momentum (``betas[0]``) a scheduler cycles."""
    out = {k: v for k, v in cfg.items() if k != "momentum"}
    if isinstance(cfg.get("betas"), list):
        out["betas"] = [None, *cfg["betas"][1:]]
    return Options(out)

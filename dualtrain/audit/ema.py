"""A moving average of the weights written into the model as training ends: Keras's
``use_ema=True`` (the optimizer keeps it; fit writes it into the model's variables at its end)
against a torch AveragedModel (``get_ema_multi_avg_fn(decay)``) whose average the script copies
into the model. Both average ``decay * average + (1 - decay) * weights`` after each update, the
first update copying the weights, so the same decay updated at every step is the same average.
An average the script keeps beside the model (not copied in) does not change what was trained:
not a difference here."""

from __future__ import annotations

from typing import Any

from dualtrain.audit.config import Options
from dualtrain.audit.finding import fix, opt_lines
from dualtrain.audit.read import Recorded
from dualtrain.records.verdict import Finding


def average(run: Recorded) -> dict[str, Any] | None:
    """The moving average written into ``run``'s model as it ends: ``decay`` and how it is
    updated; None where there is none (or a torch run keeps it beside the model)."""
    if run.framework == "tf":
        opt = run.config.optimizer
        if not opt.get("use_ema"):
            return None
        return {"decay": opt.get("ema_momentum"), "every": opt.get("ema_overwrite_frequency")}
    ema = run.config.ema or Options()
    if not ema.get("final_is_average"):
        return None
    steps = len(run.steps)
    return {"decay": ema.get("decay"), "updates": ema.get("updates"), "steps": steps}


def _words(run: Recorded, avg: dict[str, Any] | None) -> str:
    if avg is None:
        kept = (run.config.ema or Options()).type
        return "ends with the trained weights" + (
            " (its AveragedModel kept beside the model, not copied in)" if kept else ""
        )
    if run.framework == "tf":
        return f"writes its optimizer's moving average (use_ema=True, ema_momentum={avg['decay']})"
    decay = "an SWA or custom average" if avg["decay"] is None else f"decay {avg['decay']:g}"
    return (
        f"copies its AveragedModel's average ({decay}, updated {avg['updates']} times in "
        f"{avg['steps']} steps) into the model"
    )


LINES = ("AveragedModel(", "get_ema_multi_avg_fn", "update_parameters(")  # torch's


def _same(x: dict[str, Any], y: dict[str, Any]) -> bool:
    """The same decay, updated at every step, written into the model only as training ends."""
    dx, dy = x.get("decay"), y.get("decay")
    every = all(e.get("updates") == e["steps"] for e in (x, y) if "steps" in e)
    ends = all(e.get("every") is None for e in (x, y))  # Keras's ema_overwrite_frequency
    return dx is not None and dy is not None and abs(dx - dy) <= 1e-7 and every and ends


def _change(run: Recorded, other: dict[str, Any] | None) -> str:
    decay = None if other is None else other.get("decay")
    if run.framework == "tf":
        if decay is None:
            return "no use_ema (the other run ends with its trained weights)"
        return f"use_ema=True, ema_momentum={decay} (ema_overwrite_frequency=None)"
    if decay is None:
        return "no average copied into the model (the other run ends with its trained weights)"
    return (
        f"AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn({decay})), "
        f"update_parameters(model) after every optimizer step, its average copied into the "
        f"model before rec.close()"
    )


def ema(a: Recorded, b: Recorded) -> list[Finding]:
    """The final weights a moving average in one run, or two averages that differ (two Keras
    runs: the optimizer settings' finding names use_ema and ema_momentum)."""
    ea, eb = average(a), average(b)
    if (ea is None and eb is None) or a.framework == b.framework == "tf":
        return []
    if ea is not None and eb is not None and _same(ea, eb):
        return []
    needles = {"tf": opt_lines, "torch": lambda r: (*LINES, *opt_lines(r))}
    return [
        Finding(
            "different moving average of the weights (EMA)",
            f"A {_words(a, ea)}; B {_words(b, eb)} (a run's final weights are its average)",
            [
                fix(run, tag, needles[run.framework](run), _change(run, other))
                for run, tag, other in ((a, "A", eb), (b, "B", ea))
            ],
        )
    ]

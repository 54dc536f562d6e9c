"""ReduceLROnPlateau in both frameworks counts otherwise: torch's scheduler cuts the lr when
``num_bad_epochs > patience`` (patience + 1 epochs without improvement), Keras's callback when
``wait >= patience`` after counting the epoch (patience epochs, at least 1), so torch's
``patience=p`` is Keras's ``patience=p + 1``;
torch's improvement threshold is relative by default (``threshold_mode='rel'``: better than
``best * (1 - threshold)``), Keras's ``min_delta`` absolute. The torch record holds the
scheduler's settings, the Keras record fit's lr callbacks (config.lr_callbacks)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dualtrain.audit import conventions as C
from dualtrain.audit.config import Options
from dualtrain.audit.finding import fix
from dualtrain.audit.read import Recorded
from dualtrain.records.verdict import Finding

NAME = "ReduceLROnPlateau"


def _torch(run: Recorded) -> Options | None:
    sched = run.config.scheduler
    return sched if run.framework == "torch" and sched.type == NAME else None


def _keras(run: Recorded) -> Options | None:
    found = [c for c in run.config.lr_callbacks if c.type == NAME]
    return found[0] if run.framework == "tf" and found else None


def _differences(t: Mapping[str, Any], k: Mapping[str, Any]) -> list[str]:
    out = []
    waits = max(int(k.get("patience") or 0), 1)  # Keras counts the bad epoch, then compares
    if t.get("patience") is not None and waits != t["patience"] + 1:
        out.append(
            f"patience: torch patience={t['patience']} cuts after {t['patience'] + 1} epochs "
            f"without improvement, Keras patience={k.get('patience')} after {waits} "
            f"(torch's patience=p is Keras's p + 1)"
        )
    for tname, kname in (("factor", "factor"), ("cooldown", "cooldown")):
        if not C.same_value(t.get(tname), k.get(kname)):
            out.append(f"{tname}: torch {t.get(tname)}, Keras {k.get(kname)}")
    rel = t.get("threshold_mode", "rel") == "rel" and (t.get("threshold") or 0) > 0
    if rel or not C.same_value(t.get("threshold"), k.get("min_delta")):
        out.append(
            f"the improvement threshold: torch threshold={t.get('threshold')} "
            f"({t.get('threshold_mode')}{'ative, of the best' if rel else ''}), Keras "
            f"min_delta={k.get('min_delta')} (absolute)"
        )
    return out


def plateau(a: Recorded, b: Recorded) -> list[Finding]:
    """A torch ReduceLROnPlateau and a Keras ReduceLROnPlateau callback set alike in each
    framework's words."""
    for trun, krun, tt, kt in ((a, b, "A", "B"), (b, a, "B", "A")):
        t, k = _torch(trun), _keras(krun)
        if t is None or k is None:
            continue
        out = _differences(t, k)
        if not out:
            return []
        patience = k.get("patience") or 1
        return [
            Finding(
                "ReduceLROnPlateau conventions",
                "; ".join(out) + f" (the metric each one steps on is the script's: Keras "
                f"monitors {k.get('monitor')!r})",
                [
                    fix(
                        trun,
                        tt,
                        (f"{NAME}(",),
                        f"patience={max(patience - 1, 0)}, factor={k.get('factor')}, "
                        f"threshold_mode='abs', threshold={k.get('min_delta')}, "
                        f"cooldown={k.get('cooldown')} (Keras's callback in torch's words)",
                    ),
                    fix(
                        krun,
                        kt,
                        (f"{NAME}(",),
                        f"patience={(t.get('patience') or 0) + 1}, factor={t.get('factor')}, "
                        f"cooldown={t.get('cooldown')} (torch's scheduler in Keras's words; a "
                        f"relative threshold has none)",
                    ),
                ],
            )
        ]
    return []

"""A fix checked to be one: its values (the finding's ``edits``) are written into a copy of the
recorded configuration, the diagnoses run again on the copies, and the fix holds where that
finding is gone and no other came. A fix that leaves its finding, or brings a new one, is marked
NOT confirmed in the report, with what remained or came.

What the recorders read from the scripts' objects (the optimizer's options, the loss terms, the
loss-scale rule, the clipping) is edited so; a base lr scales every step's recorded lr (its
schedule scales with it), and a schedule or warmup written gives the lrs it computes, step by
step, in place of the recorded ones. A fix that is words (a schedule of no shape it writes, a
loss, the rows) has no edits, and is given unchecked."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

from dualtrain.audit.config import RunConfig
from dualtrain.audit.read import Recorded
from dualtrain.audit.rows import StepRow
from dualtrain.records.verdict import LR_SCALE, LR_SERIES, Edit, Finding, FixCheck


def _scaled(steps: list[StepRow], factor: float) -> list[StepRow]:
    return [
        dataclasses.replace(
            s,
            lr=None if s.lr is None else s.lr * factor,
            lrs=None if s.lrs is None else tuple(x * factor for x in s.lrs),
        )
        for s in steps
    ]


def applied(run: Recorded, tag: str, edits: list[Edit]) -> Recorded:
    """``run`` (tagged ``tag``) with the edits of that tag written into a copy of its
    configuration (the rows and weights shared); :data:`LR_SCALE` scales a copy of its steps'
    lrs."""
    config, steps = copy.deepcopy(dict(run.config.json)), run.steps
    for edit in (e for e in edits if e.run == tag):
        if edit.path == LR_SCALE:
            steps = _scaled(steps, float(edit.value))
            continue
        if edit.path == LR_SERIES:
            lrs = list(edit.value)
            steps = [
                dataclasses.replace(s, lr=lrs[i], lrs=None) if i < len(lrs) else s
                for i, s in enumerate(steps)
            ]
            continue
        *parents, last = edit.path
        node = config
        for key in parents:
            node = node.setdefault(key, {})
        name, _, index = last.partition(".")
        if index:  # an element of a tuple option (betas.0)
            whole = list(node.get(name) or [])
            whole[int(index)] = edit.value
            node[name] = whole
        else:
            node[name] = edit.value
    return dataclasses.replace(run, config=RunConfig.from_json(config), steps=steps)


def _check(
    a: Recorded,
    b: Recorded,
    finding: Finding,
    edits: list[Edit],
    before: set[str],
    diagnose: Callable[[Recorded, Recorded], list[Finding]],
) -> FixCheck:
    after = diagnose(applied(a, "A", edits), applied(b, "B", edits))
    said = ", ".join(f"{e.path[-1]}={_short(e.value)}" for e in edits)
    where = f"written into a copy of the recorded configuration ({said})"
    if finding.name in {f.name for f in after}:
        return FixCheck(False, f"{where}, it leaves this finding")
    came = sorted({f.name for f in after if f.name not in before and not f.inherent})
    if came:
        return FixCheck(False, f"{where}, it brings {came}")
    conventions = sorted({f.name for f in after if f.name not in before and f.inherent})
    if conventions:  # no line changes those: the fix holds, and the report says what it brings
        return FixCheck(True, f"it brings a convention of the frameworks: {'; '.join(conventions)}")
    return FixCheck(True)


def _short(value: Any) -> str:
    """An edit's value as the check says it (a series of lrs by its length and ends)."""
    if isinstance(value, list) and len(value) > 4:
        return f"[{value[0]!r}, ..., {value[-1]!r}] ({len(value)} values)"
    return repr(value)


def check_fixes(
    a: Recorded,
    b: Recorded,
    findings: list[Finding],
    diagnose: Callable[[Recorded, Recorded], list[Finding]],
) -> list[Finding]:
    """``findings`` with each fix that has edits checked (:attr:`Finding.fix_checks`)."""
    before = {f.name for f in findings}
    for f in findings:
        f.fix_checks = [
            _check(a, b, f, edits, before, diagnose) if edits else None for edits in f.edits
        ]
    return findings


def edits_of(tag: str, section: str, values: dict[str, Any]) -> list[Edit]:
    """``section``'s options set to ``values`` in run ``tag``."""
    return [Edit(tag, (section, key), value) for key, value in values.items()]

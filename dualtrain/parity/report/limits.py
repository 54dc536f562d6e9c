"""Framework limits (dualtrain.core.limits): the framework ops that are only float32-accurate in
float64, which dualtrain ran exactly in the fp64 runs, where the model used them and how far the
framework's own op is from the exact form (the runs' summary.json ``exact_ops``). Apart from the
checks: a faithful port that uses such an op is judged on the exact form, and a real mistake at
the same layer (another form of the op, another constant) still fails there."""

from __future__ import annotations

import html
from typing import Any

from dualtrain.core import limits
from dualtrain.parity import readings as R
from dualtrain.parity.report.compare import Comparison

_INTRO = (
    "A framework's own op that is less accurate than float64 in its float64 path is no porting "
    "mistake, but the fp64 reference pair (bounded at 1e-10) would read it as one. dualtrain runs "
    "the exact form of each such op in its fp64 runs, for float64 inputs only, without touching "
    "your code (your export keeps your layers); the table says where, and how far the framework's "
    "own op is from the exact form on this machine. docs/own-models.md."
)


def model(cmp: Comparison) -> list[dict[str, Any]]:
    """verdict.json ``framework_limits``: each recorded substitution of every compared run, with
    its run's label and the line the report prints."""
    runs = [cmp.a, cmp.b]
    labels = dict(zip(("a", "b"), R.labels(cmp.a, cmp.b), strict=True))
    names = {id(cmp.a): labels["a"], id(cmp.b): labels["b"]}
    if cmp.reference is not None and cmp.reference.a is not cmp.a:
        runs += [cmp.reference.a, cmp.reference.b]
        names[id(cmp.reference.a)] = f"{labels['a']} fp64"
        names[id(cmp.reference.b)] = f"{labels['b']} fp64"
    out = []
    for rec in runs:
        for entry in rec.summary.get("exact_ops") or []:
            out.append({**entry, "run": names[id(rec)], "text": limits.describe(entry)})
    return out


def lines(v: list[dict[str, Any]] | None) -> list[str]:
    """The terminal's lines: one per substituted op."""
    return [f"{e['run']}: {e['text']}" for e in v or []]


def markdown(v: list[dict[str, Any]] | None) -> list[str]:
    if not v:
        return []
    out = ["", "## Framework limits", "", _INTRO, "", "| run | op | where | off the exact form |"]
    out.append("|---|---|---|---|")
    out += [
        f"| {e['run']} | {e['op']} | {', '.join(e.get('where') or [])} | {e['error']:.1g} |"
        for e in v
    ]
    return out


def html_parts(v: list[dict[str, Any]] | None) -> list[str]:
    if not v:
        return []
    esc = html.escape
    parts = ["<h2>Framework limits</h2>", f"<p>{esc(_INTRO)}</p>", "<table>"]
    parts.append("<tr><th>run</th><th>op</th><th>where</th><th>off the exact form</th></tr>")
    parts += [
        f"<tr><td>{esc(e['run'])}</td><td>{esc(e['op'])}</td>"
        f"<td>{esc(', '.join(e.get('where') or []))}</td><td>{e['error']:.1g}</td></tr>"
        for e in v
    ]
    parts.append("</table>")
    return parts

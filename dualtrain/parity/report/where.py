"""The report shows where: the replay's first divergent operation with its picture (each layer's
relative difference at that step, in training and in inference, the finding's layer marked; or,
for a backward's or an optimizer's finding, each parameter's gradient and update), and compare
--against's runs held to the saved ones. One model (:func:`model`, verdict.json's
``first_divergent_operation`` and ``against``), rendered for Markdown, HTML and the figure."""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np

from dualtrain.parity.replay import TOL
from dualtrain.parity.report.compare import Comparison
from dualtrain.parity.report.page import png

FIGURE = "First divergent step: where the two sides part"
#: The picture's floor: exact agreement is drawn here (a log axis has no zero)
FLOOR = 1e-18


def model(cmp: Comparison) -> dict[str, Any]:
    return {
        "first_divergent_operation": cmp.replay.to_json() if cmp.replay is not None else None,
        "against": cmp.against.to_json() if cmp.against is not None else None,
    }


def _num(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return "0" if x == 0 else f"{x:.3g}"


#: (the row's name cells, its relative differences)
Row = tuple[list[str], list[float]]


def _rows(cmp: Comparison) -> tuple[list[str], list[Row], int | None]:
    """(head, rows, the marked row's index) of the picture."""
    found = cmp.replay
    if found is None:
        return [], [], None
    if found.layers:
        head = ["layer", "type", "training (rel)", "inference (rel)"]
        rows = [([r.prefix, r.kind], [r.train, r.eval]) for r in found.layers]
        mark = next((i for i, r in enumerate(found.layers) if r.prefix == found.layer), None)
        if found.layer is None and found.stage == "loss":
            mark = len(rows) - 1  # every layer agrees: the loss
        return head, rows, mark
    head = ["parameter", "gradient (rel)", "after the update (rel)"]
    rows = [([p.name], [p.gradient, p.update]) for p in found.params]
    named = (found.tensor or "").rpartition("/")[2]
    mark = next((i for i, p in enumerate(found.params) if p.name == named), None)
    return head, rows, mark


def _cells(row: Row) -> list[str]:
    return [*row[0], *(_num(v) for v in row[1])]


def _at(step: int) -> str:
    """A replay's step, or the locator's batch on the initial weights (step 0)."""
    return f"step {step}" if step else "the locator's batch, initial weights"


def _said(cmp: Comparison, lead: str) -> str:
    """The finding where the diagnosis did not lead with it already."""
    assert cmp.replay is not None
    if cmp.diagnosis.finding and cmp.replay.lead() in cmp.diagnosis.finding:
        return "The finding above, at each layer (or parameter) of that step:"
    return lead


def markdown(cmp: Comparison) -> list[str]:
    lines: list[str] = []
    found = cmp.replay
    if found is not None:
        lines += [
            "",
            f"## First divergent operation ({_at(found.step)}, {found.stage})",
            "",
            _said(cmp, f"**{found.lead()}**"),
        ]
        head, rows, mark = _rows(cmp)
        if rows:
            lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            for i, row in enumerate(rows):
                r = _cells(row)
                cells = [f"**{c}**" for c in r] if i == mark else r
                lines.append("| " + " | ".join(cells) + (" ◀ |" if i == mark else " |"))
    lines += _against_markdown(cmp)
    return lines


def _against_markdown(cmp: Comparison) -> list[str]:
    a = cmp.against
    if a is None:
        return []
    lines = [
        "",
        "## Against the saved compare",
        "",
        f"`{a.saved}`: **{a.lead}**",
        "",
        "| run | changed | versions | first parting step | loss diff | final weights (rel) |",
        "|---|---|---|---|---|---|",
    ]
    for r in a.runs:
        lines.append(
            f"| {r.label} | {'yes' if r.changed else 'no'} | {', '.join(r.versions) or 'same'} | "
            f"{r.first_step or '-'} | {_num(r.loss_diff)} | {_num(r.weights_rel)} |"
        )
    return lines


def html_parts(cmp: Comparison) -> list[str]:
    e = html.escape
    parts: list[str] = []
    found = cmp.replay
    if found is not None:
        parts.append(
            f"<h2>First divergent operation ({_at(found.step)}, {e(found.stage)})</h2>"
            f"<p>{_said(cmp, f'<b>{e(found.lead())}</b>')}</p>"
        )
        head, rows, mark = _rows(cmp)
        if rows:
            parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>")
            for i, row in enumerate(rows):
                style = " class='v-fail'" if i == mark else ""
                cells = "".join(f"<td>{e(c)}</td>" for c in _cells(row))
                parts.append(f"<tr{style}>{cells}</tr>")
            parts.append("</table>")
    a = cmp.against
    if a is not None:
        parts.append(
            f"<h2>Against the saved compare</h2><p><code>{e(a.saved)}</code>: <b>{e(a.lead)}</b>"
            "</p><table><tr><th>run</th><th>changed</th><th>versions</th>"
            "<th>first parting step</th><th>loss diff</th><th>final weights (rel)</th></tr>"
        )
        for r in a.runs:
            parts.append(
                f"<tr><td>{e(r.label)}</td><td>{'yes' if r.changed else 'no'}</td>"
                f"<td>{e(', '.join(r.versions) or 'same')}</td><td>{r.first_step or '-'}</td>"
                f"<td>{_num(r.loss_diff)}</td><td>{_num(r.weights_rel)}</td></tr>"
            )
        parts.append("</table>")
    return parts


def figure(plt: Any, cmp: Comparison, out: dict[str, str]) -> None:
    """Each layer's (or parameter's) relative difference at the first divergent step, log scale,
    the finding's row marked, the line where the two sides part (the replay's 1e-10)."""
    head, rows, mark = _rows(cmp)
    if not rows:
        return
    labels = [" ".join(names) for names, _ in rows]
    series = [(head[-2 + k], [_value(values[k]) for _, values in rows]) for k in (0, 1)]
    n = len(rows)
    fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.32 * n))
    y = np.arange(n)
    for k, (name, values) in enumerate(series):
        ax.barh(y + (k - 0.5) * 0.38, values, height=0.36, label=name, color=f"C{k}")
    ax.set_xscale("log")
    ax.set_xlim(FLOOR / 2, 10)
    ax.axvline(TOL, color="k", ls="--", lw=0.8, label=f"parts beyond {TOL:g}")
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    if mark is not None:
        ax.get_yticklabels()[mark].set_color("C3")
        ax.get_yticklabels()[mark].set_fontweight("bold")
        ax.axhspan(mark - 0.5, mark + 0.5, color="C3", alpha=0.12, lw=0)
    ax.set_xlabel("relative difference (exact agreement drawn at 1e-18)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    found = cmp.replay
    assert found is not None  # rows come from it
    named = found.layer or found.tensor or "the loss"
    ax.set_title(f"{_at(found.step)}, {found.stage}: {named} marked", fontsize=9)
    out[FIGURE] = png(fig)


def _value(v: float) -> float:
    """Where a bar ends: nan (not recorded) draws none, exact agreement the floor, inf the edge."""
    if math.isnan(v):
        return math.nan
    return max(v, FLOOR) if math.isfinite(v) else 10.0

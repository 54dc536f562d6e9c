"""The sections every compare report shows alike, a spec compare's and two recorded runs': the
checks table and the findings, in Markdown, HTML and the terminal's aligned text.

One table for every check (dualtrain.records.verdict's): its columns are those the checks fill. A
spec compare's checks come in groups and carry values and tolerances; an audit's carry what they
judged and what they could not. The terminal leaves out what a line cannot hold: the judged and
not-judged texts, and the detail where the checks speak in numbers (a spec compare's)."""

from __future__ import annotations

import html
import math

from dualtrain.records.verdict import Check, Finding

#: the heading of each column a checks table may have
GROUP, CHECK, VALUE, TOLERANCE, RESULT, DETAIL = (
    "group",
    "check",
    "value",
    "tolerance",
    "result",
    "detail",
)
JUDGED, NOT_JUDGED = "judged", "not judged"


def fmt_value(v: float | None) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    if v == 0:
        return "0"
    if float(v).is_integer() and abs(v) < 1e6:
        return f"{int(v)}"
    return f"{v:.3g}"


def columns(checks: list[Check], *, terminal: bool = False) -> list[str]:
    """The columns these checks fill, in report order."""
    worded = any(c.judged or c.not_judged for c in checks)
    cols = [GROUP] if len({c.group for c in checks}) > 1 else []
    cols.append(CHECK)
    if any(c.value is not None for c in checks):
        cols.append(VALUE)
    if any(c.tolerance is not None for c in checks):
        cols.append(TOLERANCE)
    cols.append(RESULT)
    if worded or not terminal:
        cols.append(DETAIL)
    if worded and not terminal:
        cols += [JUDGED, NOT_JUDGED]
    return cols


def cell(c: Check, column: str) -> str:
    """One cell's text (a tolerance as ``<= bound``)."""
    if column == VALUE:
        unit = f" {c.unit}" if c.unit and c.ran else ""
        return fmt_value(c.value) + unit
    if column == TOLERANCE:
        return "-" if c.tolerance is None else f"<= {fmt_value(c.tolerance)}"
    if column == RESULT:
        return c.status
    return str(
        {
            GROUP: c.group,
            CHECK: c.name,
            DETAIL: c.detail,
            JUDGED: c.judged,
            NOT_JUDGED: c.not_judged,
        }[column]
    )


def checks_markdown(checks: list[Check]) -> list[str]:
    cols = columns(checks)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for c in checks:
        lines.append("| " + " | ".join(cell(c, k).replace("|", "\\|") for k in cols) + " |")
    return lines


def checks_html(checks: list[Check]) -> str:
    e = html.escape
    cols = columns(checks)
    out = ["<table><tr>" + "".join(f"<th>{e(k)}</th>" for k in cols) + "</tr>"]
    for c in checks:
        tds = []
        for k in cols:
            text = cell(c, k)
            if k == RESULT:
                tds.append(f"<td class='{text.split()[0]}'>{text}</td>")
            elif k == TOLERANCE and c.tolerance is not None:
                tds.append(f"<td>&le; {e(fmt_value(c.tolerance))}</td>")
            else:
                tds.append(f"<td>{e(text)}</td>")
        out.append("<tr>" + "".join(tds) + "</tr>")
    return "".join(out[:1]) + "\n".join(out[1:]) + "</table>"


def checks_terminal(checks: list[Check]) -> str:
    """The short aligned table printed to the terminal."""
    cols = columns(checks, terminal=True)
    rows = [tuple(cols)] + [tuple(cell(c, k) for k in cols) for c in checks]
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    if cols[-1] == DETAIL:  # the detail runs on: no padding for it
        widths[-1] = len(DETAIL)
    lines = ["  ".join(x.ljust(widths[i]) for i, x in enumerate(r)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def findings_markdown(findings: list[Finding]) -> list[str]:
    out: list[str] = []
    for f in findings:
        out += [f"### {f.title}", "", f.evidence, ""]
        out += [
            f"- change: `{line}`" + (f" ({note})" if note else "") for line, note in f.fix_lines()
        ]
        out.append("")
    return out


def findings_html(findings: list[Finding]) -> list[str]:
    e = html.escape
    out: list[str] = []
    for f in findings:
        out.append(f"<h3>{e(f.title)}</h3><p>{e(f.evidence)}</p>")
        if f.fixes:
            items = [
                f"<li>change: <code>{e(x)}</code>" + (f" <em>({e(note)})</em>" if note else "")
                for x, note in f.fix_lines()
            ]
            out.append("<ul>" + "</li>".join(items) + "</li></ul>")
    return out


def findings_terminal(findings: list[Finding]) -> list[str]:
    out: list[str] = []
    for f in findings:
        out.append(f"  difference: {f.title}: {f.evidence}")
        out += [
            f"    change: {line}" + (f" ({note})" if note else "") for line, note in f.fix_lines()
        ]
    return out

"""The report of two recorded runs (dualtrain.audit): verdict.json's data, report.md, report.html
and the terminal's lines, built from the sections a spec compare's report shows too (the checks
table, the findings, the environment, the curves)."""

from __future__ import annotations

import html
import json
from typing import Any

from dualtrain.audit.checks import loss_windows
from dualtrain.audit.compare import AuditComparison
from dualtrain.audit.read import Recorded
from dualtrain.parity.report.page import CSS, curves, env_html, env_markdown
from dualtrain.parity.report.sections import (
    checks_html,
    checks_markdown,
    checks_terminal,
    findings_html,
    findings_markdown,
    findings_terminal,
)
from dualtrain.records.envinfo import env_differences
from dualtrain.records.record import read_run

TITLE = "dualtrain compare: two recorded runs"
NONE_FOUND = "None of the classic differences shows in the records."


def _env(run: Recorded) -> dict[str, Any] | None:
    summary = run.path / "summary.json"
    return json.loads(summary.read_text()).get("env") if summary.is_file() else None


def audit_verdict(cmp: AuditComparison) -> dict[str, Any]:
    """verdict.json's data: the verdict, the two runs, every check, the differences found, the
    loss per window of steps, and the environment facts that differ."""
    return {
        "kind": "audit",
        "verdict": cmp.verdict,
        "word": cmp.word,
        "passed": cmp.passed,
        "runs": {
            tag: {
                "label": r.label,
                "path": str(r.path),
                "framework": r.framework,
                "world_size": r.world_size,
                "steps": len(r.steps),
                "script": r.script.path,
            }
            for tag, r in (("A", cmp.a), ("B", cmp.b))
        },
        "checks": [c.as_dict() for c in cmp.checks],
        "differences": [f.as_dict() for f in cmp.findings],
        "loss_windows": loss_windows(cmp.a, cmp.b),
        "environment": env_differences({"A": _env(cmp.a), "B": _env(cmp.b)}),
    }


def _run_line(tag: str, r: Recorded) -> str:
    return (
        f"- {tag}: `{r.path}`: {r.framework}, {r.world_size} replicas, {len(r.steps)} steps, "
        f"script `{r.script.path}`"
    )


def audit_markdown(cmp: AuditComparison, v: dict[str, Any]) -> str:
    out = [f"# {TITLE}", "", f"**{cmp.verdict}**", "", _run_line("A", cmp.a), _run_line("B", cmp.b)]
    out += ["", "## Checks", "", *checks_markdown(cmp.checks), "", "## Differences found", ""]
    out += findings_markdown(cmp.findings) if cmp.findings else [NONE_FOUND, ""]
    out += [
        "## Loss per window of steps",
        "",
        "| steps | A | B | abs diff | bound |",
        "|---|---|---|---|---|",
    ]
    out += [
        f"| {w['first']}-{w['last']} | {w['a']:.4g} | {w['b']:.4g} | {w['diff']:.3g} | "
        f"{w['bound']:.3g} |"
        for w in v["loss_windows"]
    ]
    out += env_markdown(v)
    return "\n".join(out) + "\n"


def _labels(cmp: AuditComparison) -> tuple[str, str]:
    a, b = cmp.a.label, cmp.b.label
    return (a, b) if a != b else (f"A ({a})", f"B ({b})")


def audit_html(cmp: AuditComparison, v: dict[str, Any]) -> str:
    """report.html: the runs, the checks, the differences with the lines to change, the loss
    windows, the environment, and the loss, lr and loss-scale curves."""
    e = html.escape
    la, lb = _labels(cmp)
    word = "PASS" if cmp.passed else "FAIL"
    parts = [
        "<!DOCTYPE html>",
        "<html><head><meta charset='utf-8'>",
        f"<title>{TITLE}: {word}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>{TITLE}</h1>",
        f"<p class='verdict {'v-pass' if cmp.passed else 'v-fail'}'>{e(cmp.verdict)}</p>",
        "<table><tr>"
        + "".join(
            f"<th>{h}</th>" for h in ("run", "framework", "replicas", "steps", "script", "path")
        )
        + "</tr>",
    ]
    for tag, r, label in (("A", cmp.a, la), ("B", cmp.b, lb)):
        cells = [f"{tag}: {label}", r.framework, str(r.world_size), str(len(r.steps))]
        cells.append(str(r.script.path))
        parts.append(
            "<tr>"
            + "".join(f"<td>{e(x)}</td>" for x in cells)
            + f"<td><code>{e(str(r.path))}</code></td></tr>"
        )
    parts += ["</table>", "<h2>Checks</h2>", checks_html(cmp.checks), "<h2>Differences found</h2>"]
    parts += findings_html(cmp.findings) if cmp.findings else [f"<p>{NONE_FOUND}</p>"]
    parts.append("<h2>Loss per window of steps</h2>")
    parts.append(
        "<table><tr>"
        + "".join(f"<th>{e(h)}</th>" for h in ("steps", la, lb, "|A - B|", "bound"))
        + "</tr>"
    )
    for w in v["loss_windows"]:
        cells = [f"{w['first']}-{w['last']}", f"{w['a']:.4g}", f"{w['b']:.4g}"]
        cells += [f"{w['diff']:.3g}", f"{w['bound']:.3g}"]
        parts.append("<tr>" + "".join(f"<td>{x}</td>" for x in cells) + "</tr>")
    parts.append("</table>")
    parts += env_html(v)
    parts.append("<h2>Figures</h2>")
    for title, b64 in curves(read_run(cmp.a.path), read_run(cmp.b.path), la, lb).items():
        parts.append(f"<h3>{e(title)}</h3><img alt='{e(title)}' src='data:image/png;base64,{b64}'>")
    parts.append("</body></html>")
    return "\n".join(parts)


def audit_terminal(cmp: AuditComparison) -> str:
    return "\n".join([checks_terminal(cmp.checks), *findings_terminal(cmp.findings), cmp.verdict])

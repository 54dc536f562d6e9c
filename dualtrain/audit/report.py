"""compare on two recorded runs: the checks, the diagnoses, and the report files (verdict.json,
report.md, report.html, the names a dualtrain compare writes)."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dualtrain.audit.checks import FAIL, NOT_JUDGED, Check, loss_windows, run_checks
from dualtrain.audit.diagnose import diagnose
from dualtrain.audit.finding import Finding
from dualtrain.audit.read import Recorded, read_recorded
from dualtrain.errors import UserError
from dualtrain.jsonio import json_safe, new_folder, write_atomic
from dualtrain.records.envinfo import env_differences
from dualtrain.records.page import CSS, curves, env_html
from dualtrain.records.record import read_run

VERDICT_FILE, REPORT_MD, REPORT_HTML = "verdict.json", "report.md", "report.html"


@dataclass
class AuditComparison:
    a: Recorded
    b: Recorded
    checks: list[Check]
    findings: list[Finding]
    out: Path

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def verdict(self) -> str:
        failed = [c.name for c in self.checks if c.status == FAIL]
        n = len(self.checks)
        unjudged = [c.name for c in self.checks if c.status == NOT_JUDGED]
        if not failed and unjudged:
            m = n - len(unjudged)
            return (
                f"verdict: PASS ({m}/{m} judged checks of two recorded runs; not judged: "
                f"{', '.join(unjudged)})"
            )
        if not failed:
            return f"verdict: PASS ({n}/{n} checks of two recorded runs)"
        names = ", ".join(f.name for f in self.findings[:4])
        return f"verdict: FAIL ({n - len(failed)}/{n} checks; failed: {', '.join(failed)})" + (
            f"; differences: {names}" if names else ""
        )

    @property
    def reports(self) -> dict[str, Path]:
        return {
            "json": self.out / VERDICT_FILE,
            "md": self.out / REPORT_MD,
            "html": self.out / REPORT_HTML,
        }

    def as_dict(self) -> dict[str, Any]:
        env = env_differences({"A": _env(self.a), "B": _env(self.b)})
        return {
            "kind": "audit",
            "verdict": self.verdict,
            "passed": self.passed,
            "runs": {
                tag: {
                    "label": r.label,
                    "path": str(r.path),
                    "framework": r.framework,
                    "world_size": r.world_size,
                    "steps": len(r.steps),
                    "script": r.script.get("path"),
                }
                for tag, r in (("A", self.a), ("B", self.b))
            },
            "checks": [c.as_dict() for c in self.checks],
            "differences": [f.as_dict() for f in self.findings],
            "loss_windows": loss_windows(self.a, self.b),
            "environment": env,
        }


def _env(run: Recorded) -> dict[str, Any] | None:
    summary = run.path / "summary.json"
    return json.loads(summary.read_text()).get("env") if summary.is_file() else None


def markdown(cmp: AuditComparison) -> str:
    a, b = cmp.a, cmp.b
    out = [
        "# dualtrain compare: two recorded runs",
        "",
        f"**{cmp.verdict}**",
        "",
        f"- A: `{a.path}`: {a.framework}, {a.world_size} replicas, {len(a.steps)} steps, "
        f"script `{a.script.get('path')}`",
        f"- B: `{b.path}`: {b.framework}, {b.world_size} replicas, {len(b.steps)} steps, "
        f"script `{b.script.get('path')}`",
        "",
        "## Checks",
        "",
        "| check | status | detail | judged | not judged |",
        "|---|---|---|---|---|",
    ]
    out += [
        "| "
        + " | ".join(cell(x) for x in (c.name, c.status, c.detail, c.judged, c.not_judged))
        + " |"
        for c in cmp.checks
    ]
    out += ["", "## Differences found", ""]
    if not cmp.findings:
        out.append("None of the classic differences shows in the records.")
    for f in cmp.findings:
        out.append(f"### {f.title}")
        out += ["", f.evidence, ""]
        out += [f"- change: `{line}`" for line in f.fixes]
        out.append("")
    out += [
        "## Loss per window of steps",
        "",
        "| steps | A | B | abs diff | bound |",
        "|---|---|---|---|---|",
    ]
    out += [
        f"| {w['first']}-{w['last']} | {w['a']:.4g} | {w['b']:.4g} | {w['diff']:.3g} | "
        f"{w['bound']:.3g} |"
        for w in loss_windows(a, b)
    ]
    return "\n".join(out) + "\n"


def cell(text: str) -> str:
    """A Markdown table cell: its pipes escaped."""
    return text.replace("|", "\\|")


def html_report(cmp: AuditComparison, v: dict[str, Any]) -> str:
    """report.html in the style of a dualtrain run's (dualtrain.records.page: its
    styles, environment section and curves): the runs, the checks, the differences with the lines to
    change, the loss windows, the environment, and the loss, lr and loss-scale curves."""
    e = html.escape
    a, b = cmp.a, cmp.b
    la, lb = (a.label, b.label) if a.label != b.label else (f"A ({a.label})", f"B ({b.label})")
    passed = "PASS" if cmp.passed else "FAIL"
    parts = [
        "<!DOCTYPE html>",
        "<html><head><meta charset='utf-8'>",
        f"<title>dualtrain compare: two recorded runs: {passed}</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>dualtrain compare: two recorded runs</h1>",
        f"<p class='verdict {'v-pass' if cmp.passed else 'v-fail'}'>{e(cmp.verdict)}</p>",
        _table(
            ["run", "framework", "replicas", "steps", "script", "path"],
            [
                [
                    f"{tag}: {label}",
                    r.framework,
                    str(r.world_size),
                    str(len(r.steps)),
                    str(r.script.get("path")),
                    f"<code>{e(str(r.path))}</code>",
                ]
                for tag, r, label in (("A", a, la), ("B", b, lb))
            ],
            raw=5,
        ),
        "<h2>Checks</h2>",
        _table(
            ["check", "result", "detail", "judged", "not judged"],
            [[c.name, c.status, c.detail, c.judged, c.not_judged] for c in cmp.checks],
            status=1,
        ),
        "<h2>Differences found</h2>",
    ]
    if not cmp.findings:
        parts.append("<p>None of the classic differences shows in the records.</p>")
    for f in cmp.findings:
        parts.append(f"<h3>{e(f.title)}</h3><p>{e(f.evidence)}</p>")
        if f.fixes:
            parts.append(
                "<ul>" + "".join(f"<li>change: <code>{e(x)}</code></li>" for x in f.fixes) + "</ul>"
            )
    parts += [
        "<h2>Loss per window of steps</h2>",
        _table(
            ["steps", la, lb, "|A - B|", "bound"],
            [
                [
                    f"{w['first']}-{w['last']}",
                    f"{w['a']:.4g}",
                    f"{w['b']:.4g}",
                    f"{w['diff']:.3g}",
                    f"{w['bound']:.3g}",
                ]
                for w in v["loss_windows"]
            ],
        ),
    ]
    parts += env_html(v)
    parts.append("<h2>Figures</h2>")
    figs = curves(read_run(a.path), read_run(b.path), la, lb)
    for title, b64 in figs.items():
        parts.append(f"<h3>{e(title)}</h3><img alt='{e(title)}' src='data:image/png;base64,{b64}'>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _table(
    head: list[str], rows: list[list[str]], *, status: int | None = None, raw: int | None = None
) -> str:
    """An HTML table; cells escaped but column ``raw``'s, column ``status`` styled PASS/FAIL."""

    def td(i: int, x: str) -> str:
        if i == raw:
            return f"<td>{x}</td>"
        cls = f" class='{x.split()[0]}'" if i == status and x else ""
        return f"<td{cls}>{html.escape(x)}</td>"

    out = "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
    out += "".join("<tr>" + "".join(td(i, x) for i, x in enumerate(r)) + "</tr>" for r in rows)
    return out + "</table>"


def terminal(cmp: AuditComparison) -> str:
    lines = [f"  {c.status:<10} {c.name:<17} {c.detail}" for c in cmp.checks]
    for f in cmp.findings:
        lines.append(f"  difference: {f.title}: {f.evidence}")
        lines += [f"    change: {line}" for line in f.fixes]
    return "\n".join(lines + [cmp.verdict])


def compare_recorded(
    run_a: str | Path, run_b: str | Path, out: str | Path | None = None
) -> AuditComparison:
    """Compare two audit records and write the report into ``out`` (default
    ``runs/compare-audit-<time>``)."""
    a, b = read_recorded(run_a), read_recorded(run_b)
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise UserError(f"--out exists and is not a folder. Received: {str(out)!r}")
    where = Path(out) if out is not None else new_folder("runs", "compare-audit")
    cmp = AuditComparison(a, b, run_checks(a, b), diagnose(a, b), where)
    where.mkdir(parents=True, exist_ok=True)
    v = cmp.as_dict()
    write_atomic(cmp.reports["json"], json.dumps(json_safe(v), indent=2) + "\n")
    write_atomic(cmp.reports["md"], markdown(cmp))
    write_atomic(cmp.reports["html"], html_report(cmp, v))
    return cmp

"""compare on two recorded runs: the checks, the diagnoses, and the report files (verdict.json,
report.md, report.html, the names a dualtrain compare writes)."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dualtrain.audit.checks import FAIL, Check, loss_windows, run_checks
from dualtrain.audit.diagnose import diagnose
from dualtrain.audit.finding import Finding
from dualtrain.audit.read import Recorded, read_recorded
from dualtrain.errors import UserError
from dualtrain.jsonio import json_safe, new_folder, write_atomic
from dualtrain.records.envinfo import env_differences

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
        at = (
            "" if f.step is None else (" (before training)" if f.step == 0 else f" (step {f.step})")
        )
        out.append(f"### {f.name}{at}")
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


def html_report(text: str) -> str:
    """report.md as a plain HTML page (preformatted: every line as the Markdown says it)."""
    return (
        "<!doctype html><meta charset='utf-8'><title>dualtrain audit</title>"
        f"<pre style='white-space:pre-wrap;font-family:monospace'>{html.escape(text)}</pre>\n"
    )


def terminal(cmp: AuditComparison) -> str:
    lines = [f"  {c.status:<10} {c.name:<17} {c.detail}" for c in cmp.checks]
    for f in cmp.findings:
        lines.append(f"  difference: {f.name}: {f.evidence}")
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
    text = markdown(cmp)
    write_atomic(cmp.reports["json"], json.dumps(json_safe(cmp.as_dict()), indent=2) + "\n")
    write_atomic(cmp.reports["md"], text)
    write_atomic(cmp.reports["html"], html_report(text))
    return cmp

"""Writing the three report files of either kind of compare, and what the terminal shows."""

from __future__ import annotations

import json
from pathlib import Path

from dualtrain.audit.compare import AuditComparison
from dualtrain.jsonio import json_safe, write_atomic
from dualtrain.parity.report.audit import audit_html, audit_markdown, audit_terminal, audit_verdict
from dualtrain.parity.report.compare import Comparison
from dualtrain.parity.report.html import html_report
from dualtrain.parity.report.markdown import markdown
from dualtrain.parity.report.terminal import terminal_summary
from dualtrain.parity.report.verdict import verdict, verdict_line
from dualtrain.records.verdict import REPORT_HTML, REPORT_MD, VERDICT_FILE

#: what a compare of two dualtrain runs or of two recorded runs gives
AnyComparison = Comparison | AuditComparison


def write_report(cmp: AnyComparison, out: str | Path) -> dict[str, Path]:
    """Write verdict.json, report.md and report.html into ``out``; return their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"verdict": out / VERDICT_FILE, "markdown": out / REPORT_MD, "html": out / REPORT_HTML}
    if isinstance(cmp, AuditComparison):
        v = audit_verdict(cmp)
        md, page = audit_markdown(cmp, v), audit_html(cmp, v)
    else:
        v = verdict(cmp)  # the report model, built once; every renderer reads it
        md, page = markdown(cmp, v), html_report(cmp, v=v)
    write_atomic(paths["verdict"], json.dumps(json_safe(v), indent=2) + "\n")
    write_atomic(paths["markdown"], md)
    write_atomic(paths["html"], page)
    return paths


def terminal_text(cmp: AnyComparison) -> str:
    """What the terminal shows of a compare: the checks table, the causes or differences, the
    verdict line."""
    return audit_terminal(cmp) if isinstance(cmp, AuditComparison) else terminal_summary(cmp)


def verdict_of(cmp: AnyComparison) -> str:
    return cmp.verdict if isinstance(cmp, AuditComparison) else verdict_line(cmp)

"""Writing the three report files."""

from __future__ import annotations

import json
from pathlib import Path

from dualtrain.jsonio import json_safe
from dualtrain.parity.report.compare import REPORT_HTML, REPORT_MD, VERDICT_FILE, Comparison
from dualtrain.parity.report.html import html_report
from dualtrain.parity.report.markdown import markdown
from dualtrain.parity.report.verdict import verdict


def write_report(cmp: Comparison, out: str | Path) -> dict[str, Path]:
    """Write verdict.json, report.md and report.html into ``out``; return their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"verdict": out / VERDICT_FILE, "markdown": out / REPORT_MD, "html": out / REPORT_HTML}
    v = verdict(cmp)  # the report model, built once; every renderer reads it
    paths["verdict"].write_text(json.dumps(json_safe(v), indent=2) + "\n")
    paths["markdown"].write_text(markdown(cmp, v))
    paths["html"].write_text(html_report(cmp, v=v))
    return paths

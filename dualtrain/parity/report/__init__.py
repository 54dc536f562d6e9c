"""The compare report: verdict.json, report.md, a self-contained report.html, and the terminal
table.

report.html has no external assets: styles are inline and every figure is a PNG embedded as a base64
data URI (matplotlib, Agg backend), so the file can be mailed or attached to a CI run as it is.

The package: ``compare`` (:class:`Comparison`: two runs' records and their checks, built once),
then one module per output, each reading that same Comparison: ``terminal`` (the table and the
verdict line), ``verdict`` (verdict.json: the report's data for machines), ``figures``,
``markdown``, ``html`` (with ``tables``, the probes and tolerances both show). Two recorded runs
(dualtrain.audit's :class:`AuditComparison`) are rendered by ``audit``. What every report shows
alike, the checks table and the findings, is ``sections``; the page's styles, environment section
and curves are ``page``. ``write`` (:func:`write_report`) writes either kind.
"""

from dualtrain.parity.report.compare import (
    Comparison,
    compare_dirs,
    compare_records,
)
from dualtrain.parity.report.figures import (
    figures,
)
from dualtrain.parity.report.html import (
    html_report,
)
from dualtrain.parity.report.markdown import (
    markdown,
)
from dualtrain.parity.report.sections import (
    fmt_value,
)
from dualtrain.parity.report.tables import (
    local_data,
)
from dualtrain.parity.report.terminal import (
    table,
    terminal_summary,
)
from dualtrain.parity.report.verdict import (
    environment,
    experiment,
    verdict,
    verdict_line,
)
from dualtrain.parity.report.write import (
    AnyComparison,
    terminal_text,
    verdict_of,
    write_report,
)
from dualtrain.records.verdict import (
    REPORT_HTML,
    REPORT_MD,
    VERDICT_FILE,
)

__all__ = [
    "AnyComparison",
    "Comparison",
    "REPORT_HTML",
    "REPORT_MD",
    "VERDICT_FILE",
    "compare_dirs",
    "compare_records",
    "environment",
    "experiment",
    "figures",
    "fmt_value",
    "html_report",
    "local_data",
    "markdown",
    "table",
    "terminal_summary",
    "terminal_text",
    "verdict",
    "verdict_line",
    "verdict_of",
    "write_report",
]

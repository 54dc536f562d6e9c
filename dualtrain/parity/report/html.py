"""report.html: self-contained (inline styles, figures embedded)."""

from __future__ import annotations

import html
from typing import Any

from dualtrain.parity.diagnose import Diagnosis
from dualtrain.parity.report import kernels as kernels_report
from dualtrain.parity.report import limits as limits_report
from dualtrain.parity.report import where
from dualtrain.parity.report.compare import Comparison
from dualtrain.parity.report.figures import figures
from dualtrain.parity.report.page import CSS, env_html
from dualtrain.parity.report.sections import checks_html
from dualtrain.parity.report.tables import (
    LOCAL_INTRO,
    TOLERANCE_HEAD,
    local_table_head,
    local_table_rows,
    tolerance_rows,
)
from dualtrain.parity.report.verdict import EXPERIMENT_ROWS, spec_yaml, verdict


def html_report(
    cmp: Comparison, figs: dict[str, str] | None = None, v: dict[str, Any] | None = None
) -> str:
    e = html.escape
    v = verdict(cmp) if v is None else v  # the report model (verdict.json's data)
    d = cmp.diagnosis
    figs = figures(cmp) if figs is None else figs
    parts = [
        "<!DOCTYPE html>",
        "<html><head><meta charset='utf-8'>",
        f"<title>dualtrain compare: {e(str(v['experiment']['name']))}: "
        f"{'PASS' if cmp.passed else 'FAIL'}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>dualtrain compare: {e(str(v['experiment']['name']))}</h1>",
        f"<p class='verdict {'v-pass' if cmp.passed else 'v-fail'}'>{e(v['verdict'])}</p>",
        "<table>"
        + "".join(
            f"<tr><th>{e(label)}</th><td>{e(str(v['experiment'][key]))}</td></tr>"
            for label, key in EXPERIMENT_ROWS
        )
        + "</table>",
        "<details><summary>the spec (A's; spec.yaml of its run)</summary><pre>"
        f"{e(spec_yaml(v['experiment']['spec']))}</pre></details>",
        "<table><tr><th>run</th><th>path</th><th>versions</th></tr>",
    ]
    for key, run in v["runs"].items():
        vers = ", ".join(f"{k} {val}" for k, val in v["versions"].get(key, {}).items())
        parts.append(
            f"<tr><td>{e(key)}: {e(run['label'])}</td><td><code>{e(run['path'])}</code></td>"
            f"<td>{e(vers)}</td></tr>"
        )
    parts.append("</table>")
    _checks_html(parts, cmp)
    local_rows = local_table_rows(cmp)
    if local_rows:
        parts.append(
            f"<h2>Precision path: one-step probes</h2><p>{e(LOCAL_INTRO)}</p><table><tr>"
            + "".join(f"<th>{e(h)}</th>" for h in local_table_head(cmp))
            + "</tr>"
        )
        parts += ["<tr>" + "".join(f"<td>{e(x)}</td>" for x in r) + "</tr>" for r in local_rows]
        parts.append("</table>")
    parts += kernels_report.html_parts(v.get("kernels"))
    parts += limits_report.html_parts(v.get("framework_limits"))
    _diagnosis_html(parts, d)
    parts += where.html_parts(cmp)
    if cmp.notes:
        parts.append("<ul>" + "".join(f"<li>{e(n)}</li>" for n in cmp.notes) + "</ul>")
    parts += env_html(v)
    parts.append("<h2>Figures</h2>")
    for title, b64 in figs.items():
        parts.append(f"<h3>{e(title)}</h3><img alt='{e(title)}' src='data:image/png;base64,{b64}'>")
    parts.append(
        "<h2>Tolerance table</h2><table><tr>"
        + "".join(f"<th>{e(h)}</th>" for h in TOLERANCE_HEAD)
        + "</tr>"
    )
    for row in tolerance_rows():
        parts.append("<tr>" + "".join(f"<td>{e(x)}</td>" for x in row) + "</tr>")
    parts.append("</table></body></html>")
    return "\n".join(parts)


def _checks_html(parts: list[str], cmp: Comparison) -> None:
    """The checks table, with its tolerance row and groups."""
    e = html.escape
    parts.append(f"<h2>Checks</h2><p>Tolerance row: <b>{e(cmp.tolerance.precision)}</b>.</p>")
    parts.append(
        "<p>Groups: <b>records</b> (the inputs of the arithmetic, exact), <b>semantics</b> "
        "(the fp64 reference pair agrees to rounding), <b>numerics</b> (the requested precision: "
        "its drift against each backend's distance to its fp64 run, which describes; the "
        "one-step probes and the convergence check, which judge each backend's precision "
        "path).</p>"
    )
    parts.append(checks_html(cmp.checks))


def _diagnosis_html(parts: list[str], d: Diagnosis) -> None:
    """The diagnosis: category, first divergent step and causes, spec differences, the most
    divergent tensors."""
    e = html.escape
    parts.append("<h2>Diagnosis</h2>")
    if d.passed:
        parts.append("<p>All checks pass: the two runs agree within the tolerances.</p>")
    else:
        step = d.first_divergent_step if d.first_divergent_step is not None else "none"
        if d.finding:
            parts.append(f"<p>Finding: <b>{e(d.finding)}</b></p>")
        likely = f" Likely cause: <b>{e(str(d.cause))}</b>." if d.cause != d.category else ""
        parts.append(
            f"<p>Category: <b>{e(str(d.category))}</b>. First divergent step: "
            f"<b>{e(str(step))}</b>.{likely}</p><ul>"
        )
        parts += [
            f"<li>{e(c.name)} ({'before training' if c.step == 0 else f'step {c.step}'}): "
            f"{e(c.evidence)}</li>"
            for c in d.causes
        ]
        parts.append("</ul>")
    if d.spec_differences:
        parts.append("<table><tr><th>spec field</th><th>A</th><th>B</th><th></th></tr>")
        for s in d.spec_differences:
            kind = "ignored (cosmetic)" if s["cosmetic"] else "changes the run"
            parts.append(
                f"<tr><td>{e(s['field'])}</td><td>{e(repr(s['a']))}</td>"
                f"<td>{e(repr(s['b']))}</td><td>{kind}</td></tr>"
            )
        parts.append("</table>")
    if d.top_parameters and d.top_parameters[0]["rel_diff"] > 0:
        parts.append(
            "<p>Final weights, most divergent tensors: "
            + ", ".join(
                f"<code>{e(p['name'])}</code> {p['rel_diff']:.3g}" for p in d.top_parameters
            )
            + "</p>"
        )
    if d.top_gradients:
        parts.append(
            f"<p>Gradients at step {d.gradient_step}, most divergent tensors: "
            + ", ".join(f"<code>{e(p['name'])}</code> {p['rel_diff']:.3g}" for p in d.top_gradients)
            + "</p>"
        )

"""report.md."""

from __future__ import annotations

from typing import Any

from dualtrain.parity.diagnose import Diagnosis
from dualtrain.parity.report import kernels as kernels_report
from dualtrain.parity.report import limits as limits_report
from dualtrain.parity.report import where
from dualtrain.parity.report.compare import Comparison
from dualtrain.parity.report.page import env_markdown
from dualtrain.parity.report.sections import checks_markdown
from dualtrain.parity.report.tables import LOCAL_INTRO, local_table_head, local_table_rows
from dualtrain.parity.report.verdict import EXPERIMENT_ROWS, spec_yaml, verdict


def markdown(cmp: Comparison, v: dict[str, Any] | None = None) -> str:
    v = verdict(cmp) if v is None else v  # the report model (verdict.json's data)
    d = cmp.diagnosis
    x = v["experiment"]
    lines = [
        f"# dualtrain compare: {x['name']}: {'PASS' if cmp.passed else 'FAIL'}",
        "",
        f"`{v['verdict']}`",
        "",
        "| experiment | |",
        "|---|---|",
    ]
    lines += [f"| {label} | {x[key]} |" for label, key in EXPERIMENT_ROWS]
    lines += [
        "",
        "<details><summary>the spec (A's; spec.yaml of its run)</summary>",
        "",
        "```yaml",
        spec_yaml(x["spec"]).rstrip(),
        "```",
        "",
        "</details>",
        "",
        "| run | path |",
        "|---|---|",
    ]
    for key, run in v["runs"].items():
        lines.append(f"| {key}: {run['label']} | `{run['path']}` |")
    lines += [
        "",
        f"Tolerances: **{cmp.tolerance.precision}** row (see docs/parity.md). Groups: "
        "records (inputs, exact), semantics (the fp64 reference pair), numerics (the requested "
        "precision: its drift against its distance to fp64, which describes; and the one-step "
        "probes and the convergence check, which judge each backend's precision path).",
        "",
    ]
    lines += checks_markdown(cmp.checks)
    local_rows = local_table_rows(cmp)
    if local_rows:
        head = local_table_head(cmp)
        lines += [
            "",
            "## Precision path: one-step probes",
            "",
            LOCAL_INTRO,
            "",
            "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head),
        ]
        lines += ["| " + " | ".join(r) + " |" for r in local_rows]
    lines += kernels_report.markdown(v.get("kernels"))
    lines += limits_report.markdown(v.get("framework_limits"))
    _diagnosis_markdown(lines, d)
    lines += where.markdown(cmp)
    lines += env_markdown(v)
    if cmp.notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in cmp.notes]
    lines += [
        "",
        ("Figures: see report.html (self-contained). How to read this report: docs/report.md."),
        "",
    ]
    return "\n".join(lines)


def _diagnosis_markdown(lines: list[str], d: Diagnosis) -> None:
    """The diagnosis: first divergent step, category and causes, spec differences, the most
    divergent tensors."""
    lines += ["", "## Diagnosis", ""]
    if d.passed:
        lines.append("All checks pass: the two runs agree within the tolerances.")
    else:
        step = d.first_divergent_step
        if d.finding:
            lines.append(f"- **finding**: **{d.finding}**")
        lines.append(
            f"- first divergent step: "
            f"{step if step is not None else 'none (no per-step check failed)'}"
        )
        lines.append(f"- category: **{d.category}**")
        if d.cause != d.category:  # the category's name is the cause: said once
            lines.append(f"- likely cause: **{d.cause}**")
        for cause in d.causes:
            at = "before training" if cause.step == 0 else f"step {cause.step}"
            lines.append(f"  - {cause.name} ({at}): {cause.evidence}")
    if d.spec_differences:
        lines += ["", "Spec differences:", "", "| field | A | B | |", "|---|---|---|---|"]
        for s in d.spec_differences:
            lines.append(
                f"| {s['field']} | `{s['a']!r}` | `{s['b']!r}` | "
                f"{'ignored (cosmetic)' if s['cosmetic'] else 'changes the run'} |"
            )
    if d.top_parameters and d.top_parameters[0]["rel_diff"] > 0:
        lines += ["", "Final weights, most divergent tensors (relative difference):", ""]
        lines += [f"- `{p['name']}`: {p['rel_diff']:.3g}" for p in d.top_parameters]
    if d.top_gradients:
        lines += ["", f"Gradients at step {d.gradient_step}, most divergent tensors:", ""]
        lines += [f"- `{p['name']}`: {p['rel_diff']:.3g}" for p in d.top_gradients]

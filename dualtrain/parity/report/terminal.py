"""What ``dualtrain compare`` prints: the verdict line and the checks table."""

from __future__ import annotations

from dualtrain.parity.report import kernels as kernels_report
from dualtrain.parity.report import limits as limits_report
from dualtrain.parity.report.compare import Comparison
from dualtrain.parity.report.sections import checks_terminal
from dualtrain.parity.report.verdict import environment, verdict_line


def table(cmp: Comparison) -> str:
    """The short aligned table printed to the terminal."""
    return checks_terminal(cmp.checks)


def terminal_summary(cmp: Comparison) -> str:
    out = [table(cmp), ""]
    d = cmp.diagnosis
    if not d.passed:
        for c in d.causes:
            at = "before training" if c.step == 0 else (f"step {c.step}" if c.step else "")
            out.append(
                f"  cause: {c.name} ({at}): {c.evidence}"
                if at
                else f"  cause: {c.name}: {c.evidence}"
            )
        rel = [s for s in d.spec_differences if not s["cosmetic"]]
        if rel:
            out.append(
                "  spec differences: "
                + ", ".join(f"{s['field']}: {s['a']!r} vs {s['b']!r}" for s in rel)
            )
        if d.top_parameters and d.top_parameters[0]["rel_diff"] > 0:
            out.append(
                "  most divergent parameters: "
                + ", ".join(f"{p['name']} ({p['rel_diff']:.3g})" for p in d.top_parameters[:3])
            )
    env = environment(cmp)
    if env["differences"]:
        names = [d["fact"] for d in env["differences"]]
        out.append(
            f"  environment differs in {len(names)} fact{'s' if len(names) > 1 else ''}: "
            f"{', '.join(names[:4])}{', ...' if len(names) > 4 else ''} (see the report)"
        )
    differ = kernels_report.line(kernels_report.model(cmp))
    if differ:
        out.append(f"  kernels: {differ}")
    out += [f"  {line}" for line in limits_report.lines(limits_report.model(cmp))]
    for n in cmp.notes:
        out.append(f"  note: {n}")
    out.append(verdict_line(cmp))
    return "\n".join(out)

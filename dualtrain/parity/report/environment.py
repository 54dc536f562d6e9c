"""The environment section (versions, ISA, settings that change rounding) of both reports."""

from __future__ import annotations

import html
from typing import Any

from dualtrain.records.envinfo import show

# ---- the environment section ---------------------------------------------------------------------

_ENV_INTRO = (
    "Core facts are compared between all runs, a backend's facts only between runs of "
    "that backend (docs/env.md)."
)


def _env_table(v: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """(column heads, rows) of the differing env facts, or None when there are none."""
    diffs = v["environment"]["differences"]
    if not diffs:
        return None
    keys = [k for k in v["runs"] if any(k in d["values"] for d in diffs)]
    head = ["fact"] + [f"{k}: {v['runs'][k]['label']}" for k in keys]
    rows = [
        [d["fact"]] + [show(d["values"][k]) if k in d["values"] else "" for k in keys]
        for d in diffs
    ]
    return head, rows


def _env_status(v: dict[str, Any]) -> str | None:
    """One line when there is no table: the environments match, or could not be compared."""
    env = v["environment"]
    missing = env["missing"]
    note = (
        f" Not recorded in {', '.join(missing)} (a run from before dualtrain recorded its "
        "environment)."
        if missing
        else ""
    )
    if env["differences"]:
        return note.strip() or None
    if len(env["compared"]) >= 2:
        return f"Environments match ({len(env['compared'])} runs).{note}"
    return note.strip() or None


def env_markdown(v: dict[str, Any]) -> list[str]:
    lines = ["", "## Environment", ""]
    table_ = _env_table(v)
    if table_ is not None:
        head, rows = table_
        lines += [
            f"Facts that differ between the runs. {_ENV_INTRO}",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head),
        ]
        lines += [
            "| " + " | ".join([f"`{r[0]}`"] + [x.replace("|", chr(92) + "|") for x in r[1:]]) + " |"
            for r in rows
        ]
    status_ = _env_status(v)
    if status_:
        lines += ([""] if table_ is not None else []) + [status_]
    return lines if len(lines) > 3 else []


def env_html(v: dict[str, Any]) -> list[str]:
    e = html.escape
    parts = []
    table_ = _env_table(v)
    if table_ is not None:
        head, rows = table_
        parts.append(f"<p>Facts that differ between the runs. {e(_ENV_INTRO)}</p>")
        parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>")
        parts += [
            "<tr>"
            + f"<td><code>{e(r[0])}</code></td>"
            + "".join(f"<td>{e(x)}</td>" for x in r[1:])
            + "</tr>"
            for r in rows
        ]
        parts.append("</table>")
    status_ = _env_status(v)
    if status_:
        parts.append(f"<p>{e(status_)}</p>")
    return ["<h2>Environment</h2>"] + parts if parts else []

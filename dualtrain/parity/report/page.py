"""What both compare reports share (a dualtrain run pair's, dualtrain.parity.report, and two
audit records', dualtrain.audit.report): the HTML page's styles, the environment section, and the
per-step curves of run records as PNG figures (matplotlib, Agg, imported lazily) for base64 data
URIs."""

from __future__ import annotations

import base64
import html
import io
from typing import Any

import numpy as np

from dualtrain.records.envinfo import show
from dualtrain.records.record import RunRecord, step_map

#: report.html's styles
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;\
max-width:1000px;
color:#222;padding:0 1em}
table{border-collapse:collapse;margin:1em 0;font-size:14px}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3}
.PASS{color:#137333;font-weight:bold}.FAIL{color:#b00020;font-weight:bold}.INFO,.NOT{color:#555}
.verdict{font-size:18px;padding:.6em 1em;border-radius:4px}
.v-pass{background:#e6f4ea}.v-fail{background:#fce8e6}
code{background:#f5f5f5;padding:0 3px}
img{max-width:100%;border:1px solid #eee;margin:.5em 0}
"""


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


# ---- the curves ----------------------------------------------------------------------------------


def png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt  # lazy: heavy (~300 ms)

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def series(rec: RunRecord, key: str, kind: str = "train") -> tuple[np.ndarray, np.ndarray]:
    m = step_map(rec, key, kind)
    steps = sorted(m)
    return np.array(steps), np.array([m[s] for s in steps], dtype=np.float64)


def pyplot() -> Any:
    import matplotlib  # lazy: heavy (~300 ms)

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt  # lazy: heavy (~300 ms)

    return plt


def curves(a: RunRecord, b: RunRecord, la: str, lb: str) -> dict[str, str]:
    """The per-step curves of two runs that only recorded their steps (dualtrain.audit's records):
    training loss, learning rate, and the loss scale where either run scales the loss."""
    plt = pyplot()
    runs = [(a, la, "-", 1.6), (b, lb, "--", 1.2)]
    out: dict[str, str] = {}
    training_loss(plt, runs, out)
    curve(plt, runs, out, "lr", "learning rate", "Learning rate")
    if any(np.isfinite(series(rec, "loss_scale")[1]).any() for rec in (a, b)):
        loss_scale_curve(plt, runs, out)
    return out


def training_loss(
    plt: Any, runs: list[tuple[RunRecord, str, str, float]], out: dict[str, str]
) -> None:
    curve(plt, runs, out, "loss", "training loss", "Training loss")


def curve(
    plt: Any,
    runs: list[tuple[RunRecord, str, str, float]],
    out: dict[str, str],
    key: str,
    ylabel: str,
    title: str,
) -> None:
    """``key`` per training step, one line a run."""
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for rec, name, style, lw in runs:
        x, y = series(rec, key)
        ax.plot(x, y, style, lw=lw, label=name)
    ax.set(xlabel="step", ylabel=ylabel, title=title)
    ax.legend()
    ax.grid(alpha=0.3)
    out[title] = png(fig)


def loss_scale_curve(
    plt: Any, runs: list[tuple[RunRecord, str, str, float]], out: dict[str, str]
) -> None:
    fig, ax = plt.subplots(figsize=(8, 3.0))
    for rec, name, style, lw in runs[:2]:
        x, y = series(rec, "loss_scale")
        ax.plot(x, y, style, lw=lw, label=name)
        xs, sk = series(rec, "skipped")
        hit = sk > 0
        if hit.any():
            ys = dict(zip(x.tolist(), y.tolist(), strict=True))
            ax.plot(
                xs[hit], [ys.get(s, np.nan) for s in xs[hit].tolist()], "x", label=f"{name} skipped"
            )
    ax.set_yscale("log", base=2)
    ax.set(xlabel="step", ylabel="loss scale", title="Loss scale (1 = no loss scaling)")
    ax.legend()
    ax.grid(alpha=0.3)
    out["Loss scale"] = png(fig)

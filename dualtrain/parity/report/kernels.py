"""Which kernels each backend's precision path ran on (the runs' summary.json ``kernels``;
dualtrain.core.kernels): a table in both reports, a terminal line when the backends differ."""

from __future__ import annotations

import html
from typing import Any

from dualtrain.core import kernels
from dualtrain.parity import readings as R
from dualtrain.parity.report.compare import Comparison
from dualtrain.parity.tolerances import precision_of

_INTRO = (
    "Each run measured its own low-precision products on its machine before training (inputs "
    "exact in the dtype, against their exact float64 product): directed is the coherent scale "
    "error, rms the rest, in units of the precision's u. A kernel that truncates (TensorFlow's "
    "Eigen bf16 MatMul where oneDNN has no bf16: a CPU without AVX-512) moves the loss by its "
    "directed error times the loss's sensitivity; local_loss's cross bound moves the other "
    "backend's errors onto each backend's kernels (docs/parity.md §7)."
)


def model(cmp: Comparison) -> dict[str, Any] | None:
    """verdict.json ``kernels``: per run (a, b) and kind its implementation, native or emulated,
    and the calibration; ``differ``: the kinds where the backends' kernels differ in either. None
    for runs outside bf16/fp16 or without kernel facts."""
    dtype = precision_of(cmp.a.spec)
    if dtype not in kernels.DTYPES or precision_of(cmp.b.spec) != dtype:
        return None
    labels = R.labels(cmp.a, cmp.b)
    runs: dict[str, Any] = {}
    for key, rec, label in (("a", cmp.a, labels[0]), ("b", cmp.b, labels[1])):
        facts = rec.summary.get("kernels") or {}
        runs[key] = {
            "label": label,
            "kinds": {
                kind: {
                    **(((facts.get("static") or {}).get(dtype) or {}).get(kind) or {}),
                    **({"measured": m} if (m := _measured(facts, dtype, kind)) else {}),
                    "text": kernels.describe(facts, dtype, kind) if facts else "not recorded",
                }
                for kind in kernels.KINDS
            },
        }
    differ = [
        k for k in kernels.KINDS if _key(runs["a"]["kinds"][k]) != _key(runs["b"]["kinds"][k])
    ]
    return {"dtype": dtype, "runs": runs, "differ": differ}


def _measured(facts: dict[str, Any], dtype: str, kind: str) -> dict[str, Any] | None:
    return ((facts.get("measured") or {}).get(dtype) or {}).get(kind)


def _key(k: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two kernels differ for a reader: native or emulated, and how they round."""
    return (k.get("native"), (k.get("measured") or {}).get("rounding"))


def line(v: dict[str, Any] | None) -> str | None:
    """The terminal's line when the two backends' kernels differ; None otherwise."""
    if not v or not v["differ"]:
        return None
    parts = [
        f"{kind}: "
        + "; ".join(f"{r['label']} {r['kinds'][kind]['text']}" for r in v["runs"].values())
        for kind in v["differ"]
    ]
    return f"the backends' {v['dtype']} kernels differ: " + " | ".join(parts)


def _rows(v: dict[str, Any]) -> list[list[str]]:
    return [
        [
            r["label"],
            kind,
            r["kinds"][kind]["text"] + (" **differs**" if kind in v["differ"] else ""),
        ]
        for r in v["runs"].values()
        for kind in kernels.KINDS
    ]


def markdown(v: dict[str, Any] | None) -> list[str]:
    if not v:
        return []
    lines = [
        "",
        f"## Kernels of the {v['dtype']} path",
        "",
        _INTRO,
        "",
        "| backend | product | kernel |",
    ]
    lines.append("|---|---|---|")
    lines += ["| " + " | ".join(r) + " |" for r in _rows(v)]
    return lines


def html_parts(v: dict[str, Any] | None) -> list[str]:
    if not v:
        return []
    e = html.escape
    parts = [f"<h2>Kernels of the {e(v['dtype'])} path</h2>", f"<p>{e(_INTRO)}</p>", "<table>"]
    parts.append("<tr><th>backend</th><th>product</th><th>kernel</th></tr>")
    for label, kind, text in _rows(v):
        bold = text.endswith(" **differs**")
        text = text.removesuffix(" **differs**")
        cell = f"<b>{e(text)} (differs)</b>" if bold else e(text)
        parts.append(f"<tr><td>{e(label)}</td><td>{e(kind)}</td><td>{cell}</td></tr>")
    parts.append("</table>")
    return parts

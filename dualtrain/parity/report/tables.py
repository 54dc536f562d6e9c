"""Tables report.md and report.html share: the tolerances and the one-step probes."""

from __future__ import annotations

from typing import Any

from dualtrain.parity import readings as R
from dualtrain.parity.checks import (
    Check,
)
from dualtrain.parity.report.compare import Comparison
from dualtrain.parity.report.sections import fmt_value
from dualtrain.parity.tolerances import REFERENCE, TOLERANCES

# ---- report.md / report.html ---------------------------------------------------------------------


def tolerance_rows() -> list[tuple[str, ...]]:
    r = REFERENCE
    rows: list[tuple[str, ...]] = [
        (
            "fp64 pair (semantics)",
            f"{r.loss_abs:g} abs",
            "-",
            f"{r.weights_rel:g} rel",
            "-",
            f"identical; eval loss {r.eval_loss_abs:g}",
        )
    ]
    for name, t in TOLERANCES.items():
        if name == "fp64":
            continue
        rows.append(
            (
                name,
                f"{t.factor:g} x max(dist, {t.traj_abs_floor:g})",
                f"{t.traj_fixed:g}",
                f"{t.factor:g} x max(dist, {t.weights_floor:g})",
                f"{t.weights_fixed:g}",
                f"max({t.eval_pp:g} pp, {t.factor:g} x dist)",
            )
        )
    return rows


TOLERANCE_HEAD = (
    "precision",
    "trajectory",
    "trajectory (no reference)",
    "final_weights",
    "final_weights (no reference)",
    "eval",
)


# ---- the one-step probes (local checks) ---------------------------------------------------------


def local_data(cmp: Comparison) -> list[tuple[Check, dict[str, Any]]]:
    """The local checks that ran, with their per-probe numbers."""
    return [(c, c.data) for c in cmp.checks if c.name.startswith("local_") and c.ran and c.data]


LOCAL_INTRO = (
    "One step of the requested precision from the fp64 run's state at each probe step, "
    "on each backend, against the exact step from the same state (docs/parity.md §7). "
    "Errors are relative. A priori bound: from the precision's unit roundoff u (update: "
    "the rounding floor of the new weights plus a multiple of float32's u), at every probe "
    "(the gradient: its median over the probes, since a ReLU or max-pool switch can "
    "legitimately move one probe). Cross bound: a backend's rms (gradient: median) over "
    "the probes may be at most ratio x the other backend's (or a floor). Neither bound "
    "is computed from the run it judges."
)


def local_table_rows(cmp: Comparison) -> list[list[str]]:
    la, lb = R.labels(cmp.a, cmp.b)
    rows = []
    for _c, d in local_data(cmp):
        for k, step in enumerate(d["steps"]):
            rows.append(
                [
                    d["quantity"],
                    str(step),
                    fmt_value(d["a"][k]),
                    fmt_value(d["b"][k]),
                    fmt_value(d["a_priori"][k]),
                ]
            )
        rows.append(
            [
                d["quantity"],
                d["summary"],
                fmt_value(d["aggregate"][0]),
                fmt_value(d["aggregate"][1]),
                f"cross: {la} <= {fmt_value(d['cross'][0])}, {lb} <= {fmt_value(d['cross'][1])}",
            ]
        )
    return rows


def local_table_head(cmp: Comparison) -> list[str]:
    la, lb = R.labels(cmp.a, cmp.b)
    return ["quantity", "probe step", f"{la} error", f"{lb} error", "bound"]

"""The report's figures: PNGs (matplotlib, Agg) as base64 data URIs."""

from __future__ import annotations

from typing import Any

import numpy as np

from dualtrain.parity import readings as R
from dualtrain.parity.checks import (
    Check,
    Reference,
    is_fp64_pair,
    trajectory,
)
from dualtrain.parity.report import where
from dualtrain.parity.report.compare import Comparison
from dualtrain.parity.report.page import loss_scale_curve, png, pyplot, series, training_loss
from dualtrain.parity.report.tables import local_data
from dualtrain.parity.tolerances import REFERENCE
from dualtrain.records.record import RunRecord

# ---- figures -------------------------------------------------------------------------------------


def figures(cmp: Comparison) -> dict[str, str]:
    """Title -> base64 PNG."""
    plt = pyplot()
    la, lb = R.labels(cmp.a, cmp.b)
    runs = [(cmp.a, la, "-", 1.6), (cmp.b, lb, "--", 1.2)]
    ref = cmp.reference
    separate_ref = ref is not None and ref.a is not cmp.a
    if ref is not None and separate_ref:
        runs += [(ref.a, f"{la} fp64", ":", 1.0), (ref.b, f"{lb} fp64", "-.", 1.0)]
    out: dict[str, str] = {}

    where.figure(plt, cmp, out)  # the first divergent step, where a replay ran: first

    training_loss(plt, runs, out)

    if ref is not None:  # the semantic check: the fp64 pair against its bound
        _reference_pair(plt, ref, la, lb, out)

    if not is_fp64_pair(cmp.a, cmp.b):
        _trajectory(plt, cmp, ref, la, lb, out)

    local = local_data(cmp)
    if local:
        _one_step_errors(plt, cmp, local, la, lb, out)

    _evaluation(plt, runs, out)

    loss_scale_curve(plt, runs, out)

    _throughput(plt, runs, out)
    return out


def pos(v: np.ndarray) -> np.ndarray:  # log scale: exact zeros are not drawn
    return np.where(v > 0, v, np.nan)


def _reference_pair(plt: Any, ref: Reference, la: str, lb: str, out: dict[str, str]) -> None:
    """The semantic check: the fp64 pair's per-step loss difference against its bound."""
    steps, diff = R.loss_diff(ref.a, ref.b)
    fig, ax = plt.subplots(figsize=(8, 3.2))
    ax.plot(steps, pos(diff), ".", ms=2.5, label=f"|{la} fp64 - {lb} fp64|")
    ax.axhline(REFERENCE.loss_abs, color="k", ls="--", lw=0.9, label="bound (semantics)")
    ax.set_yscale("log")
    ax.set(
        xlabel="step",
        ylabel="|loss difference|",
        title="Reference pair (fp64): per-step |loss difference| (exact zeros not drawn)",
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    out["Reference pair (fp64): per-step |loss difference| (log scale)"] = png(fig)


def _trajectory(
    plt: Any, cmp: Comparison, ref: Reference | None, la: str, lb: str, out: dict[str, str]
) -> None:
    """The per-step loss difference against each backend's distance to fp64 and the tolerance."""
    t = trajectory(cmp.a, cmp.b, ref, cmp.tolerance)
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.plot(t.steps, pos(t.cross), lw=1.2, label=f"|{la} - {lb}|")
    if t.noise is not None:
        # trajectory() sets the noise model and both distances to fp64 together
        assert t.rounding_a is not None and t.rounding_b is not None
        ax.plot(t.steps, pos(t.rounding_a), lw=0.8, alpha=0.7, label=f"|{la} - {la} fp64|")
        ax.plot(t.steps, pos(t.rounding_b), lw=0.8, alpha=0.7, label=f"|{lb} - {lb} fp64|")
    ax.plot(t.steps, t.allowed, "k--", lw=0.9, label="tolerance (numerics)")
    ax.set_yscale("log")
    ax.set(
        xlabel="step",
        ylabel="|loss difference|",
        title=f"{cmp.tolerance.precision}: per-step loss difference vs distance to fp64",
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    out["Per-step |loss difference| (log scale)"] = png(fig)


def _one_step_errors(
    plt: Any,
    cmp: Comparison,
    local: list[tuple[Check, dict[str, Any]]],
    la: str,
    lb: str,
    out: dict[str, str],
) -> None:
    """The one-step probes' errors per check, against their a priori and cross bounds."""
    fig, axes = plt.subplots(1, len(local), figsize=(3.2 * len(local) + 1, 3.4), squeeze=False)
    for ax, (c, dd) in zip(axes[0], local, strict=True):
        steps = np.array(dd["steps"])
        ax.plot(steps, pos(np.array(dd["a"], float)), "o", ms=5, label=la)
        ax.plot(steps, pos(np.array(dd["b"], float)), "x", ms=6, label=lb)
        ax.plot(steps, dd["a_priori"], "k--", lw=0.9, label="a priori bound")
        ax.axhline(
            dd["cross"][0],
            color="C0",
            ls=":",
            lw=0.9,
            label=f"cross bound ({la} {dd['summary']})",
        )
        ax.axhline(
            dd["cross"][1],
            color="C1",
            ls=":",
            lw=0.9,
            label=f"cross bound ({lb} {dd['summary']})",
        )
        ax.set_yscale("log")
        ax.set(xlabel="probe step", title=f"{c.name} ({'PASS' if c.passed else 'FAIL'})")
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("relative error vs the fp64 step")
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.suptitle(
        f"{cmp.tolerance.precision}: one-step errors from the fp64 states (log scale)", y=1.03
    )
    out["One-step errors against the fp64 step (log scale)"] = png(fig)


def _evaluation(
    plt: Any, runs: list[tuple[RunRecord, str, str, float]], out: dict[str, str]
) -> None:
    metric = R.metric_name(runs[0][0])
    pct = metric == "accuracy"
    fig, ax = plt.subplots(figsize=(8, 3.2))
    for rec, name, style, lw in runs:
        x, y = series(rec, metric, "eval")
        ax.plot(x, 100 * y if pct else y, style + "o", lw=lw, ms=4, label=name)
    ax.set(
        xlabel="step",
        ylabel=f"test {metric}{' (%)' if pct else ''}",
        title=f"Evaluation {metric}",
    )
    ax.legend()
    ax.grid(alpha=0.3)
    out[f"Evaluation {metric}"] = png(fig)


def _throughput(
    plt: Any, runs: list[tuple[RunRecord, str, str, float]], out: dict[str, str]
) -> None:
    fig, ax = plt.subplots(figsize=(8, 3.0))
    for rec, name, style, lw in runs[:2]:
        x, y = series(rec, "samples_per_s")
        overall = float(rec.summary.get("train_samples_per_s") or 0)
        ax.plot(x, y, style, lw=lw, label=f"{name} ({overall:,.0f} samples/s overall)")
    ax.set(xlabel="step", ylabel="samples/s", title="Training throughput (per logging window)")
    ax.legend()
    ax.grid(alpha=0.3)
    out["Throughput"] = png(fig)

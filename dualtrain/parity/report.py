"""The compare report: verdict.json, report.md, a self-contained report.html, and the terminal table.

report.html has no external assets: styles are inline and every figure is a PNG embedded as a base64
data URI (matplotlib, Agg backend), so the file can be mailed or attached to a CI run as it is.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dualtrain.jsonio import json_safe
from dualtrain.parity import records as R
from dualtrain.parity.checks import (
    Check,
    Reference,
    all_passed,
    is_fp64_pair,
    run_checks,
    tolerance_of,
    trajectory,
)
from dualtrain.parity.diagnose import Diagnosis, diagnose
from dualtrain.parity.tolerances import LOCAL, REFERENCE, TOLERANCES, Tolerance, precision_of
from dualtrain.records.envinfo import env_differences, show
from dualtrain.records.record import RunRecord, read_run
from dualtrain.version import __version__

VERDICT_FILE = "verdict.json"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"


@dataclass
class Comparison:
    a: RunRecord
    b: RunRecord
    reference: Reference | None
    """The fp64 reference pair (A's spec in float64 on A's and on B's backend); None: not run."""
    tolerance: Tolerance
    checks: list[Check]
    diagnosis: Diagnosis
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all_passed(self.checks)

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)


def compare_records(a: RunRecord, b: RunRecord, reference: Reference | None = None,
                    notes: list[str] | None = None) -> Comparison:
    checks = run_checks(a, b, reference)
    if reference is None and is_fp64_pair(a, b):
        reference = Reference(a, b)
    return Comparison(a, b, reference, tolerance_of(a, b), checks, diagnose(a, b, checks),
                      list(notes or []))


def _check_reference(ref_dir: Path, rec: RunRecord, of: RunRecord) -> None:
    """A reference run is ``of``'s spec in fp64: anything else would make it no yardstick."""
    from dualtrain.errors import UserError
    from dualtrain.parity.tolerances import precision_of

    if precision_of(rec.spec) != "fp64":
        raise UserError(f"a reference run must be fp64 (precision.dtype). Received: {str(ref_dir)!r} "
                        f"with {precision_of(rec.spec)}")
    other = [k for k, _, _ in R.spec_differences(of.spec, rec.spec)
             if not R.is_cosmetic(k) and not k.startswith("precision.")]
    if other:
        raise UserError(f"a reference run must be the compared run's spec in fp64; {ref_dir} differs in "
                        f"{', '.join(other[:5])}. Received: {str(ref_dir)!r}")


def compare_dirs(run_a: str | Path, run_b: str | Path,
                 reference: tuple[str | Path, str | Path] | None = None,
                 notes: list[str] | None = None) -> Comparison:
    """Load finished run directories (UserError if one is not) and run every check. ``reference``:
    the fp64 runs of A's spec on A's backend and on B's backend."""
    a, b = read_run(run_a), read_run(run_b)
    ref = None
    if reference is not None:
        ref = Reference(read_run(reference[0]), read_run(reference[1]))
        for d, rec, of in zip(reference, (ref.a, ref.b), (a, b)):
            _check_reference(Path(d), rec, of)
    return compare_records(a, b, ref, notes)


# ---- formatting ----------------------------------------------------------------------------------

def fmt_value(v: float | None) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    if v == 0:
        return "0"
    if float(v).is_integer() and abs(v) < 1e6:
        return f"{int(v)}"
    return f"{v:.3g}"


def status(c: Check) -> str:
    if not c.ran:
        return "NOT RUN"
    return "INFO" if c.informational else ("PASS" if c.passed else "FAIL")


def verdict_line(cmp: Comparison) -> str:
    scored = [c for c in cmp.checks if not c.informational]
    n_pass = sum(c.passed for c in scored)
    semantics = ("semantics checked against the fp64 reference pair" if cmp.reference is not None
                 else "semantics NOT checked: no fp64 reference")
    if cmp.passed:
        return f"verdict: PASS ({n_pass}/{len(scored)} checks; {semantics})"
    failed = ", ".join(cmp.diagnosis.failed_checks)
    category = cmp.diagnosis.category
    if cmp.diagnosis.culprits:
        category = f"{category}: {', '.join(cmp.diagnosis.culprits)}"
    return (f"verdict: FAIL, {category} ({n_pass}/{len(scored)} checks; failed: {failed}); "
            f"{cmp.diagnosis.summary()}")


def table(cmp: Comparison) -> str:
    """The short aligned table printed to the terminal."""
    rows = [("group", "check", "value", "tolerance", "result")]
    for c in cmp.checks:
        unit = f" {c.unit}" if c.unit and c.ran else ""
        tol = "-" if c.tolerance is None else f"<= {fmt_value(c.tolerance)}"
        rows.append((c.group, c.name, fmt_value(c.value) + unit, tol, status(c)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def terminal_summary(cmp: Comparison) -> str:
    out = [table(cmp), ""]
    d = cmp.diagnosis
    if not d.passed:
        for c in d.causes:
            at = "before training" if c.step == 0 else (f"step {c.step}" if c.step else "")
            out.append(f"  cause: {c.kind} ({at}): {c.evidence}" if at else f"  cause: {c.kind}: "
                       f"{c.evidence}")
        rel = [s for s in d.spec_differences if not s["cosmetic"]]
        if rel:
            out.append("  spec differences: " + ", ".join(
                f"{s['field']}: {s['a']!r} vs {s['b']!r}" for s in rel))
        if d.top_parameters and d.top_parameters[0]["rel_diff"] > 0:
            out.append("  most divergent parameters: " + ", ".join(
                f"{p['name']} ({p['rel_diff']:.3g})" for p in d.top_parameters[:3]))
    env = environment(cmp)
    if env["differences"]:
        names = [d["fact"] for d in env["differences"]]
        out.append(f"  environment differs in {len(names)} fact{'s' if len(names) > 1 else ''}: "
                   f"{', '.join(names[:4])}{', ...' if len(names) > 4 else ''} (see the report)")
    for n in cmp.notes:
        out.append(f"  note: {n}")
    out.append(verdict_line(cmp))
    return "\n".join(out)


# ---- verdict.json --------------------------------------------------------------------------------

def _versions(rec: RunRecord | None) -> dict[str, Any]:
    return dict(rec.summary.get("versions", {})) if rec is not None else {}


def _runs(cmp: Comparison) -> dict[str, RunRecord]:
    """The compared runs by verdict key: a, b and, when they are separate runs, the reference
    pair."""
    runs = {"a": cmp.a, "b": cmp.b}
    ref = cmp.reference
    if ref is not None and ref.a is not cmp.a:
        runs.update(reference_a=ref.a, reference_b=ref.b)
    return runs


def environment(cmp: Comparison) -> dict[str, Any]:
    """The env facts (summary.json ``env``, docs/env.md) that differ between the compared runs: core
    facts across all of them, a backend's facts between the runs of that backend only."""
    return env_differences({k: rec.summary.get("env") for k, rec in _runs(cmp).items()})


def _model_line(model: dict[str, Any]) -> str:
    if model.get("preset"):
        return f"preset {model['preset']}"
    layers = model.get("layers") or []

    def name(layer: dict[str, Any]) -> str:
        t = str(layer.get("type", "?"))
        size = layer.get("units") or layer.get("filters")
        return f"{t} {size}" if size else t

    return f"{len(layers)} layers: " + ", ".join(name(x) for x in layers)


def experiment(cmp: Comparison) -> dict[str, Any]:
    """What was compared, so the report stands on its own: the spec's key facts and the spec."""
    spec = cmp.a.spec or {}
    data, opt = spec.get("data") or {}, spec.get("optimizer") or {}
    dist, train = spec.get("distribution") or {}, spec.get("train") or {}
    schedule = (opt.get("schedule") or {}).get("name", "constant")
    extras = [f"{k} {opt[k]}" for k in ("momentum", "weight_decay", "clip_grad_norm")
              if opt.get(k) not in (None, 0, 0.0, False)]
    out = {
        "name": spec.get("name"),
        "model": _model_line(spec.get("model") or {}),
        "world_size": dist.get("world_size"),
        "tf_strategy": (spec.get("tf") or {}).get("strategy"),
        "precision": precision_of(spec),
        "steps": cmp.a.summary.get("steps"),
        "epochs": train.get("epochs"),
        "batch_size": data.get("batch_size"),
        "train_samples": data.get("train_limit") or "all (60,000)",
        "optimizer": " ".join([str(opt.get("name")), f"lr {opt.get('lr')}", *extras,
                               f"schedule {schedule}"]),
        "seed": spec.get("seed"),
        "spec": spec,
    }
    if cmp.b.spec and cmp.b.spec != spec:
        out["spec_b"] = cmp.b.spec
    return out


_EXPERIMENT_ROWS = (("spec", "name"), ("model", "model"), ("world size", "world_size"),
                    ("tf strategy", "tf_strategy"), ("precision", "precision"), ("steps", "steps"),
                    ("epochs", "epochs"), ("global batch", "batch_size"),
                    ("training samples", "train_samples"), ("optimizer", "optimizer"),
                    ("seed", "seed"))


def _spec_yaml(spec: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(spec, sort_keys=False)


def verdict(cmp: Comparison) -> dict[str, Any]:
    la, lb = R.labels(cmp.a, cmp.b)
    runs = {"a": {"label": la, "path": str(cmp.a.path)}, "b": {"label": lb, "path": str(cmp.b.path)}}
    ref = cmp.reference
    if ref is not None and ref.a is not cmp.a:
        runs["reference_a"] = {"label": f"{la} fp64", "path": str(ref.a.path)}
        runs["reference_b"] = {"label": f"{lb} fp64", "path": str(ref.b.path)}
    return {
        "passed": cmp.passed,
        "verdict": verdict_line(cmp),
        "experiment": experiment(cmp),
        "category": cmp.diagnosis.category,
        "semantics_checked": cmp.reference is not None,
        "precision": cmp.tolerance.precision,
        "tolerances": cmp.tolerance.as_dict(),
        "reference_bounds": REFERENCE.as_dict(),
        "local_bounds": (LOCAL[cmp.tolerance.precision].as_dict()
                         if cmp.tolerance.precision in LOCAL else None),
        "culprits": cmp.diagnosis.culprits,
        "checks": [c.as_dict() for c in cmp.checks],
        "diagnosis": cmp.diagnosis.as_dict(),
        "runs": runs,
        "versions": {"dualtrain": __version__, "python": platform.python_version(),
                     "numpy": np.__version__, "a": _versions(cmp.a), "b": _versions(cmp.b),
                     **({"reference_a": _versions(ref.a), "reference_b": _versions(ref.b)}
                        if ref is not None and "reference_a" in runs else {})},
        "environment": environment(cmp),
        "notes": cmp.notes,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


# ---- figures -------------------------------------------------------------------------------------

def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _series(rec: RunRecord, key: str, kind: str = "train") -> tuple[np.ndarray, np.ndarray]:
    m = R.step_map(rec, key, kind)
    steps = sorted(m)
    return np.array(steps), np.array([m[s] for s in steps], dtype=np.float64)


def figures(cmp: Comparison) -> dict[str, str]:
    """Title -> base64 PNG."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    la, lb = R.labels(cmp.a, cmp.b)
    runs = [(cmp.a, la, "-", 1.6), (cmp.b, lb, "--", 1.2)]
    ref = cmp.reference
    separate_ref = ref is not None and ref.a is not cmp.a
    if ref is not None and separate_ref:
        runs += [(ref.a, f"{la} fp64", ":", 1.0), (ref.b, f"{lb} fp64", "-.", 1.0)]
    out: dict[str, str] = {}

    fig, ax = plt.subplots(figsize=(8, 3.6))
    for rec, name, style, lw in runs:
        x, y = _series(rec, "loss")
        ax.plot(x, y, style, lw=lw, label=name)
    ax.set(xlabel="step", ylabel="training loss", title="Training loss")
    ax.legend()
    ax.grid(alpha=0.3)
    out["Training loss"] = _png(fig)

    def pos(v: np.ndarray) -> np.ndarray:  # log scale: exact zeros are not drawn
        return np.where(v > 0, v, np.nan)

    if ref is not None:  # the semantic check: the fp64 pair against its bound
        steps, diff = R.loss_diff(ref.a, ref.b)
        fig, ax = plt.subplots(figsize=(8, 3.2))
        ax.plot(steps, pos(diff), ".", ms=2.5, label=f"|{la} fp64 - {lb} fp64|")
        ax.axhline(REFERENCE.loss_abs, color="k", ls="--", lw=0.9, label="bound (semantics)")
        ax.set_yscale("log")
        ax.set(xlabel="step", ylabel="|loss difference|",
               title="Reference pair (fp64): per-step |loss difference| (exact zeros not drawn)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, which="both")
        out["Reference pair (fp64): per-step |loss difference| (log scale)"] = _png(fig)

    if not is_fp64_pair(cmp.a, cmp.b):
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
        ax.set(xlabel="step", ylabel="|loss difference|",
               title=f"{cmp.tolerance.precision}: per-step loss difference vs distance to fp64")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, which="both")
        out["Per-step |loss difference| (log scale)"] = _png(fig)

    local = local_data(cmp)
    if local:
        fig, axes = plt.subplots(1, len(local), figsize=(3.2 * len(local) + 1, 3.4), squeeze=False)
        for ax, (c, dd) in zip(axes[0], local):
            steps = np.array(dd["steps"])
            ax.plot(steps, pos(np.array(dd["a"], float)), "o", ms=5, label=la)
            ax.plot(steps, pos(np.array(dd["b"], float)), "x", ms=6, label=lb)
            ax.plot(steps, dd["a_priori"], "k--", lw=0.9, label="a priori bound")
            ax.axhline(dd["cross"][0], color="C0", ls=":", lw=0.9,
                       label=f"cross bound ({la} {dd['summary']})")
            ax.axhline(dd["cross"][1], color="C1", ls=":", lw=0.9,
                       label=f"cross bound ({lb} {dd['summary']})")
            ax.set_yscale("log")
            ax.set(xlabel="probe step", title=f"{c.name} ({'PASS' if c.passed else 'FAIL'})")
            ax.grid(alpha=0.3, which="both")
        axes[0][0].set_ylabel("relative error vs the fp64 step")
        axes[0][-1].legend(fontsize=7, loc="best")
        fig.suptitle(f"{cmp.tolerance.precision}: one-step errors from the fp64 states (log scale)",
                     y=1.03)
        out["One-step errors against the fp64 step (log scale)"] = _png(fig)

    fig, ax = plt.subplots(figsize=(8, 3.2))
    for rec, name, style, lw in runs:
        x, y = _series(rec, "accuracy", "eval")
        ax.plot(x, 100 * y, style + "o", lw=lw, ms=4, label=name)
    ax.set(xlabel="step", ylabel="test accuracy (%)", title="Evaluation accuracy")
    ax.legend()
    ax.grid(alpha=0.3)
    out["Evaluation accuracy"] = _png(fig)

    fig, ax = plt.subplots(figsize=(8, 3.0))
    for rec, name, style, lw in runs[:2]:
        x, y = _series(rec, "loss_scale")
        ax.plot(x, y, style, lw=lw, label=name)
        xs, sk = _series(rec, "skipped")
        hit = sk > 0
        if hit.any():
            ys = dict(zip(x.tolist(), y.tolist(), strict=True))
            ax.plot(xs[hit], [ys.get(s, np.nan) for s in xs[hit].tolist()], "x",
                    label=f"{name} skipped")
    ax.set_yscale("log", base=2)
    ax.set(xlabel="step", ylabel="loss scale", title="Loss scale (1 = no loss scaling)")
    ax.legend()
    ax.grid(alpha=0.3)
    out["Loss scale"] = _png(fig)

    fig, ax = plt.subplots(figsize=(8, 3.0))
    for rec, name, style, lw in runs[:2]:
        x, y = _series(rec, "samples_per_s")
        overall = float(rec.summary.get("train_samples_per_s") or 0)
        ax.plot(x, y, style, lw=lw, label=f"{name} ({overall:,.0f} samples/s overall)")
    ax.set(xlabel="step", ylabel="samples/s", title="Training throughput (per logging window)")
    ax.legend()
    ax.grid(alpha=0.3)
    out["Throughput"] = _png(fig)
    return out


# ---- report.md / report.html ---------------------------------------------------------------------

def _tolerance_rows() -> list[tuple[str, ...]]:
    r = REFERENCE
    rows: list[tuple[str, ...]] = [
        ("fp64 pair (semantics)", f"{r.loss_abs:g} abs", "-", f"{r.weights_rel:g} rel", "-",
         f"identical; eval loss {r.eval_loss_abs:g}")]
    for name, t in TOLERANCES.items():
        if name == "fp64":
            continue
        rows.append((name, f"{t.factor:g} x max(dist, {t.traj_abs_floor:g})", f"{t.traj_fixed:g}",
                     f"{t.factor:g} x max(dist, {t.weights_floor:g})", f"{t.weights_fixed:g}",
                     f"max({t.eval_pp:g} pp, {t.factor:g} x dist)"))
    return rows


_TOL_HEAD = ("precision", "trajectory", "trajectory (no reference)", "final_weights",
             "final_weights (no reference)", "eval")


# ---- the one-step probes (local checks) ---------------------------------------------------------

def local_data(cmp: Comparison) -> list[tuple[Check, dict[str, Any]]]:
    """The local checks that ran, with their per-probe numbers."""
    return [(c, c.data) for c in cmp.checks if c.name.startswith("local_") and c.ran and c.data]


_LOCAL_INTRO = ("One step of the requested precision from the fp64 run's state at each probe step, "
                "on each backend, against the exact step from the same state (docs/parity.md §7). "
                "Errors are relative. A priori bound: from the precision's unit roundoff u (update: "
                "the rounding floor of the new weights plus a multiple of float32's u), at every probe "
                "(the gradient: its median over the probes, since a ReLU or max-pool switch can "
                "legitimately move one probe). Cross bound: a backend's rms (gradient: median) over "
                "the probes may be at most ratio x the other backend's (or a floor). Neither bound "
                "is computed from the run it judges.")


def _local_rows(cmp: Comparison) -> list[list[str]]:
    la, lb = R.labels(cmp.a, cmp.b)
    rows = []
    for c, d in local_data(cmp):
        for k, step in enumerate(d["steps"]):
            rows.append([d["quantity"], str(step), fmt_value(d["a"][k]), fmt_value(d["b"][k]),
                         fmt_value(d["a_priori"][k])])
        rows.append([d["quantity"], d["summary"], fmt_value(d["aggregate"][0]),
                     fmt_value(d["aggregate"][1]),
                     f"cross: {la} <= {fmt_value(d['cross'][0])}, {lb} <= {fmt_value(d['cross'][1])}"])
    return rows


def _local_head(cmp: Comparison) -> list[str]:
    la, lb = R.labels(cmp.a, cmp.b)
    return ["quantity", "probe step", f"{la} error", f"{lb} error", "bound"]


def markdown(cmp: Comparison) -> str:
    v = verdict(cmp)
    d = cmp.diagnosis
    x = v["experiment"]
    lines = [f"# dualtrain compare: {x['name']}: {'PASS' if cmp.passed else 'FAIL'}", "",
             f"`{v['verdict']}`", "", "| experiment | |", "|---|---|"]
    lines += [f"| {label} | {x[key]} |" for label, key in _EXPERIMENT_ROWS]
    lines += ["", "<details><summary>the spec (A's; spec.yaml of its run)</summary>", "",
              "```yaml", _spec_yaml(x["spec"]).rstrip(), "```", "", "</details>", "",
              "| run | path |", "|---|---|"]
    for key, run in v["runs"].items():
        lines.append(f"| {key}: {run['label']} | `{run['path']}` |")
    lines += ["", f"Tolerances: **{cmp.tolerance.precision}** row (see docs/parity.md). Groups: "
              "records (inputs, exact), semantics (the fp64 reference pair), numerics (the requested "
              "precision: its drift against its distance to fp64, which describes; and the one-step probes and "
              "the convergence check, which judge each backend's precision path).", "",
              "| group | check | value | tolerance | result | detail |", "|---|---|---|---|---|---|"]
    for c in cmp.checks:
        unit = f" {c.unit}" if c.unit and c.ran else ""
        tol = "-" if c.tolerance is None else f"<= {fmt_value(c.tolerance)}"
        lines.append(f"| {c.group} | {c.name} | {fmt_value(c.value)}{unit} | {tol} | {status(c)} | "
                     f"{c.detail.replace('|', chr(92) + '|')} |")
    local_rows = _local_rows(cmp)
    if local_rows:
        head = _local_head(cmp)
        lines += ["", "## Precision path: one-step probes", "", _LOCAL_INTRO, "",
                  "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in local_rows]
    lines += ["", "## Diagnosis", ""]
    if d.passed:
        lines.append("All checks pass: the two runs agree within the tolerances.")
    else:
        step = d.first_divergent_step
        lines.append(f"- first divergent step: "
                     f"{step if step is not None else 'none (no per-step check failed)'}")
        lines.append(f"- category: **{d.category}**")
        lines.append(f"- likely cause: **{d.cause}**")
        for cause in d.causes:
            at = "before training" if cause.step == 0 else f"step {cause.step}"
            lines.append(f"  - {cause.kind} ({at}): {cause.evidence}")
    if d.spec_differences:
        lines += ["", "Spec differences:", "", "| field | A | B | |", "|---|---|---|---|"]
        for s in d.spec_differences:
            lines.append(f"| {s['field']} | `{s['a']!r}` | `{s['b']!r}` | "
                         f"{'ignored (cosmetic)' if s['cosmetic'] else 'changes the run'} |")
    if d.top_parameters and d.top_parameters[0]["rel_diff"] > 0:
        lines += ["", "Final weights, most divergent tensors (relative difference):", ""]
        lines += [f"- `{p['name']}`: {p['rel_diff']:.3g}" for p in d.top_parameters]
    if d.top_gradients:
        lines += ["", f"Gradients at step {d.gradient_step}, most divergent tensors:", ""]
        lines += [f"- `{p['name']}`: {p['rel_diff']:.3g}" for p in d.top_gradients]
    lines += _env_markdown(v)
    if cmp.notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in cmp.notes]
    lines += ["", ("Figures: see report.html (self-contained). How to read this report: "
                   "docs/report.md."), ""]
    return "\n".join(lines)


# ---- the environment section ---------------------------------------------------------------------

_ENV_INTRO = ("Core facts are compared between all runs, a backend's facts only between runs of "
              "that backend (docs/env.md).")


def _env_table(v: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """(column heads, rows) of the differing env facts, or None when there are none."""
    diffs = v["environment"]["differences"]
    if not diffs:
        return None
    keys = [k for k in v["runs"] if any(k in d["values"] for d in diffs)]
    head = ["fact"] + [f"{k}: {v['runs'][k]['label']}" for k in keys]
    rows = [[d["fact"]] + [show(d["values"][k]) if k in d["values"] else "" for k in keys]
            for d in diffs]
    return head, rows


def _env_status(v: dict[str, Any]) -> str | None:
    """One line when there is no table: the environments match, or could not be compared."""
    env = v["environment"]
    missing = env["missing"]
    note = (f" Not recorded in {', '.join(missing)} (a run from before dualtrain recorded its "
            "environment)." if missing else "")
    if env["differences"]:
        return note.strip() or None
    if len(env["compared"]) >= 2:
        return f"Environments match ({len(env['compared'])} runs).{note}"
    return note.strip() or None


def _env_markdown(v: dict[str, Any]) -> list[str]:
    lines = ["", "## Environment", ""]
    table_ = _env_table(v)
    if table_ is not None:
        head, rows = table_
        lines += [f"Facts that differ between the runs. {_ENV_INTRO}", "",
                  "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join([f"`{r[0]}`"] + [x.replace("|", chr(92) + "|") for x in r[1:]])
                  + " |" for r in rows]
    status_ = _env_status(v)
    if status_:
        lines += ([""] if table_ is not None else []) + [status_]
    return lines if len(lines) > 3 else []


def _env_html(v: dict[str, Any]) -> list[str]:
    e = html.escape
    parts = []
    table_ = _env_table(v)
    if table_ is not None:
        head, rows = table_
        parts.append(f"<p>Facts that differ between the runs. {e(_ENV_INTRO)}</p>")
        parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>")
        parts += ["<tr>" + f"<td><code>{e(r[0])}</code></td>" + "".join(f"<td>{e(x)}</td>"
                                                                       for x in r[1:]) + "</tr>"
                  for r in rows]
        parts.append("</table>")
    status_ = _env_status(v)
    if status_:
        parts.append(f"<p>{e(status_)}</p>")
    return ["<h2>Environment</h2>"] + parts if parts else []


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1000px;
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


def html_report(cmp: Comparison, figs: dict[str, str] | None = None) -> str:
    e = html.escape
    v = verdict(cmp)
    d = cmp.diagnosis
    figs = figures(cmp) if figs is None else figs
    parts = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>",
             f"<title>dualtrain compare: {e(str(v['experiment']['name']))}: "
             f"{'PASS' if cmp.passed else 'FAIL'}</title>",
             f"<style>{_CSS}</style></head><body>",
             f"<h1>dualtrain compare: {e(str(v['experiment']['name']))}</h1>",
             f"<p class='verdict {'v-pass' if cmp.passed else 'v-fail'}'>{e(v['verdict'])}</p>",
             "<table>" + "".join(f"<tr><th>{e(label)}</th><td>{e(str(v['experiment'][key]))}</td></tr>"
                                 for label, key in _EXPERIMENT_ROWS) + "</table>",
             "<details><summary>the spec (A's; spec.yaml of its run)</summary><pre>"
             f"{e(_spec_yaml(v['experiment']['spec']))}</pre></details>",
             "<table><tr><th>run</th><th>path</th><th>versions</th></tr>"]
    for key, run in v["runs"].items():
        vers = ", ".join(f"{k} {val}" for k, val in v["versions"].get(key, {}).items())
        parts.append(f"<tr><td>{e(key)}: {e(run['label'])}</td><td><code>{e(run['path'])}</code></td>"
                     f"<td>{e(vers)}</td></tr>")
    parts.append("</table>")
    parts.append(f"<h2>Checks</h2><p>Tolerance row: <b>{e(cmp.tolerance.precision)}</b>.</p>")
    parts.append("<p>Groups: <b>records</b> (the inputs of the arithmetic, exact), <b>semantics</b> "
                 "(the fp64 reference pair agrees to rounding), <b>numerics</b> (the requested precision: "
                 "its drift against each backend's distance to its fp64 run, which describes; the "
                 "one-step probes and the convergence check, which judge each backend's precision "
                 "path).</p>")
    parts.append("<table><tr><th>group</th><th>check</th><th>value</th><th>tolerance</th>"
                 "<th>result</th><th>detail</th></tr>")
    for c in cmp.checks:
        unit = f" {c.unit}" if c.unit and c.ran else ""
        tol = "-" if c.tolerance is None else f"&le; {e(fmt_value(c.tolerance))}"
        st = status(c)
        parts.append(f"<tr><td>{e(c.group)}</td><td>{e(c.name)}</td><td>{e(fmt_value(c.value) + unit)}"
                     f"</td><td>{tol}</td><td class='{st.split()[0]}'>{st}</td><td>{e(c.detail)}</td></tr>")
    parts.append("</table>")
    local_rows = _local_rows(cmp)
    if local_rows:
        parts.append(f"<h2>Precision path: one-step probes</h2><p>{e(_LOCAL_INTRO)}</p><table><tr>"
                     + "".join(f"<th>{e(h)}</th>" for h in _local_head(cmp)) + "</tr>")
        parts += ["<tr>" + "".join(f"<td>{e(x)}</td>" for x in r) + "</tr>" for r in local_rows]
        parts.append("</table>")
    parts.append("<h2>Diagnosis</h2>")
    if d.passed:
        parts.append("<p>All checks pass: the two runs agree within the tolerances.</p>")
    else:
        step = d.first_divergent_step if d.first_divergent_step is not None else "none"
        parts.append(f"<p>Category: <b>{e(str(d.category))}</b>. First divergent step: "
                     f"<b>{e(str(step))}</b>. Likely cause: <b>{e(str(d.cause))}</b>.</p><ul>")
        parts += [f"<li>{e(c.kind)} ({'before training' if c.step == 0 else f'step {c.step}'}): "
                  f"{e(c.evidence)}</li>" for c in d.causes]
        parts.append("</ul>")
    if d.spec_differences:
        parts.append("<table><tr><th>spec field</th><th>A</th><th>B</th><th></th></tr>")
        for s in d.spec_differences:
            kind = "ignored (cosmetic)" if s["cosmetic"] else "changes the run"
            parts.append(f"<tr><td>{e(s['field'])}</td><td>{e(repr(s['a']))}</td>"
                         f"<td>{e(repr(s['b']))}</td><td>{kind}</td></tr>")
        parts.append("</table>")
    if d.top_parameters and d.top_parameters[0]["rel_diff"] > 0:
        parts.append("<p>Final weights, most divergent tensors: " + ", ".join(
            f"<code>{e(p['name'])}</code> {p['rel_diff']:.3g}" for p in d.top_parameters) + "</p>")
    if d.top_gradients:
        parts.append(f"<p>Gradients at step {d.gradient_step}, most divergent tensors: " + ", ".join(
            f"<code>{e(p['name'])}</code> {p['rel_diff']:.3g}" for p in d.top_gradients) + "</p>")
    if cmp.notes:
        parts.append("<ul>" + "".join(f"<li>{e(n)}</li>" for n in cmp.notes) + "</ul>")
    parts += _env_html(v)
    parts.append("<h2>Figures</h2>")
    for title, b64 in figs.items():
        parts.append(f"<h3>{e(title)}</h3><img alt='{e(title)}' src='data:image/png;base64,{b64}'>")
    parts.append("<h2>Tolerance table</h2><table><tr>" + "".join(f"<th>{e(h)}</th>" for h in _TOL_HEAD)
                 + "</tr>")
    for row in _tolerance_rows():
        parts.append("<tr>" + "".join(f"<td>{e(x)}</td>" for x in row) + "</tr>")
    parts.append("</table></body></html>")
    return "\n".join(parts)


def write_report(cmp: Comparison, out: str | Path) -> dict[str, Path]:
    """Write verdict.json, report.md and report.html into ``out``; return their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"verdict": out / VERDICT_FILE, "markdown": out / REPORT_MD, "html": out / REPORT_HTML}
    paths["verdict"].write_text(json.dumps(json_safe(verdict(cmp)), indent=2) + "\n")
    paths["markdown"].write_text(markdown(cmp))
    paths["html"].write_text(html_report(cmp))
    return paths

"""verdict.json: the comparison as data (the verdict, every check, the experiment, the
environment)."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dualtrain.core.data.dataset import DATA_FILE
from dualtrain.parity import readings as R
from dualtrain.parity.report import kernels as kernels_report
from dualtrain.parity.report import limits as limits_report
from dualtrain.parity.report import where
from dualtrain.parity.report.compare import Comparison
from dualtrain.parity.tolerances import LOCAL, REFERENCE, precision_of
from dualtrain.records.envinfo import env_differences
from dualtrain.records.record import RunRecord
from dualtrain.records.verdict import LIMIT, LIMIT_CATEGORY
from dualtrain.version import __version__

# ---- formatting ----------------------------------------------------------------------------------


def verdict_line(cmp: Comparison) -> str:
    scored = [c for c in cmp.checks if not c.informational]
    n_pass = sum(c.passed for c in scored)
    semantics = (
        "semantics checked against the fp64 reference pair"
        if cmp.reference is not None
        else "semantics NOT checked: no fp64 reference"
    )
    if cmp.passed:
        return f"verdict: PASS ({n_pass}/{len(scored)} checks; {semantics})"
    failed = ", ".join(cmp.diagnosis.failed_checks)
    category = cmp.diagnosis.category
    if cmp.diagnosis.culprits:
        category = f"{category}: {', '.join(cmp.diagnosis.culprits)}"
    if category == LIMIT_CATEGORY:  # a library's float32 arithmetic, not a porting mistake
        return (
            f"verdict: {LIMIT}: {cmp.diagnosis.finding} ({n_pass}/{len(scored)} checks; only the "
            f"fp64 pair's failed ({failed}): it cannot hold below float32's rounding there; every "
            f"check at the requested precision passed); {cmp.diagnosis.where()}"
        )
    if cmp.diagnosis.finding:  # the locator's layer and mistake lead
        return (
            f"verdict: FAIL, {category}: {cmp.diagnosis.finding} ({n_pass}/{len(scored)} checks; "
            f"failed: {failed}); {cmp.diagnosis.where()}"
        )
    return (
        f"verdict: FAIL, {category} ({n_pass}/{len(scored)} checks; failed: {failed}); "
        f"{cmp.diagnosis.summary()}"
    )


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
    if model.get("torch") or model.get("keras"):  # a model pair: the user's two factories
        args = model.get("args") or {}
        shown = ", ".join(f"{k} {v}" for k, v in args.items())
        return f"model pair: torch {model.get('torch')}, keras {model.get('keras')}" + (
            f" ({shown})" if shown else ""
        )
    layers = model.get("layers") or []

    def name(layer: dict[str, Any]) -> str:
        t = str(layer.get("type", "?"))
        size = layer.get("units") or layer.get("filters")
        return f"{t} {size}" if size else t

    return f"{len(layers)} layers: " + ", ".join(name(x) for x in layers)


def _epochs(ran: Any, train: dict[str, Any]) -> Any:
    """The epochs the run made, and the spec's where max_steps (or early stopping) ended it first:
    ``0.667 (max_steps 30 of epochs 1)``."""
    asked = train.get("epochs")
    if not isinstance(ran, (int, float)) or ran == asked:
        return asked
    why = f"max_steps {train['max_steps']}" if train.get("max_steps") else "stopped early"
    return f"{ran:.3g} ({why} of epochs {asked})" if asked else f"{ran:.3g}"


def _train_samples(rec: RunRecord, data: dict[str, Any]) -> str:
    """How many training samples the run drew from, of how many its dataset holds (the run's
    data.json, written by both backends), e.g. ``all 1,438 (digits)`` or ``12,800 of 60,000
    (mnist)``."""
    limit = data.get("train_limit")
    try:
        facts = json.loads((Path(rec.path) / DATA_FILE).read_text())
        held = int(facts["sizes"]["train"])
    except (OSError, ValueError, KeyError, TypeError):
        return f"{limit:,}" if limit else "all"
    name = facts.get("dataset") or data.get("dataset") or "the dataset"
    if limit and int(limit) < held:
        return f"{int(limit):,} of {held:,} ({name})"
    return f"all {held:,} ({name})"


def experiment(cmp: Comparison) -> dict[str, Any]:
    """What was compared, so the report stands on its own: the spec's key facts and the spec."""
    spec = cmp.a.spec or {}
    data, opt = spec.get("data") or {}, spec.get("optimizer") or {}
    dist, train = spec.get("distribution") or {}, spec.get("train") or {}
    schedule = (opt.get("schedule") or {}).get("name", "constant")
    extras = [
        f"{k} {opt[k]}"
        for k in ("momentum", "weight_decay", "clip_grad_norm")
        if opt.get(k) not in (None, 0, 0.0, False)
    ]
    out = {
        "name": spec.get("name"),
        "model": _model_line(spec.get("model") or {}),
        "world_size": dist.get("world_size"),
        "tf_strategy": (spec.get("tf") or {}).get("strategy"),
        "precision": precision_of(spec),
        "steps": cmp.a.summary.get("steps"),
        "epochs": _epochs(cmp.a.summary.get("epochs_run"), train),
        "batch_size": data.get("batch_size"),
        "train_samples": _train_samples(cmp.a, data),
        "optimizer": " ".join(
            [str(opt.get("name")), f"lr {opt.get('lr')}", *extras, f"schedule {schedule}"]
        ),
        "seed": spec.get("seed"),
        "spec": spec,
    }
    if cmp.b.spec and cmp.b.spec != spec:
        out["spec_b"] = cmp.b.spec
    return out


EXPERIMENT_ROWS = (
    ("spec", "name"),
    ("model", "model"),
    ("world size", "world_size"),
    ("tf strategy", "tf_strategy"),
    ("precision", "precision"),
    ("steps", "steps"),
    ("epochs", "epochs"),
    ("global batch", "batch_size"),
    ("training samples", "train_samples"),
    ("optimizer", "optimizer"),
    ("seed", "seed"),
)


def spec_yaml(spec: dict[str, Any]) -> str:
    return yaml.safe_dump(spec, sort_keys=False)


def verdict(cmp: Comparison) -> dict[str, Any]:
    la, lb = R.labels(cmp.a, cmp.b)
    runs = {
        "a": {"label": la, "path": str(cmp.a.path)},
        "b": {"label": lb, "path": str(cmp.b.path)},
    }
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
        "local_bounds": (
            LOCAL[cmp.tolerance.precision].as_dict() if cmp.tolerance.precision in LOCAL else None
        ),
        "culprits": cmp.diagnosis.culprits,
        "checks": [c.as_dict() for c in cmp.checks],
        "diagnosis": cmp.diagnosis.as_dict(),
        "runs": runs,
        "versions": {
            "dualtrain": __version__,
            "python": platform.python_version(),
            "numpy": np.__version__,
            "a": _versions(cmp.a),
            "b": _versions(cmp.b),
            **(
                {"reference_a": _versions(ref.a), "reference_b": _versions(ref.b)}
                if ref is not None and "reference_a" in runs
                else {}
            ),
        },
        "environment": environment(cmp),
        "kernels": kernels_report.model(cmp),
        "framework_limits": limits_report.model(cmp),
        **where.model(cmp),
        "notes": cmp.notes,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }

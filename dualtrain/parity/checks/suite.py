"""All checks in report order (:func:`run_checks`), and the information-only ones."""

from __future__ import annotations

import math

from dualtrain.parity import readings as R
from dualtrain.parity.checks.base import INFO, Reference, not_run, tolerance_of
from dualtrain.parity.checks.early_stopping import check_early_stopping
from dualtrain.parity.checks.inputs import check_init_weights, check_lr, check_sharding, check_spec
from dualtrain.parity.checks.loss_scale import check_loss_scale, check_skipped
from dualtrain.parity.checks.numerics import check_eval, check_final_weights, check_trajectory
from dualtrain.parity.checks.probes import local_checks
from dualtrain.parity.checks.semantics import (
    REFERENCE_CHECKS,
    check_reference_eval,
    check_reference_loss,
    check_reference_weights,
)
from dualtrain.parity.tolerances import (
    precision_of,
)
from dualtrain.records.record import RunRecord
from dualtrain.records.verdict import NUMERICS, SEMANTICS, Check


def check_throughput(a: RunRecord, b: RunRecord) -> Check:
    """B's training samples per second over A's; informational, it never fails."""
    la, lb = R.labels(a, b)
    ta = float(a.summary.get("train_samples_per_s") or 0.0)
    tb = float(b.summary.get("train_samples_per_s") or 0.0)
    ratio = tb / ta if ta > 0 else math.nan
    detail = f"{la} {ta:,.0f} samples/s, {lb} {tb:,.0f} samples/s (informational)"
    return Check(
        "throughput", ratio, None, True, detail, unit=f"{lb}/{la}", informational=True, group=INFO
    )


def is_fp64_pair(a: RunRecord, b: RunRecord) -> bool:
    return precision_of(a.spec) == "fp64" and precision_of(b.spec) == "fp64"


def run_checks(a: RunRecord, b: RunRecord, ref: Reference | None = None) -> list[Check]:
    """Every check, in report order. Two fp64 runs are their own reference pair."""
    tol = tolerance_of(a, b)
    checks = [
        check_spec(a, b),
        check_sharding(a, b),
        check_init_weights(a, b),
        check_lr(a, b, tol),
        check_loss_scale(a, b),
        check_skipped(a, b),
    ]
    fp64 = is_fp64_pair(a, b)
    # train.early_stopping: runs whose decisions part by rounding stop after different steps;
    # their final states are not comparable, their common steps are
    apart = False
    if a.spec.get("train", {}).get("early_stopping") or b.spec.get("train", {}).get(
        "early_stopping"
    ):
        stop = check_early_stopping(a, b, exact=fp64)
        checks.append(stop)
        ends = {
            (r.summary.get("early_stopping") or {}).get("stopped_at") or r.summary.get("steps")
            for r in (a, b)
        }
        apart = stop.passed and len(ends) > 1
    if fp64:  # their own reference pair (with the rounding twin the caller ran, if any)
        ref = Reference(a, b, ref.twin if ref is not None else None)
    if ref is not None:
        checks += [
            check_reference_loss(ref),
            check_reference_weights(ref),
            check_reference_eval(ref),
        ]
    else:
        why = (
            "no fp64 reference pair (compare --config --reference none, or two run folders "
            "without --reference-runs): semantics were not checked"
        )
        checks += [not_run(n, SEMANTICS, why) for n in REFERENCE_CHECKS]
    if fp64:
        why = "the runs are fp64: the reference checks are their result checks"
        checks += [not_run("trajectory", NUMERICS, why), not_run("final_weights", NUMERICS, why)]
    elif apart:
        why = (
            "the runs stop after different steps (early stopping, decisions parted by rounding): "
            "their final weights are not comparable; the trajectory and eval checks judge the "
            "common steps"
        )
        checks += [check_trajectory(a, b, ref, tol), not_run("final_weights", NUMERICS, why)]
    else:
        checks += [check_trajectory(a, b, ref, tol), check_final_weights(a, b, ref, tol)]
    if fp64:  # reference_eval judges every evaluation (to rounding, or to the twin's envelope)
        why = "the runs are fp64: reference_eval is their evaluation check"
        checks += [not_run("eval", NUMERICS, why)]
    else:
        checks += [check_eval(a, b, ref, tol, final=not apart)]
    if not fp64:
        checks += local_checks(a, b, ref)
    checks += [check_throughput(a, b)]
    return checks

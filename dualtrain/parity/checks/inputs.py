"""The ``records`` group's checks on the inputs of the arithmetic, which must be exact: the spec,
the sample ids every replica was fed, the initial weights and the lr at every step."""

from __future__ import annotations

import math

import numpy as np

from dualtrain.parity import readings as R
from dualtrain.parity.checks.base import (
    earliest_step,
    first_missing_step,
    missing_steps_note,
    tolerance_of,
)
from dualtrain.parity.tolerances import Tolerance
from dualtrain.records.record import RunRecord
from dualtrain.records.verdict import Check

# ---- checks --------------------------------------------------------------------------------------


def check_spec(a: RunRecord, b: RunRecord) -> Check:
    """Both runs were compiled from the same experiment (cosmetic fields aside)."""
    diffs = R.spec_differences(a.spec, b.spec)
    relevant = [d for d in diffs if not R.is_cosmetic(d[0])]
    cosmetic = [d for d in diffs if R.is_cosmetic(d[0])]
    if relevant:
        shown = ", ".join(f"{k}: {va!r} vs {vb!r}" for k, va, vb in relevant[:6])
        more = f" (+{len(relevant) - 6} more)" if len(relevant) > 6 else ""
        detail = f"spec differs: {shown}{more}"
    else:
        detail = "same experiment"
    if cosmetic:
        detail += f"; ignored: {', '.join(k for k, _, _ in cosmetic)}"
    return Check(
        "spec",
        float(len(relevant)),
        0.0,
        not relevant,
        detail,
        unit="fields",
        first_step=0 if relevant else None,
    )


def check_sharding(a: RunRecord, b: RunRecord) -> Check:
    """Every (step, replica) fed the same ids (digest) and count; both runs have the same steps."""
    la, lb = R.labels(a, b)
    ma, mb = R.shard_map(a), R.shard_map(b)
    steps_a, steps_b = {s for s, _ in ma}, {s for s, _ in mb}
    bad = []
    for key in sorted(set(ma) | set(mb)):
        if ma.get(key) != mb.get(key):
            bad.append(key)
    notes = []
    if bad:
        step, rep = bad[0]
        va, vb = ma.get((step, rep)), mb.get((step, rep))
        fa = f"digest {va[0]} count {va[1]}" if va else "missing"
        fb = f"digest {vb[0]} count {vb[1]}" if vb else "missing"
        notes.append(
            f"{len(bad)} (step, replica) mismatch(es); first: step {step} replica {rep}: "
            f"{la} {fa}, {lb} {fb}"
        )
    if not ma or not mb:
        notes.append(f"no shard records in {la if not ma else lb}")
    steps_note = missing_steps_note(steps_a, steps_b, la, lb)
    if steps_note:
        notes.append(steps_note)
    passed = not bad and bool(ma) and bool(mb)
    detail = (
        "; ".join(notes)
        if notes
        else (f"{len(steps_a)} steps x {len({r for _, r in ma})} replicas identical")
    )
    return Check(
        "sharding",
        float(len(bad)),
        0.0,
        passed,
        detail,
        unit="mismatches",
        first_step=bad[0][0] if bad else None,
    )


def check_init_weights(a: RunRecord, b: RunRecord) -> Check:
    """Both runs start from bit-identical weights: the largest absolute difference of any element
    must be 0."""
    wa, wb = R.load_init(a), R.load_init(b)
    if wa is None or wb is None:
        return Check(
            "init_weights",
            None,
            0.0,
            False,
            "weights_init.npz missing in " + ("A" if wa is None else "B"),
            unit="max abs",
            first_step=0,
        )
    problem = R.layout_problem(wa, wb)
    if problem:
        return Check("init_weights", math.inf, 0.0, False, problem, unit="max abs", first_step=0)
    diffs = R.max_abs_diff(wa, wb)
    worst = max(diffs, key=diffs.__getitem__)
    value = diffs[worst]
    differing = [k for k, v in diffs.items() if v > 0]
    if differing:
        n = sum(int(np.count_nonzero(wa[k] != wb[k])) for k in differing)
        detail = f"{n} element(s) differ in {', '.join(differing)}; largest in {worst}"
    else:
        detail = f"{len(diffs)} tensors bit-identical"
    return Check(
        "init_weights",
        value,
        0.0,
        not differing,
        detail,
        unit="max abs",
        first_step=0 if differing else None,
    )


def check_lr(a: RunRecord, b: RunRecord, tol: Tolerance | None = None) -> Check:
    """The same learning rate at every step: a relative difference of at most ``lr_rel``, and
    both runs have the same steps."""
    tol = tol or tolerance_of(a, b)
    la, lb = R.labels(a, b)
    ma, mb = R.step_map(a, "lr"), R.step_map(b, "lr")
    steps = R.common_steps(ma, mb)
    worst, first = 0.0, None
    for s in steps:
        x, y = ma[s], mb[s]
        rel = abs(x - y) / max(abs(x), abs(y)) if (x != y) else 0.0
        if math.isnan(rel):
            rel = math.inf
        if rel > tol.lr_rel and first is None:
            first = s
        worst = max(worst, rel)
    missing = first_missing_step(set(ma), set(mb))
    note = missing_steps_note(set(ma), set(mb), la, lb)
    passed = first is None and not note and bool(steps)
    if first is not None:
        detail = f"first difference at step {first}: {la} {ma[first]:.6g}, {lb} {mb[first]:.6g}"
    else:
        detail = f"{len(steps)} steps equal"
    if note:
        detail += f"; {note}"
    return Check(
        "lr",
        worst,
        tol.lr_rel,
        passed,
        detail,
        unit="rel",
        first_step=earliest_step(first, missing),
    )

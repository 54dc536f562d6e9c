"""compare's replay of the fp64 pair (dualtrain.parity.replay): where the pair parts, both
backends run the reference spec again up to the first divergent step, writing every step's
gradient and state, and the first operation that differs leads the verdict.

    OUT/replay/torch/, OUT/replay/tf/   the replayed runs (fp64; a checkpoint after every step)
"""

from __future__ import annotations

import dataclasses
import math
import shutil
from collections.abc import Callable
from pathlib import Path

from dualtrain.core import locate
from dualtrain.driver.compare_plan import PlannedRun
from dualtrain.errors import RunFailed
from dualtrain.parity import readings as R
from dualtrain.parity.checks.base import Reference
from dualtrain.parity.diagnose import SEMANTICS
from dualtrain.parity.replay import (
    LAYER,
    MAX_STEPS,
    REPLAY,
    TOL,
    OpFinding,
    first_divergent_op,
)
from dualtrain.parity.report import Comparison
from dualtrain.parity.taps import LayerRow
from dualtrain.spec import Backend, Experiment


def replay_spec(reference: Experiment, steps: int, tap: int | None = None) -> Experiment:
    """The reference spec stopped after ``steps``, with a checkpoint after every step (all kept),
    every step's gradient written and every layer's output at step ``tap`` (default: the last)."""
    train = dataclasses.replace(
        reference.train,
        max_steps=steps,
        epochs=None,
        checkpoint_every=1,
        keep_checkpoints=steps,
        early_stopping=None,
    )
    debug = dataclasses.replace(
        reference.debug,
        dump_grads=tuple(range(1, steps + 1)),
        dump_layers=(tap or steps,),
    )
    return reference.replace(train=train, debug=debug)


def located(finding: locate.Finding) -> OpFinding:
    """A model pair's locator finding (on the initial weights, step 0) as the report's picture:
    each torch module's own output in inference and in training, the finding's marked."""
    rows = tuple(
        LayerRow(
            r.module,
            r.keras,
            math.nan if r.train is None else r.train,
            math.nan if r.own is None else r.own,
        )
        for r in finding.rows
    )
    marked = next((r.module for r in finding.rows if f"torch '{r.module}'" in finding.where), None)
    return OpFinding(0, LAYER, None, finding.size, finding.lead(), "", rows, marked)


def tap_step(reference: Reference, k: int) -> int:
    """The step whose layers the replay taps: the first at which the fp64 pair's losses part (the
    only step a loss finding can name), else ``k`` (an evaluation's finding reads any)."""
    la, lb = R.step_map(reference.a, "loss"), R.step_map(reference.b, "loss")
    parted = [s for s in sorted(set(la) & set(lb)) if s <= k and R.scaled_diff(la[s], lb[s]) > TOL]
    return parted[0] if parted else k


def run_replay(
    cmp: Comparison,
    first: PlannedRun,
    start: Callable[[Experiment, Backend, Path], Path],
    say: Callable[[str], None],
) -> OpFinding | None:
    """Where ``cmp`` fails on semantics with its fp64 pair parting at a step <= MAX_STEPS: replay
    the pair (``first``: the reference's first run, whose spec is replayed on both backends) and
    return the first divergent operation; its line leads the diagnosis and joins the notes."""
    d = cmp.diagnosis
    k = d.first_divergent_step
    # only where the records agree (same ids, initial weights, lr, spec): else the cause is named
    if cmp.passed or d.cause != SEMANTICS or cmp.reference is None or not k:
        return None
    if k > MAX_STEPS:
        cmp.notes.append(
            f"replay: the fp64 pair parts at step {k}, past the {MAX_STEPS} steps compare "
            f"replays op by op; its checks describe it"
        )
        return None
    where = first.where.parent / REPLAY
    if where.exists():
        shutil.rmtree(where)
    spec = replay_spec(first.spec, k, tap_step(cmp.reference, k))
    say(
        f"the fp64 pair parts at step {k}: replaying {k} step(s) on both backends, op by op "
        f"-> {where}"
    )
    try:
        dirs = [start(spec, b, where / b.value) for b in (Backend.TORCH, Backend.TF)]
    except RunFailed as exc:
        cmp.notes.append(f"replay: could not run ({exc})")
        return None
    found = first_divergent_op(dirs[0], dirs[1], spec)
    if found is None:
        cmp.notes.append(f"replay: the replayed pair agrees over its {k} step(s)")
        return None
    cmp.replay = found
    if not d.finding:  # a model pair's locator finding names the layer and leads
        d.finding = found.lead()
    else:
        cmp.notes.append(f"replay: first divergent operation: {found.lead()}")
    return found

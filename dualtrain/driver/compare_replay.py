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
from dualtrain.driver.launching import refuse_external_launch
from dualtrain.driver.runs import start_run
from dualtrain.driver.validate import validate
from dualtrain.errors import RunFailed, UserError
from dualtrain.parity import readings as R
from dualtrain.parity.checks.base import Reference
from dualtrain.parity.diagnose import SEMANTICS
from dualtrain.parity.op_finding import LAYER, OpFinding
from dualtrain.parity.replay import MAX_STEPS, REPLAY, TOL, first_divergent_op
from dualtrain.parity.report import Comparison
from dualtrain.parity.taps import LayerRow
from dualtrain.records.record import SPEC_FILE
from dualtrain.spec import Backend, Experiment
from dualtrain.spec.load import load_spec


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


def continued(cmp: Comparison) -> tuple[int, Path, Path] | None:
    """Where one of the compared runs continued the other backend's checkpoint (``--resume-from``):
    (its step, the checkpoint folder, the run that continued it), else None."""
    for rec in (cmp.b, cmp.a):
        last = (rec.summary.get("resumed") or [{}])[-1]
        if last.get("checkpoint_backend") not in (None, last.get("backend")):
            return int(last["from_step"]), Path(str(last["checkpoint"])), Path(rec.path)
    return None


def continuing(spec: Experiment, backend: Backend, where: Path, ckpt: Path) -> Path:
    """A replay run that continues ``ckpt`` on ``backend`` (dualtrain launches its workers: never
    one rank of an external launch)."""
    refuse_external_launch()
    warned = tuple(validate(spec, backend).warnings)
    run_dir, _ = start_run(spec, backend, where, resume_from=ckpt, warned=warned)
    assert run_dir is not None  # dualtrain launched the workers
    return run_dir


def replay_continuation(
    cmp: Comparison,
    out: Path,
    say: Callable[[str], None],
    start: Callable[[Experiment, Backend, Path, Path], Path] = continuing,
) -> OpFinding | None:
    """Two fp64 runs of which one continued the other backend's checkpoint, parting on
    semantics at step k after the switch at c: both backends continue that checkpoint up to k
    (``start(spec, backend, folder, checkpoint)``), and the first divergent operation after it
    leads the diagnosis."""
    d, switch = cmp.diagnosis, continued(cmp)
    k = d.first_divergent_step
    if cmp.passed or d.cause != SEMANTICS or switch is None or not k or cmp.reference is None:
        return None
    c, ckpt, run_dir = switch
    if k <= c or k - c > MAX_STEPS or not ckpt.is_dir():
        why = (
            "its checkpoint is gone"
            if k > c and k - c <= MAX_STEPS
            else (
                f"the runs part at step {k}, "
                + ("before the switch" if k <= c else f"past {MAX_STEPS} steps after it")
            )
        )
        cmp.notes.append(f"replay: the continuation from step {c} is not replayed ({why})")
        return None
    spec = load_spec(run_dir / SPEC_FILE)
    steps = tuple(range(c + 1, k + 1))
    debug = dataclasses.replace(
        spec.debug, dump_grads=steps, dump_layers=(tap_step(cmp.reference, k, c + 1),), stop_after=k
    )
    train = dataclasses.replace(spec.train, checkpoint_every=1, keep_checkpoints=len(steps) + 1)
    spec = spec.replace(train=train, debug=debug)
    where = out / REPLAY
    say(
        f"the runs part at step {k}, {k - c} after the switch at step {c}: replaying both "
        f"backends from its checkpoint, op by op -> {where}"
    )
    found = _replayed(
        cmp,
        spec,
        where,
        lambda b, to: start(spec, b, to, ckpt),
        f"the steps after the step-{c} checkpoint",
    )
    if found is not None:
        d.finding = f"after the switch at step {c}: {found.lead()}"
    return found


def _replayed(
    cmp: Comparison,
    spec: Experiment,
    where: Path,
    run: Callable[[Backend, Path], Path],
    over: str,
) -> OpFinding | None:
    """Both backends run ``spec`` into ``where``/torch and ``where``/tf (``run(backend, folder)``)
    and the first divergent operation between them, kept as the comparison's replay; a note where
    they could not run or agree ``over`` what they replayed."""
    if where.exists():
        shutil.rmtree(where)
    try:
        dirs = [run(b, where / b.value) for b in (Backend.TORCH, Backend.TF)]
    except (RunFailed, UserError) as exc:
        cmp.notes.append(f"replay: could not run ({exc})")
        return None
    found = first_divergent_op(dirs[0], dirs[1], spec)
    if found is None:
        cmp.notes.append(f"replay: the replayed pair agrees over {over}")
        return None
    cmp.replay = found
    return found


def tap_step(reference: Reference, k: int, first: int = 1) -> int:
    """The step whose layers the replay taps: the first from ``first`` at which the fp64 pair's
    losses part (the only step a loss finding can name), else ``k`` (an evaluation's finding
    reads any)."""
    la, lb = R.step_map(reference.a, "loss"), R.step_map(reference.b, "loss")
    parted = [
        s
        for s in sorted(set(la) & set(lb))
        if first <= s <= k and R.scaled_diff(la[s], lb[s]) > TOL
    ]
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
    spec = replay_spec(first.spec, k, tap_step(cmp.reference, k))
    say(
        f"the fp64 pair parts at step {k}: replaying {k} step(s) on both backends, op by op "
        f"-> {where}"
    )
    found = _replayed(cmp, spec, where, lambda b, to: start(spec, b, to), f"its {k} step(s)")
    if found is None:
        return None
    if not d.finding:  # a model pair's locator finding names the layer and leads
        d.finding = found.lead()
    else:
        cmp.notes.append(f"replay: first divergent operation: {found.lead()}")
    return found

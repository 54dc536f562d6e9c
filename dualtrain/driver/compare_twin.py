"""compare's rounding twin (dualtrain.parity.twin): where the fp64 pair parts beyond the fixed
semantic bounds, the reference's first run again, on its own backend, from its initial weights
with every element one ulp away, so the checks learn how far this spec's training carries one
rounding.

    OUT/fp64-twin-init.npz   the twin's initial weights (the fp64 torch run's, one ulp away)
    OUT/fp64-twin/           the twin run (torch, fp64)
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path

from dualtrain.core.weights import load_weights, save_weights
from dualtrain.driver.compare_plan import PlannedRun
from dualtrain.errors import RunFailed
from dualtrain.parity.checks.semantics import REFERENCE_CHECKS
from dualtrain.parity.report import Comparison
from dualtrain.parity.twin import TWIN, TWIN_INIT, every_ulp_away
from dualtrain.records.record import SPEC_FILE, SUMMARY_FILE, WEIGHTS_FINAL, WEIGHTS_INIT
from dualtrain.spec import Backend, Experiment, load_spec


def twin_spec(reference: Experiment, init: Path) -> Experiment:
    """The reference run's spec from ``init`` (``model.init_from``, a cosmetic field)."""
    model = dataclasses.replace(reference.model, init_from=str(init.resolve()))
    return reference.replace(model=model)


def run_twin(
    cmp: Comparison,
    first: PlannedRun,
    start: Callable[[Experiment, Backend, Path], Path],
    say: Callable[[str], None],
) -> Path | None:
    """Run (or reuse) the rounding twin of ``first`` (the reference pair's run A) where ``cmp``'s
    fp64 pair exceeds the fixed bounds; its folder, or None where none is needed or it could not
    run (a note of ``cmp`` says why). ``start(spec, backend, where)`` launches one run."""
    ref = cmp.reference  # cmp was judged without a twin: its semantic checks are the fixed bounds'
    if ref is None or all(cmp.check(n).passed for n in REFERENCE_CHECKS):
        return None
    if cmp.check("reference_loss").first_step == 1:
        # the loss of the first step is computed on the initial weights: no training has carried a
        # rounding anywhere yet, so the twin could not move any bound that decides the verdict
        cmp.notes.append(
            "rounding twin: not run (the fp64 pair parts at step 1, before training could carry "
            "a rounding)"
        )
        return None
    out, backend = first.where.parent, first.backend
    init, where = out / TWIN_INIT, out / TWIN
    spec = twin_spec(first.spec, init)
    if _finished(where, spec):
        say(f"rounding twin: finished earlier, reused ({where})")
        return where
    say(
        f"the fp64 pair parts beyond the fixed bounds: running its rounding twin ({backend.value} "
        f"fp64, every initial weight one ulp away) to measure how far training carries a rounding "
        f"-> {where}"
    )
    if where.exists():
        shutil.rmtree(where)
    save_weights(init, every_ulp_away(load_weights(Path(ref.a.path) / WEIGHTS_INIT)))
    try:
        return start(spec, backend, where)
    except RunFailed as exc:
        cmp.notes.append(f"rounding twin: could not run ({exc}); the fixed bounds judged")
        return None


def _finished(where: Path, spec: Experiment) -> bool:
    if not ((where / SUMMARY_FILE).is_file() and (where / WEIGHTS_FINAL).is_file()):
        return False
    return load_spec(where / SPEC_FILE).to_dict() == spec.to_dict()

"""The rounding twin: what a run's own training makes of one rounding, the scale the fp64 pair's
bounds grow to where training amplifies rounding past the fixed ones.

The fp64 reference pair differs by rounding (two frameworks' kernels sum in different orders), and
training carries a difference forward: a wide model, many steps, momentum or an optimizer that
normalises small gradients (Adam, RMSprop) can grow 1e-16 into 1e-10 and beyond, so a fixed bound
false-FAILs a faithful pair at some size. The twin measures that growth on the pair's own spec:
reference run A again, on A's backend, from A's initial weights with every element one ulp up or
down (random signs, a fixed seed). Its distance from run A, step by step and tensor by tensor, is
what one rounding of every weight grows into; the pair, which differs by rounding at every step,
may differ by at most :attr:`ReferenceBound.twin_factor` times that (and always by the fixed
bounds).

The twin runs only where a fixed bound is exceeded (compare decides,
:mod:`dualtrain.driver.compare_twin`): a pair within them needs no twin. It is
run A's own backend alone, so a defect on B's side cannot grow it; a defect on A's side changes
what it amplifies, not how much a rounding grows, and a semantic difference shows from the first
steps, where the twin is still at 1e-16.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable

import numpy as np

from dualtrain.core.weights import Weights
from dualtrain.parity import readings as R
from dualtrain.parity.tolerances import REFERENCE
from dualtrain.records.record import RunRecord

#: The twin's run folder under compare's OUT, and its initial weights beside it.
TWIN = "fp64-twin"
TWIN_INIT = "fp64-twin-init.npz"
#: The seed of the twin's signs (fixed: the same twin on every machine).
TWIN_SEED = 0


def every_ulp_away(weights: Weights, seed: int = TWIN_SEED) -> Weights:
    """The same weights in float64 with every element one float64 ulp up or down (random signs
    from ``seed``): one rounding of every initial weight of a fp64 run. (The canonical initial
    weights are float32, which a fp64 run widens exactly; a float32 ulp would be 2^29 of them.)"""
    rng = np.random.default_rng(seed)
    moved = {}
    for name in sorted(weights):
        w = np.asarray(weights[name], dtype=np.float64)
        moved[name] = np.nextafter(w, np.where(rng.random(w.shape) < 0.5, -np.inf, np.inf))
    return moved


def envelope(
    run: RunRecord, twin: RunRecord, key: str, kind: str = "train", floor: float = 0.0
) -> Callable[[int], float]:
    """The bound at each step a series (``key`` of ``kind`` records) may differ by between the
    pair: ``max(floor, twin_factor x`` the twin's largest difference from ``run`` so far ``)``.
    The running maximum: a difference that grew once does not shrink back to a rounding."""
    mine, its = R.step_map(run, key, kind), R.step_map(twin, key, kind)
    steps = R.common_steps(mine, its)
    worst, so_far = {}, 0.0
    for s in steps:
        d = R.scaled_diff(mine[s], its[s])
        so_far = max(so_far, math.inf if math.isnan(d) else d)
        worst[s] = so_far

    def bound(step: int) -> float:
        at = bisect.bisect_right(steps, step)  # the last common step <= step
        grown = worst[steps[at - 1]] if at else 0.0
        return max(floor, REFERENCE.twin_factor * grown)

    return bound


def tensor_bounds(run: RunRecord, twin: RunRecord, floor: float) -> dict[str, float] | None:
    """Per tensor: ``max(floor, twin_factor x`` the twin's final relative distance from ``run``
    ``)``; None when either has no final weights or their layouts differ."""
    mine, its = R.load_final(run), R.load_final(twin)
    if mine is None or its is None or R.layout_problem(mine, its):
        return None
    grown = R.rel_diff(mine, its)
    return {
        k: max(floor, REFERENCE.twin_factor * (math.inf if math.isnan(v) else v))
        for k, v in grown.items()
    }


def accuracy_flips(run: RunRecord, twin: RunRecord, metric: str) -> set[int]:
    """The evaluation steps at which the twin's ``metric`` differs from ``run``'s: where one
    rounding of the initial weights already moves samples across the decision boundary."""
    mine, its = R.step_map(run, metric, "eval"), R.step_map(twin, metric, "eval")
    return {s for s in R.common_steps(mine, its) if mine[s] != its[s]}


def measured(run: RunRecord, twin: RunRecord, fixed: float) -> tuple[str, bool]:
    """(a clause for a check's detail: how far the twin ended from the run; whether the twin
    raises a bound above ``fixed``: its final weights' or its loss's), the final weights read
    once."""
    bounds = tensor_bounds(run, twin, 0.0)
    if not bounds:
        return "the rounding twin's final weights could not be read", False
    worst = max(bounds, key=bounds.__getitem__)
    last = max((int(r["step"]) for r in run.train), default=0)
    grows = bounds[worst] > fixed or envelope(run, twin, "loss", floor=fixed)(last) > fixed
    clause = (
        f"the rounding twin (every initial weight one ulp away) ends "
        f"{bounds[worst] / REFERENCE.twin_factor:.3g} from {R.label(run, 'A')}'s fp64 run ({worst})"
    )
    return clause, grows

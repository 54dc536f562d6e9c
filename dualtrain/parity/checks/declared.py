"""Every check of a spec compare, declared in report order: its name, its group, the function
that makes it and the bounds it holds the runs to (fields of dualtrain.parity.tolerances'
REFERENCE, TOLERANCES and LOCAL). docs/reference.md's table of checks is made from it, and a test
holds the checks a compare makes to it (name, group, order)."""

from __future__ import annotations

from dataclasses import dataclass

from dualtrain.parity.checks.base import INFO
from dualtrain.records.verdict import NUMERICS, RECORDS, SEMANTICS


@dataclass(frozen=True)
class Declared:
    name: str
    group: str
    function: str
    """The ``check_*`` function of dualtrain.parity.checks that makes it."""
    bounds: tuple[str, ...] = ()
    """The tolerance fields it compares against; none for an exact check (0 differences)."""


CHECKS = (
    Declared("spec", RECORDS, "check_spec"),
    Declared("sharding", RECORDS, "check_sharding"),
    Declared("init_weights", RECORDS, "check_init_weights"),
    Declared("lr", RECORDS, "check_lr", ("TOLERANCES.lr_rel",)),
    Declared("loss_scale", RECORDS, "check_loss_scale"),
    Declared("skipped", RECORDS, "check_skipped"),
    Declared("early_stopping", RECORDS, "check_early_stopping"),
    Declared(
        "reference_loss",
        SEMANTICS,
        "check_reference_loss",
        ("REFERENCE.loss_abs", "REFERENCE.twin_factor"),
    ),
    Declared("reference_weights", SEMANTICS, "check_reference_weights", ("REFERENCE.weights_rel",)),
    Declared("reference_eval", SEMANTICS, "check_reference_eval", ("REFERENCE.eval_loss_abs",)),
    Declared(
        "trajectory",
        NUMERICS,
        "check_trajectory",
        ("TOLERANCES.factor", "TOLERANCES.traj_abs_floor", "TOLERANCES.traj_fixed"),
    ),
    Declared(
        "final_weights",
        NUMERICS,
        "check_final_weights",
        ("TOLERANCES.factor", "TOLERANCES.weights_floor", "TOLERANCES.weights_fixed"),
    ),
    Declared("eval", NUMERICS, "check_eval", ("TOLERANCES.eval_pp", "TOLERANCES.factor")),
    Declared(
        "local_loss",
        NUMERICS,
        "check_local",
        ("LOCAL.loss_c", "LOCAL.loss_floor", "LOCAL.loss_path_c", "LOCAL.ratio"),
    ),
    Declared(
        "local_grad",
        NUMERICS,
        "check_local",
        ("LOCAL.grad_c", "LOCAL.grad_floor", "LOCAL.grad_lambda", "LOCAL.ratio"),
    ),
    Declared("local_update", NUMERICS, "check_local", ("LOCAL.update_c", "LOCAL.ratio")),
    Declared("convergence", NUMERICS, "check_convergence", ("LOCAL.accuracy_pp",)),
    Declared("throughput", INFO, "check_throughput"),
)


def declared(name: str) -> Declared:
    """A check's declaration by its name (KeyError: a check no compare makes)."""
    return {d.name: d for d in CHECKS}[name]

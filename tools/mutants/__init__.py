"""Semantic mutants: one backend computes something slightly different on purpose (tests only).

A mutant is applied through the tests' worker hook (testkit.worker_hooks):
``DUALTRAIN_TEST_HOOK=tools.mutants:apply=[BACKEND/]NAME[:SIZE]`` makes every worker call
:func:`apply` right before it builds its engine. A mutant changes one backend (tf unless BACKEND
says torch; a worker of the other backend ignores it), by patching its engine or model builder
inside that worker process; the run's records (spec, lr, ids) stay what the spec says, unless the
mutant is about the records themselves (``swap_id``).

The kinds:

* :data:`MUTANTS`, **semantic** mutants (tf only): they change what the backend computes in every
  precision, so the fp64 reference pair must fail, with the cause named here;
* :data:`PORTING_MUTANTS`, **porting** mutants (one backend each): a convention a port between the
  frameworks gets wrong (amsgrad, dampening, RMSprop's eps, AdamW as Adam plus L2, the batchnorm
  momentum convention), named by the first divergent operation (dualtrain.parity.replay);
* :data:`PRECISION_MUTANTS`, **precision-path** mutants (either backend): active only in runs of
  their precision path (``path``), so the fp64 pair cannot see them; ``dualtrain compare`` must fail
  with "numerics: <backend> <path> path", found by the one-step probes (dualtrain.parity.local);
  :data:`TOKEN_PRECISION_MUTANTS` are the same kind in the token layers (on :data:`TOKEN_SPEC`);
* :data:`UPGRADES`, **simulated framework upgrades** (one backend each): an op of one framework
  changed with its version, which ``dualtrain compare --against`` a saved compare must name.

parity_tests/test_mutants.py and test_precision_mutants.py apply each one;
tools/detection_power.py measures the smallest detected sizes (docs/parity.md §7).

The package: each kind's table beside its patches (``semantic``, ``precision``, ``tokens``,
``either``), the specs they are measured on (``specs``), what they patch (``patching``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testkit.worker_hooks import hook_env
from tools.mutants import either, porting, precision, semantic, tokens, upgrade
from tools.mutants.either import BACKEND_MUTANTS
from tools.mutants.porting import PORTING_MUTANTS, PortingMutant
from tools.mutants.precision import PRECISION_MUTANTS, PRECISION_SPEC, PrecisionMutant, ce_low_sum
from tools.mutants.semantic import MUTANTS, SWAP_STEP, Mutant
from tools.mutants.specs import SPECS
from tools.mutants.tokens import TOKEN_PRECISION_MUTANTS, TOKEN_SPEC, bf16_row_sum
from tools.mutants.upgrade import UPGRADES, Upgrade

__all__ = [
    "BACKEND_MUTANTS",
    "MUTANTS",
    "PORTING_MUTANTS",
    "PRECISION_MUTANTS",
    "PRECISION_SPEC",
    "SPECS",
    "SWAP_STEP",
    "TOKEN_PRECISION_MUTANTS",
    "TOKEN_SPEC",
    "UPGRADES",
    "Upgrade",
    "Mutant",
    "PortingMutant",
    "PrecisionMutant",
    "apply",
    "compare_fp64",
    "bf16_row_sum",
    "ce_low_sum",
    "hook",
]


def hook(name: str, size: float | None = None, backend: str = "tf") -> dict[str, str]:
    """The environment that makes a run's ``backend`` workers apply mutant ``name`` (at
    ``size``)."""
    arg = name if size is None else f"{name}:{size!r}"
    if backend != "tf":
        arg = f"{backend}/{arg}"
    return hook_env(f"tools.mutants:apply={arg}")


def compare_fp64(out: Path, spec: str, name: str, size: float | None = None) -> Any:
    """``dualtrain compare`` of the MNIST MLP with :data:`SPECS` ``spec`` in fp64 (the runs are
    the reference pair), mutant ``name`` planted on its backend: the finished process."""
    from testkit.cli import run_cli  # lazy: heavy (the CLI's forkserver)
    from testkit.parity_runs import MLP  # lazy: heavy

    sets = [a for o in SPECS[spec] if "precision" not in o for a in ("--set", o)]
    return run_cli(
        "compare",
        "--config",
        MLP,
        "--precision",
        "fp64",
        *sets,
        "--out",
        str(out),
        env=hook(name, size),
    )


def apply(backend: str, argument: str) -> None:
    """The DUALTRAIN_TEST_HOOK entry: ``argument`` is [BACKEND/]NAME[:SIZE] (BACKEND: tf if
    absent)."""
    target, _, argument = argument.rpartition("/")
    if backend != (target or "tf"):
        return
    name, _, size_text = argument.partition(":")
    for table, kind in ((PRECISION_MUTANTS, precision), (TOKEN_PRECISION_MUTANTS, tokens)):
        if name in table:
            m = table[name]
            getattr(kind, f"{backend}_{name}")(m.path, float(size_text) if size_text else m.size)
            return
    if name in BACKEND_MUTANTS:
        getattr(either, f"{backend}_{name}")()
        return
    if name in UPGRADES:  # one framework's: the other's workers ignore it
        if UPGRADES[name].backend == backend:
            getattr(upgrade, f"{backend}_{name}")()
        return
    if name in PORTING_MUTANTS:  # one backend's: the other's workers ignore it
        if PORTING_MUTANTS[name].backend == backend:
            getattr(porting, f"{backend}_{name}")()
        return
    if name not in MUTANTS or backend != "tf":
        raise ValueError(
            f"unknown {backend} mutant {name!r} (known: {', '.join(MUTANTS)} (tf), "
            f"{', '.join([*PRECISION_MUTANTS, *TOKEN_PRECISION_MUTANTS])} (either))"
        )
    getattr(semantic, name)(float(size_text) if size_text else MUTANTS[name].size)

"""``dualtrain compare``: run both backends and compare them, or compare two finished runs.

The work (and everything it prints) is :func:`dualtrain.api.compare`'s; this command maps its flags
onto that function's arguments and the verdict onto the exit code. Two audit records
(dualtrain.audit: runs of the user's own scripts) are compared by that same function.
"""

from __future__ import annotations

import click

from dualtrain.cli.options import spec_options
from dualtrain.errors import UserError
from dualtrain.records.verdict import EXPLAINED

#: the steps ``--quick`` trains: step 1 holds the fp64 pair's and the probes' evidence; the
#: locator runs on the initial weights; three steps show an lr or an update that parts later
QUICK_STEPS = 3


@click.command()
@click.argument("run_dirs", nargs=-1, metavar="[RUN_DIR_A RUN_DIR_B]")
@click.option(
    "--config",
    "config",
    type=str,
    default=None,
    metavar="FILE",
    help="YAML experiment spec: run it on torch and tf (plus the fp64 reference pair), "
    "then compare.",
)
@spec_options
@click.option(
    "--reference",
    "reference",
    type=str,
    default=None,
    metavar="fp64|none",
    help="With --config: fp64 (default) also runs the spec in float64 on both backends and "
    "checks that this pair agrees to rounding (the semantic check); none skips it.",
)
@click.option(
    "--reference-runs",
    "reference_runs",
    type=str,
    nargs=2,
    default=None,
    metavar="REF_A REF_B",
    help="With two run directories: the fp64 runs of the same spec on A's and on B's "
    "backend (the semantic check and the numerics noise model).",
)
@click.option(
    "--out",
    type=str,
    default=None,
    metavar="DIR",
    help="Where the runs and the report go (default: <output_dir>/compare-<name>-<time>). "
    "A folder an earlier compare of the same spec wrote is taken up where it "
    "stopped: finished runs are reused, interrupted ones continue.",
)
@click.option(
    "--against",
    "against",
    type=str,
    default=None,
    metavar="SAVED",
    help="Run a saved compare (its folder) again with today's frameworks and hold each "
    "backend's runs to the saved ones: which backend changed, between which versions, and "
    "at which operation. Takes no spec options: the saved spec and reference are replayed.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    default=False,
    help="With --config: replace the runs and the report of an earlier compare in --out.",
)
@click.option(
    "--quick",
    is_flag=True,
    default=False,
    help=f"With --config: train {QUICK_STEPS} steps only (train.max_steps; a --set of it wins): "
    "the fp64 pair's first steps, the one-step probes and, where the fp64 pair parts, the "
    "locator, which is what names a port's mistake. For a large model pair: its cost grows with "
    "the steps.",
)
@click.pass_context
def compare(
    ctx: click.Context,
    run_dirs: tuple[str, ...],
    config: str | None,
    world_size: int | None,
    precision: str | None,
    overrides: tuple[str, ...],
    reference: str | None,
    reference_runs: tuple[str, str] | None,
    out: str | None,
    against: str | None,
    overwrite: bool,
    quick: bool,
) -> None:
    """Check that the torch and tf backends train the same way.

    \b
    With --config: run the spec on both backends, then both again in float64 (the reference pair),
    and compare. The verdict separates "semantics differ" (a record differs, such as the lr or the
    initial weights, or the fp64 pair disagrees: the backends train differently) from "numerics"
    (the fp64 pair agrees; the requested precision differs beyond what its rounding explains).
    With RUN_DIR_A RUN_DIR_B: compare finished runs, or two audit records of your own scripts
    (dualtrain.audit).
    Writes verdict.json, report.md and a self-contained report.html into --out.
    Exit code: 0 if every check passes, 1 if one fails, 2 for a usage mistake; 3 where nothing a
    line changes explains the only failure: a convention of the frameworks (two audit records,
    CONVENTION) or a library's float32 arithmetic inside a layer (a model pair's fp64 pair, LIMIT).

    \b
    Examples:
      dualtrain compare --config configs/mnist_mlp.yaml --world-size 2 --set train.epochs=1
      dualtrain compare --config configs/mnist_cnn.yaml --reference none
      dualtrain compare runs/a runs/b --reference-runs runs/a-fp64 runs/b-fp64 --out runs/a-vs-b
      dualtrain compare --against runs/compare-mnist_mlp-20261130-011442 --out runs/after-upgrade
    """
    from dualtrain.api import compare as compare_api  # lazy: heavy (+120 ms on dualtrain --help)

    if against is not None:
        _against_only(
            {
                "--config": config,
                "run directories": run_dirs or None,
                "--world-size": world_size,
                "--precision": precision,
                "--set": overrides or None,
                "--reference": reference,
                "--reference-runs": reference_runs,
                "--quick": quick or None,
            }
        )
        result = compare_api(against=against, out=out, overwrite=overwrite)
    elif config is not None:
        overrides = _config_only(config, run_dirs, reference_runs, quick, overrides)
        result = compare_api(
            config,
            reference=reference or "fp64",
            out=out,
            overwrite=overwrite,
            world_size=world_size,
            precision=precision,
            set=overrides,
        )
    else:
        _runs_only(run_dirs, world_size, precision, overrides, overwrite, reference, quick)
        result = compare_api(run_dirs[0], run_dirs[1], reference_runs=reference_runs, out=out)
    # a convention of the frameworks (two recorded runs) or a library's float32 arithmetic (a
    # model pair's fp64 pair) explains the only failure: its own code
    ctx.exit(0 if result.passed else 3 if result.category in EXPLAINED else 1)


def _against_only(flags: dict[str, object]) -> None:
    """--against takes the saved compare's spec and reference: no other source or spec flag."""
    given = [flag for flag, v in flags.items() if v is not None]
    if given:
        raise UserError(
            f"--against replays the saved compare's own spec and reference; give only --out "
            f"and --overwrite with it. Received: {', '.join(given)}"
        )


def _config_only(
    config: str,
    run_dirs: tuple[str, ...],
    reference_runs: tuple[str, str] | None,
    quick: bool,
    overrides: tuple[str, ...],
) -> tuple[str, ...]:
    """A spec's compare takes no run directories; its --set, with --quick's steps before them
    (the user's own --set of train.max_steps wins)."""
    if run_dirs:
        raise UserError(
            f"give either --config or two run directories, not both. "
            f"Received: --config {config} and {' '.join(run_dirs)}"
        )
    if reference_runs is not None:
        raise UserError(
            "--reference-runs is for comparing existing runs; with --config compare runs "
            f"its own reference pair. Received: --reference-runs {' '.join(reference_runs)}"
        )
    return (f"train.max_steps={QUICK_STEPS}", *overrides) if quick else overrides


def _runs_only(
    run_dirs: tuple[str, ...],
    world_size: int | None,
    precision: str | None,
    overrides: tuple[str, ...],
    overwrite: bool,
    reference: str | None,
    quick: bool,
) -> None:
    """Two finished runs keep their spec: exactly two, and no spec or --config flag."""
    if len(run_dirs) != 2:
        raise UserError(
            f"give --config FILE, or exactly two run directories. Received: "
            f"{len(run_dirs)} run director{'y' if len(run_dirs) == 1 else 'ies'}"
        )
    if world_size is not None or precision is not None or overrides:
        raise UserError(
            "--world-size, --precision and --set need --config (finished runs keep "
            "their spec). Received: spec options without --config"
        )
    if quick:
        raise UserError(
            "--quick goes with --config (it sets the steps the runs train); finished runs "
            "keep theirs. Received: --quick with two run directories"
        )
    if overwrite:
        raise UserError(
            "--overwrite goes with --config (it replaces an earlier compare's runs); "
            "the report of two finished runs is rewritten anyway. Received: "
            "--overwrite with two run directories"
        )
    if reference is not None:
        raise UserError(
            "--reference fp64|none goes with --config; for finished runs name the fp64 "
            f"runs with --reference-runs REF_A REF_B. Received: --reference {reference}"
        )

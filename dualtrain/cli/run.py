"""``dualtrain run``: train one backend from a spec."""

from __future__ import annotations

import contextlib
import json
import sys

import click

from dualtrain.backends import parse_backend
from dualtrain.cli.options import build_spec, spec_options
from dualtrain.errors import UserError


@click.command()
@click.option(
    "--backend",
    default=None,
    metavar="NAME",
    help="torch or tf (required, except with --resume: the checkpoint's backend).",
)
@click.option(
    "--config",
    "config",
    type=str,
    default=None,
    metavar="FILE",
    help="YAML experiment spec (see configs/ and docs/spec.md).",
)
@spec_options
@click.option(
    "--out",
    type=str,
    default=None,
    metavar="DIR",
    help="Run directory (default: <output_dir>/<name>-<backend>-<time>).",
)
@click.option("--overwrite", is_flag=True, help="Replace the run already in --out.")
@click.option(
    "--resume",
    "resume",
    type=str,
    default=None,
    metavar="RUN_DIR",
    help="Continue a stopped or killed run from its latest complete checkpoint (its own "
    "spec; --world-size may change it with sharding exact).",
)
@click.option(
    "--resume-from",
    "resume_from",
    type=str,
    default=None,
    metavar="CHECKPOINT",
    help="Start a new run (--config, --out) from a checkpoint folder of either backend: "
    "continue a torch run in tf, or the reverse.",
)
@click.option(
    "--dry-run",
    "dry_run",
    is_flag=True,
    help="Make every check the run would (spec, data, --out, the launcher's world size), "
    "print the resolved plan (launcher, rank, rendezvous or TF cluster, run dir) and "
    "exit 0; nothing is written or started.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="With --dry-run: print the plan as one JSON object on stdout (anything else "
    "goes to stderr).",
)
def run(
    backend: str | None,
    config: str | None,
    world_size: int | None,
    precision: str | None,
    overrides: tuple[str, ...],
    out: str | None,
    overwrite: bool,
    resume: str | None,
    resume_from: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Train the spec's model on its data with one backend and write a run directory.

    \b
    The torch backend launches WORLD_SIZE DDP processes (gloo on cpu, nccl on gpu), or runs as one
    rank when started by torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set). The tf backend
    uses MirroredStrategy (tf.strategy=mirrored) or MultiWorkerMirroredStrategy (multi_worker; one
    worker per process, or one worker of an external cluster when TF_CONFIG is set). Started by srun
    (one task per replica, no torchrun), each task is one replica: Slurm's variables give the ranks
    and addresses (docs/clusters.md).
    """
    from dualtrain import api  # lazy: heavy (+120 ms on dualtrain --help)

    if as_json and not dry_run:
        raise UserError(
            "--json goes with --dry-run (the plan as one JSON object). Received: --json "
            "without --dry-run"
        )
    if dry_run:
        if resume is not None:
            raise UserError(
                f"--dry-run checks a new run (--config); --resume checks its run "
                f"directory before it changes anything. Received: --resume {resume}"
            )
        if backend is None:
            raise UserError("--backend is required (torch or tf). Received: no --backend")
        _dry_run(
            parse_backend(backend),
            build_spec(config, world_size, precision, overrides),
            out,
            overwrite,
            resume_from,
            as_json,
        )
        return
    if resume is not None:
        extra = [
            name
            for name, given in (
                ("--config", config),
                ("--precision", precision),
                ("--set", overrides),
                ("--out", out),
                ("--overwrite", overwrite),
                ("--resume-from", resume_from),
            )
            if given
        ]
        if extra:
            raise UserError(
                f"--resume continues the run's own spec in its own folder; only "
                f"--world-size (and --backend, which must be the run's) go with it. "
                f"Received: {', '.join(extra)}"
            )
        api.resume(resume, backend=backend, world_size=world_size)  # prints the finished line
    else:
        if backend is None:
            raise UserError("--backend is required (torch or tf). Received: no --backend")
        b = parse_backend(backend)
        spec = build_spec(config, world_size, precision, overrides)
        api.run(spec, b, out=out, overwrite=overwrite, resume_from=resume_from)


def _dry_run(backend, spec, out, overwrite, resume_from, as_json) -> None:
    from dualtrain.driver.dryrun import format_plan, plan_run  # lazy: heavy (+60 ms on --help)

    if not as_json:
        click.echo(
            format_plan(plan_run(spec, backend, out, overwrite=overwrite, resume_from=resume_from))
        )
        return
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the JSON object and nothing else
        plan = plan_run(spec, backend, out, overwrite=overwrite, resume_from=resume_from)
    click.echo(json.dumps(plan))

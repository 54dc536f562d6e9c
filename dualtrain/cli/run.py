"""``dualtrain run``: train one backend from a spec."""

from __future__ import annotations

import click

from dualtrain.backends import parse_backend
from dualtrain.cli.options import build_spec, spec_options


@click.command()
@click.option("--backend", default=None, metavar="NAME",
              help="torch or tf (required, except with --resume: the checkpoint's backend).")
@click.option("--config", "config", type=str, default=None, metavar="FILE",
              help="YAML experiment spec (see configs/ and docs/spec.md).")
@spec_options
@click.option("--out", type=str, default=None, metavar="DIR",
              help="Run directory (default: <output_dir>/<name>-<backend>-<time>).")
@click.option("--overwrite", is_flag=True, help="Replace the run already in --out.")
@click.option("--resume", "resume", type=str, default=None, metavar="RUN_DIR",
              help="Continue a stopped or killed run from its latest complete checkpoint (its own "
                   "spec; --world-size may change it with sharding exact).")
@click.option("--resume-from", "resume_from", type=str, default=None, metavar="CHECKPOINT",
              help="Start a new run (--config, --out) from a checkpoint folder of either backend: "
                   "continue a torch run in tf, or the reverse.")
def run(backend: str | None, config: str | None, world_size: int | None, precision: str | None,
        overrides: tuple[str, ...], out: str | None, overwrite: bool, resume: str | None,
        resume_from: str | None) -> None:
    """Train on MNIST with one backend and write a run directory.

    \b
    The torch backend launches WORLD_SIZE DDP processes (gloo on cpu, nccl on gpu), or runs as one
    rank when started by torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set). The tf backend
    uses MirroredStrategy (tf.strategy=mirrored) or MultiWorkerMirroredStrategy (multi_worker; one
    worker per process, or one worker of an external cluster when TF_CONFIG is set).
    """
    from dualtrain.errors import UserError
    from dualtrain.runs import resume_run, start_run

    if resume is not None:
        extra = [name for name, given in (("--config", config), ("--precision", precision),
                                          ("--set", overrides), ("--out", out),
                                          ("--overwrite", overwrite), ("--resume-from", resume_from))
                 if given]
        if extra:
            raise UserError(f"--resume continues the run's own spec in its own folder; only "
                            f"--world-size (and --backend, which must be the run's) go with it. "
                            f"Received: {', '.join(extra)}")
        b = parse_backend(backend) if backend is not None else None
        run_dir, summary = resume_run(resume, b, world_size)
        b = parse_backend(summary["backend"])
    else:
        if backend is None:
            raise UserError("--backend is required (torch or tf). Received: no --backend")
        b = parse_backend(backend)
        spec = build_spec(config, world_size, precision, overrides)
        run_dir, summary = start_run(spec, b, out, overwrite=overwrite, resume_from=resume_from)
    if run_dir is not None:
        acc = summary.get("test_accuracy")
        click.echo(f"dualtrain: {b.value} run finished: test accuracy "
                   f"{'n/a' if acc is None else f'{100 * acc:.2f}%'}, "
                   f"{summary.get('train_samples_per_s', 0):,.0f} samples/s -> {run_dir}")

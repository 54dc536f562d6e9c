"""``dualtrain run``: train one backend from a spec."""

from __future__ import annotations

import click

from dualtrain.backends import parse_backend
from dualtrain.cli.options import build_spec, spec_options


@click.command()
@click.option("--backend", required=True, metavar="NAME", help="torch or tf.")
@click.option("--config", "config", type=str, default=None, metavar="FILE",
              help="YAML experiment spec (see configs/ and docs/spec.md).")
@spec_options
@click.option("--out", type=str, default=None, metavar="DIR",
              help="Run directory (default: <output_dir>/<name>-<backend>-<time>).")
@click.option("--overwrite", is_flag=True, help="Replace the run already in --out.")
def run(backend: str, config: str | None, world_size: int | None, precision: str | None,
        overrides: tuple[str, ...], out: str | None, overwrite: bool) -> None:
    """Train on MNIST with one backend and write a run directory.

    \b
    The torch backend launches WORLD_SIZE DDP processes (gloo on cpu, nccl on gpu), or runs as one
    rank when started by torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set). The tf backend
    uses MirroredStrategy (tf.strategy=mirrored) or MultiWorkerMirroredStrategy (multi_worker; one
    worker per process, or one worker of an external cluster when TF_CONFIG is set).
    """
    from dualtrain.runs import start_run

    b = parse_backend(backend)
    spec = build_spec(config, world_size, precision, overrides)
    run_dir, summary = start_run(spec, b, out, overwrite=overwrite)
    if run_dir is not None:
        acc = summary.get("test_accuracy")
        click.echo(f"dualtrain: {b.value} run finished: test accuracy "
                   f"{'n/a' if acc is None else f'{100 * acc:.2f}%'}, "
                   f"{summary.get('train_samples_per_s', 0):,.0f} samples/s -> {run_dir}")

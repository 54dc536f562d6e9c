"""``dualtrain diff-models``: where the two sides of a model pair first differ."""

from __future__ import annotations

import json

import click

from dualtrain.cli.options import build_spec, spec_options
from dualtrain.errors import UserError


@click.command("diff-models")
@click.option("--config", "config", type=str, default=None, metavar="FILE", help="YAML spec.")
@spec_options
@click.option(
    "--samples", type=int, default=16, show_default=True, help="Training samples in the batch."
)
@click.option("--json", "as_json", is_flag=True, default=False, help="The finding as JSON.")
@click.pass_context
def diff_models(
    ctx: click.Context,
    config: str | None,
    world_size: int | None,
    precision: str | None,
    overrides: tuple[str, ...],
    samples: int,
    as_json: bool,
) -> None:
    """Run a model pair's torch module and Keras port layer by layer on the same batch in
    float64, from the same initial weights, and name the first layer that introduces a
    difference (its input, its own output, its gradient) and the porting mistake it fits.

    Exit code: 0 if the two sides agree to float64 rounding, 1 if they differ, 2 for a usage
    mistake (so it can gate CI).

    \b
    Example:
      dualtrain diff-models --config configs/port_resnet.yaml \\
          --set model.keras=mistaken_keras:same_padding_strided
    """
    from dualtrain.driver.locate import locate_pair, table  # lazy: heavy (+45 ms on --help)
    from dualtrain.driver.pair import pair_layout  # lazy: heavy (+20 ms on --help)

    spec = build_spec(config, world_size, precision, overrides)
    if not spec.model.is_pair:
        raise UserError(
            "diff-models compares a model pair (model.torch and model.keras); dualtrain's own "
            "layers are the same on both backends by construction. Received: no model.torch"
        )
    if samples < 1:
        raise UserError(f"--samples must be >= 1. Received: {samples}")
    layout, weights = pair_layout(spec)
    finding = locate_pair(spec, layout, weights, samples)
    if as_json:
        click.echo(json.dumps(finding.to_json(), indent=1))
    else:
        click.echo(table(finding))
        click.echo(finding.line())
    ctx.exit(0 if finding.agrees else 1)

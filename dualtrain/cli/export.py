"""``dualtrain export``: a finished run's model in torch's or Keras's own form."""

from __future__ import annotations

import json

import click


@click.command()
@click.argument("run_dir", metavar="RUN_DIR")
@click.option(
    "--format",
    "fmt",
    required=True,
    metavar="torch|keras",
    help="torch: model.safetensors + model.py (the nn.Module); keras: model.keras.",
)
@click.option(
    "--out",
    type=str,
    default=None,
    metavar="DIR",
    help="Folder to write (default: RUN_DIR/export/FORMAT); must be new or empty.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    default=False,
    help="Replace a previous export in --out (a folder with export.json), once the new "
    "one is complete.",
)
@click.option(
    "--weights",
    "which",
    default="final",
    show_default=True,
    metavar="final|best|ema",
    help="The run's final weights, the best evaluation's (weights_best.npz, train.keep_best), or "
    "the averaged ones (weights_ema.npz, train.ema).",
)
def export(run_dir: str, fmt: str, out: str | None, overwrite: bool, which: str) -> None:
    """Write a finished run's trained model so that torch or Keras loads it without dualtrain.

    \b
    torch: model.safetensors (the state dict) and model.py (build_model(), load()).
    keras: model.keras (keras.saving.load_model opens it).
    The model takes its inputs normalised as the run normalised them (export.json records how:
    MNIST's (x / 255 - 0.1307) / 0.3081, or the mean and std per input of your data) and returns
    logits, or values for an mse or huber model (export.json says which).
    """
    from dualtrain.driver.export import export_run  # lazy: heavy (+55 ms on dualtrain --help)

    folder = export_run(run_dir, fmt, out, overwrite=overwrite, which=which)
    click.echo(
        f"dualtrain: exported {run_dir} as {fmt} -> {folder} (loaded back without dualtrain)"
    )
    how = json.loads((folder / "export.json").read_text()).get("load")
    if how:  # a pair whose Keras model needs the user's module to open
        click.echo(f"dualtrain: model.keras needs your code to load: {how}")

"""``dualtrain compare``: placeholder until the compare report lands (issue 4)."""

from __future__ import annotations

import click

from dualtrain.errors import UserError


@click.command()
@click.argument("run_dirs", nargs=-1)
def compare(run_dirs: tuple[str, ...]) -> None:
    """Compare two backends' runs (not implemented yet)."""
    raise UserError("compare is not implemented yet")

"""Spec-related options shared by ``run`` and ``compare``: --config, --world-size, --precision,
--set."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from dualtrain.spec import Experiment, Precision, load_spec


def spec_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option(
        "--set",
        "overrides",
        multiple=True,
        metavar="KEY=VALUE",
        help="Override a spec field, e.g. --set optimizer.lr=0.1 (repeatable).",
    )(f)
    f = click.option(
        "--precision",
        type=str,
        default=None,
        metavar="P",
        help=f"Shortcut for --set precision.dtype=P ({', '.join(Precision.values())}).",
    )(f)
    f = click.option(
        "--world-size",
        type=int,
        default=None,
        metavar="N",
        help="Shortcut for --set distribution.world_size=N.",
    )(f)
    return f


def build_spec(
    config: str | None, world_size: int | None, precision: str | None, overrides: tuple[str, ...]
) -> Experiment:
    extra = list(overrides)
    if world_size is not None:
        extra.append(f"distribution.world_size={world_size}")
    if precision is not None:
        extra.append(f"precision.dtype={precision}")
    return load_spec(config, extra)

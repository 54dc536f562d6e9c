"""Fixtures for every test under tests/ (the helpers are in testkit.cli)."""

from __future__ import annotations

import pytest

from testkit.cli import isolate_pair_cache, run_cli, warm_workers

isolate_pair_cache()  # every session describes each model pair itself
warm_workers()  # the parallel part forks its runs' workers warm (testkit.cli.warm_workers)


@pytest.fixture
def cli():
    return run_cli

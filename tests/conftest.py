"""Fixtures for every test under tests/ (the helpers are in testkit.cli)."""

from __future__ import annotations

import pytest

from testkit.cli import isolate_pair_cache, run_cli, warm_workers
from testkit.worker_hooks import install as install_worker_hook

isolate_pair_cache()  # every session describes each model pair itself
install_worker_hook()  # runs' workers see the tests' hook (testkit.worker_hooks)
warm_workers()  # the parallel part forks its runs' workers warm (testkit.cli.warm_workers)


@pytest.fixture
def cli():
    return run_cli

"""Parity suite fixtures: ``runs``, real runs of both backends shared by the whole session
(testkit.parity_runs.Runs)."""

from __future__ import annotations

import pytest

from testkit.cli import isolate_pair_cache, warm_workers
from testkit.parity_runs import Runs
from testkit.shared import shared_root

isolate_pair_cache()  # every session describes each model pair itself
warm_workers()  # the parallel part forks its runs' workers warm (testkit.cli.warm_workers)


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> Runs:
    return Runs(shared_root(tmp_path_factory, "parity-runs"))

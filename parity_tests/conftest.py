"""Parity suite fixtures: ``runs``, real runs of both backends shared by the whole session
(testkit.parity_runs.Runs)."""

from __future__ import annotations

import pytest

from testkit.cli import isolate_pair_cache, warm_workers
from testkit.parity_runs import Runs
from testkit.shared import shared_root
from testkit.worker_hooks import install as install_worker_hook

isolate_pair_cache()  # every session describes each model pair itself
install_worker_hook()  # runs' workers see the tests' hook (testkit.worker_hooks)
warm_workers()  # the parallel part forks its runs' workers warm (testkit.cli.warm_workers)


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> Runs:
    return Runs(shared_root(tmp_path_factory, "parity-runs"))

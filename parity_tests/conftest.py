"""Parity suite fixtures: ``runs``, real runs of both backends shared by the whole session
(testkit.parity_runs.Runs)."""

from __future__ import annotations

import pytest

from testkit.parity_runs import Runs
from testkit.shared import shared_root


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> Runs:
    return Runs(shared_root(tmp_path_factory, "parity-runs"))

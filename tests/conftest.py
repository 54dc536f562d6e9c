"""Fixtures for every test under tests/ (the helpers are in testkit.cli)."""

from __future__ import annotations

import pytest

from testkit.cli import isolate_pair_cache, run_cli

isolate_pair_cache()  # every session describes each model pair itself


@pytest.fixture
def cli():
    return run_cli

"""Fixtures for every test under tests/ (the helpers are in testkit.cli)."""

from __future__ import annotations

import pytest

from testkit.cli import run_cli


@pytest.fixture
def cli():
    return run_cli

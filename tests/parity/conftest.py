"""tests/parity: unit tests, in this process and framework-free (testkit.unit_guard)."""

import pytest

from testkit.synth import quad
from testkit.unit_guard import *  # noqa: F403 (its fixtures and hooks, for this folder)


@pytest.fixture
def four(tmp_path):
    """A and B agree to fp32 rounding; their fp64 reference pair agrees to fp64 rounding."""
    return quad(tmp_path)

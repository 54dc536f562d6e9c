"""tests/launch: unit tests, in this process and framework-free (testkit.unit_guard)."""

from testkit.unit_guard import *  # noqa: F403 (its fixtures and hooks, for this folder)

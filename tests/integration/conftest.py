"""Fixtures for the integration tests (the helpers are in testkit)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from testkit.tf_runs import Run

_CACHE: dict[str, Run] = {}


@pytest.fixture(scope="session")
def cached_run(tmp_path_factory):
    """Run a spec once per session (several tests read the same run directory)."""
    # imported here: importing testkit.tf_runs skips the importer without TensorFlow, and this
    # folder's other tests do not need it
    from testkit.tf_runs import tf_run

    def get(key: str, spec: dict[str, Any], *extra: str) -> Run:
        if key not in _CACHE:
            _CACHE[key] = tf_run(tmp_path_factory.mktemp(key), spec, *extra)
        return _CACHE[key]

    return get

"""Every change to arithmetic is announced (CHANGELOG.md): six fixed runs' final-weight digests,
taken under pinned kernels, against what the changelog's newest entry makes of this machine: its
table for this machine, or else the same runs of the commit that wrote that table, run here
(tools/arithmetic.py). Shown to fail: the tf runs' lr one float32 ulp larger, on either path."""

from __future__ import annotations

import pytest

from testkit.cli import require
from tools.arithmetic import (
    RUNS,
    digests,
    expected,
    recorded_versions,
    run_all,
    unannounced,
    versions,
)
from tools.mutants import hook

require("torch", "tensorflow", "keras")

pytestmark = pytest.mark.slow  # six runs under the pinned kernels: the slow set's CI part

ANNOUNCE = (
    "say which runs change and by how much (python -m tools.arithmetic --table --against REV)"
)


def test_the_fixed_runs_are_the_ones_the_changelog_records(tmp_path):
    said, source = expected(tmp_path / "expected")
    print(f"expected: {source}")
    off = unannounced(digests(run_all(tmp_path / "now")), said, source)
    assert not off, "arithmetic changed without a CHANGELOG.md entry:\n" + "\n".join(off) + ANNOUNCE


def test_the_frameworks_are_the_ones_the_changelog_names():
    # a machine with no table of its own compares against older code run with today's frameworks,
    # so an upgrade is announced by the versions the entry names
    assert recorded_versions() == versions(), f"frameworks changed without an entry: {ANNOUNCE}"


@pytest.mark.parametrize(
    "table", [True, False], ids=["this machine's table", "the commit run here"]
)
def test_an_unannounced_one_ulp_change_is_named(tmp_path, table, monkeypatch):
    tf_runs = tuple(r for r in RUNS if r.backend == "tf")
    if not table:  # as on a machine the changelog has no table for
        monkeypatch.setattr("tools.arithmetic.machine", lambda: "a machine with no table")
    said, source = expected(tmp_path / "expected", runs=tf_runs)
    assert source.endswith("gives here") != table, source
    # the tf runs' lr times (1 + 2^-23): one float32 ulp (0.01's ulp is 0.93 of 2^-23 relative)
    now = digests(run_all(tmp_path / "now", env=hook("lr_scale", 2.0**-23), runs=tf_runs))
    off = unannounced(now, said, source)
    assert [line.split(":")[0] for line in off] == [r.name for r in tf_runs], off
    assert all(said[r.name] in line for r, line in zip(tf_runs, off, strict=True))

"""Every change to arithmetic is announced (CHANGELOG.md): six fixed runs' final-weight digests,
taken under a kernel setting every AVX2 machine reproduces, against the newest digests the changelog
records (tools/arithmetic.py). Shown to fail: the tf runs' lr one float32 ulp larger."""

from __future__ import annotations

import pytest

from testkit.cli import require
from tools.arithmetic import RUNS, digests, recorded, run_all, unannounced
from tools.mutants import hook

require("torch", "tensorflow", "keras")

pytestmark = pytest.mark.slow  # six runs under the pinned kernels: the slow set's CI part


def test_the_fixed_runs_are_the_ones_the_changelog_records(tmp_path):
    off = unannounced(digests(run_all(tmp_path)))
    assert not off, (
        "arithmetic changed without a CHANGELOG.md entry:\n"
        + "\n".join(off)
        + "\nsay which runs change and by how much (python -m tools.arithmetic --table "
        "--against REV)"
    )


def test_an_unannounced_one_ulp_change_is_named(tmp_path):
    tf_runs = tuple(r for r in RUNS if r.backend == "tf")
    # the tf runs' lr times (1 + 2^-23): one float32 ulp (0.01's ulp is 0.93 of 2^-23 relative)
    now = digests(run_all(tmp_path, env=hook("lr_scale", 2.0**-23), runs=tf_runs))
    off = unannounced(now)
    assert [line.split(":")[0] for line in off] == [r.name for r in tf_runs], off
    assert all(recorded()[r.name] in line for r, line in zip(tf_runs, off, strict=True))

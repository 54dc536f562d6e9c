"""Where a worker starts (dualtrain.runtime.start.Start): what the launcher hands a worker process
in its environment is what the worker reads back, its part in the probes included."""

from pathlib import Path

import pytest

from dualtrain.runtime import probes
from dualtrain.runtime.start import Start


@pytest.mark.parametrize(
    "start",
    [
        Start(),
        Start(resume=Path("/runs/a/checkpoints/step-00000010"), attempt=2),
        Start(probe=probes.RECORD),
        Start(attempt=1, probe=probes.replay("/runs/cmp/fp64-torch")),
    ],
)
def test_the_environment_a_worker_is_given_is_where_it_starts(start):
    assert Start.from_env(start.env()) == Start(
        resume=start.resume, attempt=start.attempt, launched=True, probe=start.probe
    )


def test_a_role_of_another_kind_is_refused():
    with pytest.raises(ValueError, match="'record' or 'replay=DIR'"):
        Start.from_env({probes.PROBE_ENV: "replay"})

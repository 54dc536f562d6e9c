"""distribution.bind_cores: the cores a host's local worker runs on (runtime.start.worker_cores)."""

import os

import pytest

from dualtrain.runtime.start import worker_cores


@pytest.fixture
def usable(monkeypatch):
    def set_cores(cores):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(cores))

    return set_cores


def test_each_local_worker_gets_a_block_of_its_own_in_rank_order(usable):
    usable([8, 9, 2, 3, 4, 5])  # a launcher bound by taskset or Slurm: not from core 0
    assert [worker_cores(r, 3, 2) for r in range(3)] == [[2, 3], [4, 5], [8, 9]]
    assert [worker_cores(r, 2, 1) for r in range(2)] == [[2], [3]]


def test_no_binding_for_one_worker_or_more_threads_than_cores(usable):
    usable([0, 1])
    assert worker_cores(0, 1, 2) is None  # one local worker: every core is its own already
    assert worker_cores(0, 3, 1) is None  # world 3 on 2 cores: the OS shares them out
    assert worker_cores(1, 2, 2) is None

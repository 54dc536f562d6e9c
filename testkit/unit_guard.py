"""The unit test folders' rules: fast, in this process, framework-free.

The folders of tests/ that mirror the package (tests/spec, tests/core, tests/runtime, ...; not
tests/backends, whose tests import their framework in this process) hold unit tests. A unit test
starts no process (no subprocess, fork, exec of a child, multiprocessing) and imports neither torch
nor tensorflow/keras, directly or through dualtrain; a test that needs a process belongs under
tests/integration, one that imports a framework under tests/backends/<backend> (or
tests/integration). Each such folder's conftest.py loads this module (``from testkit.unit_guard
import *``), which enforces both rules for every test under that folder:

* from the folder's first unit test to its last, every way of starting a process raises
  ProcessStarted (and an attempt the code under test caught still fails the test at its teardown);
* a framework module that appears in sys.modules while a unit test module is imported (a
  collection error) or while a unit test runs (an error in that test) fails it.

In a run of the whole suite, a framework another test folder loaded first (tests/backends is
collected before most of them) is not seen again: the framework check is exact for ``make
test-unit``, which runs the unit folders alone.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

__all__ = [
    "_no_process_and_no_framework",
    "_this_test_starts_no_process_and_imports_no_framework",
    "pytest_make_collect_report",
    "pytest_runtest_makereport",
]

FRAMEWORKS = ("torch", "tensorflow", "keras")
NO_PROCESS = "unit tests start no process: put this test under tests/integration"
NO_FRAMEWORK = (
    "unit tests import no framework (torch, tensorflow, keras): put this test under "
    "tests/backends or tests/integration"
)


def loaded_frameworks() -> set[str]:
    return {m for m in FRAMEWORKS if m in sys.modules}


class ProcessStarted(AssertionError):
    """A unit test tried to start a process."""


#: Attempts to start a process since the current unit test began (a caught ProcessStarted included).
_attempts: list[str] = []


def _refusal(what: str):
    def refuse(*args, **kwargs):
        _attempts.append(what)
        raise ProcessStarted(f"{NO_PROCESS} ({what} was called)")

    return refuse


def _process_starters() -> list[tuple[object, str]]:
    """(owner, attribute) of each way to start a process: subprocess.* and os.popen go through
    Popen; pty.fork and os.spawn* through os.fork/os.forkpty; multiprocessing through Process.start
    (every start method); _posixsubprocess.fork_exec is what spawn and the resource tracker use."""
    starters: list[tuple[object, str]] = [
        (subprocess.Popen, "__init__"),
        (multiprocessing.process.BaseProcess, "start"),
    ]
    starters += [
        (os, name)
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")
        if hasattr(os, name)
    ]
    try:
        import _posixsubprocess
    except ImportError:  # not POSIX
        pass
    else:
        starters.append((_posixsubprocess, "fork_exec"))
    return starters


@pytest.fixture(scope="package", autouse=True)
def _no_process_and_no_framework(request) -> Iterator[None]:
    """For the whole of a unit test folder (module- and package-scoped fixtures included): refuse
    to start a process, and no framework may be loaded at the end that was not loaded at the
    start."""
    before = loaded_frameworks()
    with pytest.MonkeyPatch.context() as mp:
        for owner, name in _process_starters():
            where = (
                owner.__name__
                if isinstance(owner, type(os))
                else f"{owner.__module__}.{owner.__qualname__}"
            )
            qualified = f"{where}.{name}"
            mp.setattr(owner, name, _refusal(qualified))
        yield
    new = loaded_frameworks() - before
    assert not new, f"{NO_FRAMEWORK}; imported during {request.node.nodeid}: {sorted(new)}"


@pytest.fixture(autouse=True)
def _this_test_starts_no_process_and_imports_no_framework(request) -> Iterator[None]:
    _attempts.clear()
    before = loaded_frameworks()
    yield
    attempts, new = list(_attempts), loaded_frameworks() - before
    _attempts.clear()
    assert not attempts, f"{NO_PROCESS}: {request.node.nodeid} called {', '.join(attempts)}"
    assert not new, f"{NO_FRAMEWORK}: {request.node.nodeid} imported {sorted(new)}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A test that failed on ProcessStarted has said so: its teardown does not say it again."""
    if call.excinfo is not None and call.excinfo.errisinstance(ProcessStarted):
        _attempts.clear()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """A unit test module whose import loads a framework is a collection error (pytest calls a
    conftest.py's hooks for the nodes under its folder only: the folders that load this module)."""
    if not isinstance(collector, pytest.Module):
        return (yield)
    before = loaded_frameworks()
    report = yield
    new = loaded_frameworks() - before
    if new and report.passed:
        report.outcome = "failed"
        report.longrepr = f"{NO_FRAMEWORK}; importing {collector.nodeid} imported {sorted(new)}"
    return report

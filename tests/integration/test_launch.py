"""The local launcher (dualtrain.launch.local.run_workers) never waits forever and names the worker
at fault.

Real subprocesses (testkit/launch_stub.py), no framework."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dualtrain.backends.tf.launch import STDERR_NOISE
from dualtrain.errors import RunFailed
from dualtrain.launch.local import SHOW_ALL_LOGS, Worker, run_workers

# Signals, kills, torchrun or timing: make test runs these alone, after the parallel part.
pytestmark = pytest.mark.serial

STUB = "testkit.launch_stub"
ROOT = Path(__file__).resolve().parents[2]


def workers(*roles: str) -> list[Worker]:
    return [Worker(rank=r, env={"STUB_ROLE": role}) for r, role in enumerate(roles)]


def test_all_finish(tmp_path):
    ws = workers("ok", "ok", "ok")
    run_workers(STUB, [], ws, run_dir=tmp_path)
    assert [w.proc.returncode for w in ws] == [0, 0, 0]
    launch = json.loads((tmp_path / "launch.json").read_text())
    assert [w["rank"] for w in launch["workers"]] == [0, 1, 2]


def test_failing_worker_is_named_and_others_stopped():
    ws = workers("hang", "fail")
    t0 = time.monotonic()
    with pytest.raises(
        RunFailed, match=r"rank 1 \(pid \d+\) exited with code 3; stopped the other 1"
    ):
        run_workers(STUB, [], ws, grace_s=60)
    assert time.monotonic() - t0 < 30
    assert ws[0].proc.poll() is not None  # the hanging one was stopped, not left behind


def test_the_killed_worker_is_named_not_the_one_that_lost_it():
    # rank 0 exits 1 first (its collective lost rank 1), rank 1 was SIGKILLed: the cause is rank 1
    ws = workers("fail_first", "killed", "hang")
    with pytest.raises(RunFailed, match=r"rank 1 \(pid \d+\) was killed by SIGKILL") as err:
        run_workers(STUB, [], ws, grace_s=60)
    assert err.value.rank == 1
    assert ws[2].proc.poll() is not None


def test_straggler_is_stopped_after_grace_with_its_stack(capfd, tmp_path):
    ws = workers("ok", "hang")
    for w in ws:  # rank 0 finishes only once rank 1 can answer SIGUSR1
        w.env["STUB_READY"] = str(tmp_path / "ready")
    with pytest.raises(RunFailed, match=r"rank\(s\) 1 did not finish within 2s of the others"):
        run_workers(STUB, [], ws, grace_s=2)
    assert ws[1].proc.poll() is not None
    err = capfd.readouterr().err
    assert "is stuck; its stacks follow" in err
    assert (
        "stuck_here" in err
    )  # faulthandler's dump of the stuck worker names the function it is in


def test_stderr_noise_is_left_out_and_the_rest_forwarded(capfd):
    run_workers(STUB, [], workers("noisy", "noisy"), stderr_noise=STDERR_NOISE)
    err = capfd.readouterr().err.splitlines()
    assert sorted(err) == sorted(
        2
        * [
            "keep: a user-facing line",
            "W1122 09:15:03.000001   12724 some_op.cc:12] keep: a TF warning",
            "Traceback (most recent call last):",
            "keep: the last line, without a newline",
        ]
    ), err


def test_all_worker_logs_on_request(capfd, monkeypatch):
    monkeypatch.setenv(SHOW_ALL_LOGS, "all")
    run_workers(STUB, [], workers("noisy"), stderr_noise=STDERR_NOISE)
    err = capfd.readouterr().err
    assert "cudart_stub.cc" in err and "Started server" in err and "keep: a user-facing line" in err


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a zombie has exited


LAUNCHER = """
import sys
from dualtrain.launch.local import Terminated, Worker, run_workers
role = sys.argv[2] if len(sys.argv) > 2 else "hang"
ws = [Worker(rank=r, env={"STUB_ROLE": role, "STUB_READY": sys.argv[1] + f"/ready{r}"})
      for r in range(2)]
try:
    run_workers("testkit.launch_stub", [], ws, run_dir=sys.argv[1])
except Terminated:
    sys.exit(143)
except KeyboardInterrupt:
    sys.exit(130)
print("finished")
"""


def default_sigint() -> None:
    """SIGINT at its default in the launcher, as a terminal starts a job (a suite run in the
    background of a non-interactive shell inherits it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_launcher(tmp_path, role="hang", **popen):
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(tmp_path), role],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=default_sigint,
        **popen,
    )
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready{r}").exists() for r in range(2)):
        assert proc.poll() is None and time.monotonic() < deadline, "stub workers never started"
        time.sleep(0.05)
    pids = [w["pid"] for w in json.loads((tmp_path / "launch.json").read_text())["workers"]]
    assert all(_alive(p) for p in pids)
    return proc, pids


def _wait_gone(pids, timeout=15.0):
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def test_sigterm_to_the_launcher_stops_the_workers(tmp_path):
    proc, pids = _start_launcher(tmp_path)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    assert _wait_gone(pids) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_workers_do_not_outlive_a_killed_launcher(tmp_path):
    proc, pids = _start_launcher(tmp_path)
    proc.kill()  # SIGKILL: no handler runs in the launcher
    proc.wait(timeout=30)
    assert _wait_gone(pids) == []


def test_a_run_that_finishes_while_being_stopped_is_reported_finished(tmp_path):
    # The workers ignore SIGTERM (as TF's multi-worker runtime did) and finish cleanly within the
    # launcher's stop timeout: the run is complete, so the launcher reports it finished, not
    # stopped.
    proc, pids = _start_launcher(tmp_path, "finishing", stdout=subprocess.PIPE, text=True)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "finished" in out
    assert _wait_gone(pids) == []


def test_workers_leave_ctrl_c_to_their_launcher(tmp_path):
    # Ctrl-C reaches the whole process group; workers ignore it and the launcher stops them.
    proc, pids = _start_launcher(
        tmp_path, start_new_session=True, stderr=subprocess.PIPE, text=True
    )
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert _wait_gone(pids) == []
    # A worker that reacted to SIGINT itself would print its KeyboardInterrupt traceback.
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err

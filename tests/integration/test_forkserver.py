"""Warm workers (dualtrain.launch.forkserver): a forked worker gets what a started one gets, is
watched the same way, dies with its launcher, and trains bit-identically to a started one."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from dualtrain.errors import UserError
from dualtrain.launch import forkserver

MODULE = "testkit.forked_probe"


@pytest.fixture(autouse=True)
def _servers_end(tmp_path):
    """The servers a test started end with it (a server exits once its socket is removed), not
    ten idle minutes later."""
    yield
    for sock in tmp_path.rglob("*.sock"):
        sock.unlink(missing_ok=True)


def _spawn(folder: Path, out: Path, mode: str, env: dict[str, str], **kw) -> forkserver.Forked:
    return forkserver.spawn(
        str(folder),
        MODULE,
        [str(out), mode],
        env,
        key=forkserver.import_environment(env, {"PROBE", "PROBE_LISTEN_FD"}, {}),
        preload=("json",),
        stderr=subprocess.PIPE,
        **kw,
    )


def _env(**extra: str) -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": root, **extra}


def test_a_forked_worker_gets_its_environment_descriptors_and_exit_code(tmp_path, monkeypatch):
    folder = tmp_path / ("a-folder-name-longer-than-a-unix-socket-address-" * 3) / "servers"
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.set_inheritable(True)
        fd = listener.fileno()
        proc = _spawn(
            folder,
            tmp_path / "a.json",
            "3",
            _env(PROBE="a", PROBE_LISTEN_FD=str(fd)),
            pass_fds=(fd,),
        )
        assert proc.wait(timeout=60) == 3
    assert proc.stderr is not None and proc.stderr.read() == b"probe 3\n"
    info = json.loads((tmp_path / "a.json").read_text())
    assert info == {
        "cwd": str(work),
        "probe": "a",
        "pid": proc.pid,
        "argv": [str(tmp_path / "a.json"), "3"],
        "listening": True,
        "name": "__main__",
    }
    # the next worker comes from the same server (one per import environment), with its own values
    second = _spawn(folder, tmp_path / "b.json", "0", _env(PROBE="b"))
    assert second.wait(timeout=60) == 0
    assert json.loads((tmp_path / "b.json").read_text())["probe"] == "b"
    assert len(list(folder.glob("*.sock"))) == 1
    # another import environment gets another server
    third = _spawn(folder, tmp_path / "c.json", "0", _env(PROBE="c", OMP_NUM_THREADS="1"))
    assert third.wait(timeout=60) == 0
    assert len(list(folder.glob("*.sock"))) == 2


def test_a_forked_worker_is_signalled_and_dies_with_its_launcher(tmp_path):
    folder = tmp_path / "servers"
    proc = _spawn(folder, tmp_path / "a.json", "sleep", _env())
    _wait_for(tmp_path / "a.json")
    assert proc.poll() is None
    proc.terminate()
    assert proc.wait(timeout=30) == -signal.SIGTERM
    # the launcher gone (its connection closed) while its worker runs: the server kills the worker
    orphan = _spawn(folder, tmp_path / "b.json", "sleep", _env())
    _wait_for(tmp_path / "b.json")
    orphan.conn.close()
    deadline = time.monotonic() + 30
    while _alive(orphan.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(orphan.pid)
    # the server ends when its socket is removed (its folder's owner is done)
    (sock,) = folder.glob("*.sock")
    server = _server_pid(folder)
    sock.unlink()
    deadline = time.monotonic() + 30
    while _alive(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(server)


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    """Running, not a zombie; a process reaped between the checks is dead too."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state not in ("Z", "X")


def _server_pid(folder: Path) -> int:
    (sock,) = [p for p in folder.iterdir() if p.suffix == ".log"]
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(str(folder).encode() in part for part in cmd):
                return int(proc.name)
    raise AssertionError(f"no server for {sock}")


@pytest.mark.parametrize(  # default-suite time: tf's runs in CI's slow part (docs/testing.md)
    "backend", ["torch", pytest.param("tf", marks=pytest.mark.slow)]
)
def test_a_warm_run_trains_bit_identically_to_a_started_one(backend, tmp_path, cli, monkeypatch):
    """The same spec run with workers started and with workers forked: the same weights, bit for
    bit, and the forked workers skipped the framework's import."""
    monkeypatch.delenv(forkserver.FORKSERVER_ENV, raising=False)
    args = [
        "run",
        "--backend",
        backend,
        "--config",
        "configs/mnist_mlp.yaml",
        "--world-size",
        "2",
        "--set",
        "train.max_steps=3",
        "--set",
        "train.epochs=null",
        "--set",
        "data.test_limit=100",
        "--set",
        "logging.tensorboard=false",
    ]
    cold = cli(*args, "--out", str(tmp_path / "cold"))
    monkeypatch.setenv(forkserver.FORKSERVER_ENV, str(tmp_path / "servers"))
    warm = cli(*args, "--out", str(tmp_path / "warm"))
    assert cold.returncode == 0 and warm.returncode == 0, cold.stderr + warm.stderr
    a = np.load(tmp_path / "cold" / "weights_final.npz")
    b = np.load(tmp_path / "warm" / "weights_final.npz")
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    started = json.loads((tmp_path / "cold" / "summary.json").read_text())["startup"]
    forked = json.loads((tmp_path / "warm" / "summary.json").read_text())["startup"]
    assert forked["imports_s"] < started["imports_s"] / 5, (started, forked)
    assert list((tmp_path / "servers").glob("*.sock")), "no server was used"
    assert "was imported before" not in warm.stderr


@pytest.mark.parametrize("warm", [True, False], ids=["forked", "started"])
def test_a_tool_run_captures_its_output_and_times_out_alike(warm, tmp_path, monkeypatch):
    """forkserver.run, as the pair description, the locator's probes and export use it: the same
    result forked or started."""
    if warm:
        monkeypatch.setenv(forkserver.FORKSERVER_ENV, str(tmp_path / "servers"))
    else:
        monkeypatch.delenv(forkserver.FORKSERVER_ENV, raising=False)
    how = forkserver.Warm(("json",), {})
    done = forkserver.run(MODULE, [str(tmp_path / "a.json"), "3"], env=_env(), warm=how)
    assert (done.returncode, done.stdout, done.stderr) == (3, "", "probe 3\n")
    # the interpreter's teardown runs in a forked worker too (TF's cluster tasks leave together in
    # it: a task that skipped it left a peer still fetching its part of the last collective)
    done = forkserver.run(MODULE, [str(tmp_path / "t.json"), "teardown"], env=_env(), warm=how)
    assert (done.returncode, done.stderr) == (5, "probe teardown\nexit handler ran\n")
    with pytest.raises(subprocess.TimeoutExpired):
        forkserver.run(MODULE, [str(tmp_path / "b.json"), "sleep"], env=_env(), warm=how, timeout=3)
    pid = json.loads((tmp_path / "b.json").read_text())["pid"]
    assert not _alive(pid)  # killed, not left sleeping
    assert bool(list(tmp_path.glob("servers/*.sock"))) is warm


def test_a_folder_that_cannot_hold_servers_is_one_error(tmp_path, monkeypatch):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    monkeypatch.setenv(forkserver.FORKSERVER_ENV, str(not_a_folder / "servers"))
    with pytest.raises(UserError, match="DUALTRAIN_FORKSERVER must be a folder this process can"):
        forkserver.run(MODULE, ["x", "0"], env=_env(), warm=forkserver.Warm(("json",), {}))


@pytest.mark.parametrize("warm", [True, False], ids=["forked", "started"])
def test_a_program_gets_its_directory_and_ctrl_c_as_a_started_one(warm, tmp_path):
    """A program run through forkserver.popen with ``interrupt`` (the suite's CLI runs and test
    scripts: testkit.cli.run_cli, testkit.tf_runs.run_python) gets the working directory asked for
    and Ctrl-C as KeyboardInterrupt, forked or started; a run's worker ignores Ctrl-C, which its
    launcher handles."""
    env = {k: v for k, v in _env().items() if k != forkserver.FORKSERVER_ENV}
    if warm:
        env[forkserver.FORKSERVER_ENV] = str(tmp_path / "servers")
    work = tmp_path / "work"
    work.mkdir()
    how = forkserver.Warm(("json",), {})

    def start(out: str, interrupt: bool) -> subprocess.Popen | forkserver.Forked:
        args = [str(tmp_path / out), "sleep"]
        return forkserver.popen(MODULE, args, env=env, warm=how, stderr=subprocess.PIPE,
                                text=True, cwd=str(work), interrupt=interrupt)  # fmt: skip

    proc = start("a.json", True)
    _wait_for(tmp_path / "a.json")
    assert json.loads((tmp_path / "a.json").read_text())["cwd"] == str(work)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    # the interpreter's own end for an uncaught KeyboardInterrupt: its teardown, then SIGINT
    assert proc.returncode == -signal.SIGINT and "KeyboardInterrupt" in err, (proc.returncode, err)
    assert bool(list(tmp_path.glob("servers/*.sock"))) is warm
    if warm:
        worker = start("b.json", False)
        _wait_for(tmp_path / "b.json")
        worker.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert worker.poll() is None  # ignored
        worker.terminate()
        assert worker.wait(timeout=30) == -signal.SIGTERM

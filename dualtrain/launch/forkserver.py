"""Warm workers: fork a run's workers from a process that has imported their framework already
(opt-in: ``DUALTRAIN_FORKSERVER=DIR``; framework-free; docs/architecture.md, Process model).

A worker's start is mostly its framework's import (bench/bench_startup.py). With
DUALTRAIN_FORKSERVER set to a folder its caller owns, the local launcher has each worker forked by a
server in that folder instead of starting ``python -m MODULE`` itself.

* One server per backend and **import environment**: a worker's environment less what is read only
  after the import (the launcher's per-worker variables, ``DUALTRAIN_*``, an external launcher's
  cluster description: ``READ_AT_START``), plus what the backend
  sets before importing its framework (preimport_env), so a framework reads at import what a fresh
  process would. The server never runs framework code: no thread pool, device or TF context exists
  when it forks.
* A forked worker gets the launcher's stdio (or pipes), the descriptors it passes, its working
  directory and its whole environment, and runs the module as ``python -m`` would (interpreter
  teardown included, unless the module ends with ``os._exit``); the launcher watches it through
  :class:`Forked` (Popen-like; the server reports the exit status). It dies with its launcher (the
  server kills it when the connection closes) and with its server.
* A server logs to ``DIR/NAME.log``; it exits when its socket file is removed or after ``IDLE_S``.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import fcntl
import gc
import hashlib
import importlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from dualtrain.errors import UserError
from dualtrain.launch.forked import Forked

FORKSERVER_ENV = "DUALTRAIN_FORKSERVER"
"""A folder: when set, the local launcher forks workers from warm servers kept in it."""

READ_AT_START = frozenset(
    {"TF_CONFIG", "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE",
     "LOCAL_WORLD_SIZE", "PYTEST_CURRENT_TEST"}
)  # fmt: skip
"""Variables read when a worker makes its cluster (TF's cluster resolver, torch's process group),
never at the framework's import, so one server serves every task of a TF_CONFIG cluster; and
pytest's name of the running test."""

IDLE_S = 600.0
"""A server with no worker for this long exits."""

_MAX_FDS = 8

IMPORTED_UNDER: dict[str, str] | None = None
"""In a forked worker: the environment its server imported the framework under."""


def imported_with(env: dict[str, str]) -> bool:
    """Whether this process is a forked worker whose framework was imported with ``env`` set."""
    return IMPORTED_UNDER is not None and all(IMPORTED_UNDER.get(k) == v for k, v in env.items())


@dataclass(frozen=True)
class Warm:
    """How a backend's workers can be forked warm (the launcher's ``run_workers``, when
    DUALTRAIN_FORKSERVER is set): the modules its server imports, and what its worker sets in the
    environment before importing the framework."""

    preload: tuple[str, ...]
    preimport: dict[str, str]


def import_environment(
    env: dict[str, str], per_worker: set[str], preimport: dict[str, str], cwd: str | None = None
) -> dict[str, str]:
    """The part of a worker's environment its framework can read at import (see the module's
    docstring), with what the backend sets itself before the import. PYTHONPATH as the
    interpreter's sys.path takes it (site.removeduppaths): each entry absolute (an empty one is
    the worker's directory, ``cwd``), the first of duplicates kept; so the same folders, written
    as the CLI, the launcher and the tools each prepend the checkout, share a server."""
    out = {
        k: v
        for k, v in env.items()
        if k not in per_worker and not k.startswith("DUALTRAIN_") and k != "PYTHONPATH"
        and k not in READ_AT_START
    }  # fmt: skip
    if "PYTHONPATH" in env:
        here = cwd or os.getcwd()
        folders = (os.path.abspath(os.path.join(here, p)) for p in env["PYTHONPATH"].split(":"))
        out["PYTHONPATH"] = ":".join(dict.fromkeys(folders))
    return out | {k: v for k, v in preimport.items() if k not in env}


def popen(
    module: str,
    args: list[str],
    *,
    env: dict[str, str],
    warm: Warm,
    stdout: int | None = None,
    stderr: int | None = None,
    text: bool = False,
    cwd: str | None = None,
    interrupt: bool = False,
) -> subprocess.Popen | Forked:
    """``python -m module *args``: forked warm when ``env`` (the child's environment) sets
    DUALTRAIN_FORKSERVER, else started as a fresh process. ``stdout``/``stderr``: None (this
    process's), ``subprocess.PIPE`` or ``subprocess.DEVNULL``; ``cwd``: its working directory (this
    process's); ``interrupt``: Ctrl-C raises KeyboardInterrupt in it, as in a program a user
    starts, not ignored as in a run's worker (whose launcher handles it)."""
    folder = env.get(FORKSERVER_ENV, "")
    if not folder:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args],
            env=env,
            stdout=stdout,
            stderr=stderr,
            text=text,
            cwd=cwd,
            # started from a process that ignores SIGINT (a background job of a non-interactive
            # shell), the child would inherit it ignored and Python would leave it so
            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
            if interrupt
            else None,
        )
    key = import_environment(env, set(), warm.preimport, cwd)
    return spawn(
        folder,
        module,
        args,
        env,
        key=key,
        preload=warm.preload,
        stdout=stdout,
        stderr=stderr,
        text=text,
        cwd=cwd,
        interrupt=interrupt,
    )


def run(
    module: str,
    args: list[str],
    *,
    env: dict[str, str],
    warm: Warm,
    timeout: float | None = None,
    cwd: str | None = None,
    interrupt: bool = False,
) -> subprocess.CompletedProcess:
    """``subprocess.run([python, -m, module, *args], capture_output=True, text=True)`` as
    ``popen`` starts it: forked warm where ``env`` sets DUALTRAIN_FORKSERVER."""
    proc = popen(
        module,
        args,
        env=env,
        warm=warm,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        interrupt=interrupt,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.wait(), out, err)


def spawn(
    folder: str,
    module: str,
    args: list[str],
    env: dict[str, str],
    *,
    key: dict[str, str],
    preload: tuple[str, ...],
    stdout: int | None = None,
    stderr: int | None = None,
    text: bool = False,
    pass_fds: tuple[int, ...] = (),
    cwd: str | None = None,
    interrupt: bool = False,
) -> Forked:
    """``python -m module *args`` forked by the server for ``key`` and ``preload`` (started in
    ``folder`` on first use), with ``env`` as its environment and stdout/stderr as ``popen``'s."""
    path = _server(Path(folder), module, key, preload)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with _short(path) as address:
        conn.connect(address)
    ends: dict[int, int] = {}  # the worker's end of each pipe or of /dev/null, by its descriptor
    pipes = {}
    for target, how in ((1, stdout), (2, stderr)):
        if how == subprocess.PIPE:
            read, ends[target] = os.pipe()
            pipes[target] = os.fdopen(read, "rb")
        elif how == subprocess.DEVNULL:
            ends[target] = os.open(os.devnull, os.O_WRONLY)
    fds = [0, ends.get(1, 1), ends.get(2, 2), *pass_fds]
    header = {
        "module": module,
        "args": args,
        "env": env,
        "cwd": cwd or os.getcwd(),
        "fds": pass_fds,
        "interrupt": interrupt,
    }
    try:
        conn.sendmsg(
            [json.dumps(header).encode() + b"\n"],
            [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))],
        )
    finally:
        for fd in ends.values():
            os.close(fd)
    pid = int(_line(conn))
    return Forked(conn, pid, [sys.executable, "-m", module, *args], pipes, text)


@contextlib.contextmanager
def _short(path: Path):
    """``path`` as a socket address short enough for AF_UNIX (108 bytes; a test's temporary
    folder can be longer): through a descriptor of its folder, /proc/self/fd/N/NAME."""
    folder = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{folder}/{path.name}"
    finally:
        os.close(folder)


def _line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(64)
        if not chunk:
            raise OSError("the fork server closed the connection")
        data += chunk
    return data


def _server(folder: Path, module: str, key: dict[str, str], preload: tuple[str, ...]) -> Path:
    """The socket of the server for ``key``; started (and waited for) if not running."""
    digest = hashlib.sha256(json.dumps([sorted(key.items()), preload]).encode()).hexdigest()[:16]
    name = f"{(preload or ('python',))[0].rsplit('.', 1)[-1]}-{digest}"  # not the module's:
    path = folder / f"{name}.sock"  # a backend's workers and tools share their server
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / f".{name}.lock", "w")  # noqa: SIM115 (closed by the with below)
    except OSError as exc:
        raise UserError(
            f"{FORKSERVER_ENV} must be a folder this process can write ({exc.strerror}). "
            f"Received: {str(folder)!r}"
        ) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return path
        with open(folder / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-c", _SERVE, str(path), *preload],
                env=key,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # no Ctrl-C of the launcher's terminal reaches it
            )
        while not path.exists():
            if proc.poll() is not None:
                raise UserError(f"the fork server for {module} did not start: {folder / name}.log")
            time.sleep(0.02)
    return path


def serve(path: Path, preload: list[str]) -> None:  # pragma: no cover - the server process
    """The server: import ``preload``, then fork a worker per request until told to stop."""

    for name in preload:
        importlib.import_module(name)
    gc.collect()
    gc.freeze()  # the imported modules' objects stay shared with every worker, untouched
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    with _short(tmp) as address:
        listener.bind(address)
    listener.listen(16)
    os.rename(tmp, path)  # the socket appears whole: a client that sees it can connect
    workers: dict[int, socket.socket] = {}
    last = time.monotonic()
    while path.exists() and (workers or time.monotonic() - last < IDLE_S):
        wait = 0.01 if workers else 0.5  # a worker's exit status is reaped within 10 ms
        ready, _, _ = select.select([listener, *workers.values()], [], [], wait)
        for sock in ready:
            if sock is listener:
                conn, _ = listener.accept()
                pid = _fork(conn, listener, workers)
                workers[pid] = conn
            else:  # the launcher's end closed while its worker runs: the launcher is gone
                pid = next(p for p, c in workers.items() if c is sock)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        _reap(workers)
        last = time.monotonic() if workers else last
    listener.close()
    path.unlink(missing_ok=True)


def _reap(workers: dict[int, socket.socket]) -> None:  # pragma: no cover - the server process
    while workers:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        conn = workers.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"status": status}).encode())
            conn.close()


def _fork(conn, listener, workers) -> int:  # pragma: no cover - the server process
    msg, ancdata, _, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(_MAX_FDS * 4))
    while not msg.endswith(b"\n"):
        msg += conn.recv(1 << 20)
    fds = array.array("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    header = json.loads(msg)
    pid = os.fork()
    if pid == 0:
        try:
            listener.close()
            for other in workers.values():
                other.close()
            conn.close()
            _become(header, list(fds))
        except (SystemExit, KeyboardInterrupt):  # out of serve(): the interpreter ends as
            raise  # `python -m`'s does, its teardown included (TF's cluster tasks leave together
            # in it), and an uncaught Ctrl-C by SIGINT after it
        except BaseException:
            traceback.print_exc()
        os._exit(1)
    for fd in fds:
        os.close(fd)
    conn.sendall(f"{pid}\n".encode())
    return pid


def _become(header: dict, fds: list[int]) -> NoReturn:  # pragma: no cover - a forked worker
    """In the forked child: the launcher's descriptors, directory, environment and signals, then
    the module as ``python -m`` runs it; ends in SystemExit (or the module's own ``os._exit``)."""

    targets = [0, 1, 2, *header["fds"]]
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 1000) for fd in fds]
    for fd in fds:
        os.close(fd)
    for src, dst in zip(high, targets, strict=True):
        os.dup2(src, dst)
        os.close(src)
    # a run's worker ignores Ctrl-C as dualtrain.launch.local._worker_signals; a program does not
    on_int = signal.default_int_handler if header["interrupt"] else signal.SIG_IGN
    signal.signal(signal.SIGINT, on_int)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the server
    os.chdir(header["cwd"])
    global IMPORTED_UNDER
    IMPORTED_UNDER = dict(os.environ)
    os.environ.clear()
    os.environ.update(header["env"])
    sys.argv = [header["module"], *header["args"]]
    try:
        runpy.run_module(header["module"], run_name="__main__", alter_sys=True)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException:
        traceback.print_exc()
        raise SystemExit(1) from None
    raise SystemExit(0)


_SERVE = (
    "import sys; from pathlib import Path; from dualtrain.launch.forkserver import serve; "
    "serve(Path(sys.argv[1]), sys.argv[2:])"
)

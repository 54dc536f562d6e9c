"""Launch and watch local worker processes (framework-free).

Each backend's workers run as ``python -m dualtrain.backends.<name> RUN_DIR`` with the standard
environment of their framework (torchrun's RANK/WORLD_SIZE/MASTER_ADDR..., TF's TF_CONFIG). The
launcher polls them: if one exits non-zero or is killed, the others are stopped and the run fails
with a message naming that worker. It never waits forever: once one worker has finished cleanly, the
others get ``grace_s`` seconds to finish too.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from dualtrain.errors import RunFailed, UserError
from dualtrain.launch import forkserver
from dualtrain.launch.child import worker_env
from dualtrain.launch.netif import listen_address
from dualtrain.runtime.clock import SPAWNED_ENV


@dataclass
class Worker:
    rank: int
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | forkserver.Forked | None = None
    role: str | None = None
    """A process that is not a replica (a parameter server, a TF server task): named so in
    launch.json and in the launcher's messages, and stopped once every replica has finished
    cleanly (a tf.distribute.Server never returns by itself)."""
    listen: tuple[str, int] | None = None
    """The rendezvous address (host, port) this worker hosts. The launcher opens the listening
    socket before any worker starts and hands it to this worker (its descriptor in
    :data:`LISTEN_FD_ENV`): a peer that gets there first is queued by the kernel and connects at
    once, instead of being refused and retrying with a back-off that overshot rank 0's start by
    0.3-0.7 s (measured with torch's TCPStore)."""

    def name(self, unit: str) -> str:
        return f"{unit} {self.rank}" if self.role is None else f"{self.role} ({unit} {self.rank})"


def _started(w: Worker) -> subprocess.Popen | forkserver.Forked:
    """``w``'s process, once :func:`run_workers` has started every worker."""
    assert w.proc is not None
    return w.proc


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def free_ports(n: int, addr: str = "127.0.0.1") -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((addr, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


LISTEN_FD_ENV = "DUALTRAIN_LISTEN_FD"
"""The descriptor of the listening socket a worker was handed (Worker.listen)."""


def open_listener(addr: str, port: int) -> socket.socket:
    """A socket listening on ``addr``:``port`` (only on the address named, where it is this
    host's: dualtrain.launch.netif.listen_address), inheritable, for Worker.listen."""
    bind = listen_address(addr)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bind if bind is not None else "", port))
    except OSError as exc:
        sock.close()
        raise UserError(
            f"the rendezvous cannot listen on {bind or '*'}:{port} ({exc.strerror}); choose "
            f"another distribution.master_port / MASTER_PORT. Received: MASTER_ADDR={addr} "
            f"MASTER_PORT={port}"
        ) from None
    sock.listen(16)
    sock.set_inheritable(True)
    return sock


SHOW_ALL_LOGS = "DUALTRAIN_WORKER_LOGS"
"""Set to ``all`` to see every line the workers write to stderr (no ``stderr_noise`` filtering)."""


def _forward_stderr(stream, noise: re.Pattern[bytes]) -> None:
    """Copy a worker's stderr to ours line by line, leaving out the lines ``noise`` matches."""
    out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
    for line in iter(stream.readline, b""):
        if noise.match(line):
            continue
        if not line.endswith(b"\n"):  # a worker's last words: keep them off the next worker's line
            line += b"\n"
        if out is not None:
            out.write(line)
            out.flush()
        else:
            sys.stderr.write(line.decode(errors="replace"))
    stream.close()


class Terminated(KeyboardInterrupt):
    """SIGTERM reached the launcher (``kill PID``, a scheduler cancelling the job): the workers are
    stopped as on Ctrl-C. The CLI exits with 128 + the signal number."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum, _frame):
    raise Terminated(signum)


def _worker_signals() -> None:  # pragma: no cover - runs in the child between fork and exec
    """How a worker this launcher starts reacts to signals.

    * Linux: it gets SIGKILL if the launching thread dies (kill -9, the OOM killer), so no worker
      outlives its launcher. SIGKILL, not SIGTERM: TF's multi-worker runtime installs a SIGTERM
      handler of its own (its preemption notifier) that records the signal and trains on, so a
      SIGTERM left TF multi_worker workers training to the end, unattended. A no-op where prctl is
      unavailable.
    * SIGINT is ignored: Ctrl-C reaches the whole foreground process group, and the launcher, which
      gets it too, stops its workers itself (SIGTERM, then SIGKILL after a timeout). A worker that
      reacted on its own would print a KeyboardInterrupt traceback from inside its framework
      (~90 lines from TF)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_workers(
    module: str,
    args: list[str],
    workers: list[Worker],
    *,
    unit: str = "rank",
    grace_s: float = 120.0,
    run_dir: Path | None = None,
    poll_s: float = 0.02,
    stderr_noise: re.Pattern[bytes] | None = None,
    warm: forkserver.Warm | None = None,
) -> None:
    """Start ``python -m module *args`` once per worker and wait for all of them (forked by a warm
    server when DUALTRAIN_FORKSERVER is set and ``warm`` says how: dualtrain.launch.forkserver).

    ``stderr_noise``: the workers' stderr passes through this process, without the lines it matches
    (a framework's start-up chatter; DUALTRAIN_WORKER_LOGS=all shows them). Everything else,
    warnings, errors and tracebacks included, is forwarded unchanged.

    In the main thread, SIGTERM to this process stops the workers too (raises :class:`Terminated`),
    and on Linux each worker is tied to this thread's life (``PR_SET_PDEATHSIG``); workers ignore
    SIGINT, which this process handles for them (:func:`_worker_signals`). A signal that arrives
    when every worker has already finished cleanly does not fail the run.

    Raises:
        RunFailed: a worker exited non-zero, was killed, or outlived the others by ``grace_s``.
        Terminated: this process got SIGTERM; the workers were stopped.
    """
    if os.environ.get(SHOW_ALL_LOGS, "").lower() == "all":
        stderr_noise = None
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if main else None
    forwarders: list[threading.Thread] = []
    listeners = {id(w): open_listener(*w.listen) for w in workers if w.listen is not None}
    try:
        _start_processes(module, args, workers, listeners, stderr_noise, main, warm)
        for sock in listeners.values():  # the workers hold them now
            sock.close()
        listeners = {}
        if stderr_noise is not None:
            _start_forwarders(workers, stderr_noise, unit, forwarders)
        if run_dir is not None:
            _write_launch_json(run_dir, module, workers, unit)
        _watch(workers, unit, grace_s, poll_s)
    except (
        BaseException
    ) as exc:  # Ctrl-C, Terminated, or a launcher error: no worker is left running
        _stop([w for w in workers if w.proc is not None and w.proc.poll() is None])
        if (
            isinstance(exc, KeyboardInterrupt)
            and workers
            and all(w.proc is not None and w.proc.returncode == 0 for w in workers)
        ):
            return  # every worker had finished its run when the signal came: the run is complete
        raise
    finally:
        for sock in listeners.values():  # a worker that could not start: close the launcher's copy
            sock.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        for t in forwarders:  # the workers are gone: their last lines are in the pipes
            t.join(timeout=5.0)


def _start_processes(
    module: str,
    args: list[str],
    workers: list[Worker],
    listeners: dict[int, socket.socket],
    stderr_noise: re.Pattern[bytes] | None,
    main: bool,
    warm: forkserver.Warm | None,
) -> None:
    """Start every worker's process (``listeners``: the rendezvous sockets handed to their
    workers, by ``id(worker)``)."""
    folder = os.environ.get(forkserver.FORKSERVER_ENV, "")
    for w in workers:
        sock = listeners.get(id(w))
        env = {**w.env} if sock is None else {**w.env, LISTEN_FD_ENV: str(sock.fileno())}
        env[SPAWNED_ENV] = f"{time.time():.6f}"  # the worker's start-up clock (summary.json)
        if folder and warm is not None:
            full = worker_env(env)
            w.proc = forkserver.spawn(
                folder,
                module,
                args,
                full,
                key=forkserver.import_environment(full, set(env), warm.preimport),
                preload=warm.preload,
                stderr=subprocess.PIPE if stderr_noise is not None else None,
                pass_fds=() if sock is None else (sock.fileno(),),
            )
            continue
        # preexec_fn runs before any forwarder thread exists (they start below): no fork with
        # another thread holding a lock.
        w.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            env=worker_env(env),
            stderr=subprocess.PIPE if stderr_noise else None,
            preexec_fn=_worker_signals if main else None,
            pass_fds=() if sock is None else (sock.fileno(),),
        )


def _start_forwarders(
    workers: list[Worker],
    stderr_noise: re.Pattern[bytes],
    unit: str,
    forwarders: list[threading.Thread],
) -> None:
    """A thread per worker copying its stderr to ours (each in ``forwarders`` once started)."""
    for w in workers:
        t = threading.Thread(
            target=_forward_stderr,
            args=(_started(w).stderr, stderr_noise),
            name=f"stderr-{unit}{w.rank}",
            daemon=True,
        )
        t.start()
        forwarders.append(t)


def _write_launch_json(run_dir: Path, module: str, workers: list[Worker], unit: str) -> None:
    """RUN_DIR/launch.json: the module and every worker's pid (and role)."""
    (Path(run_dir) / "launch.json").write_text(
        json.dumps(
            {
                "module": module,
                "workers": [
                    {unit: w.rank, "pid": _started(w).pid} | ({"role": w.role} if w.role else {})
                    for w in workers
                ],
            },
            indent=2,
        )
        + "\n"
    )


def _watch(workers: list[Worker], unit: str, grace_s: float, poll_s: float) -> None:
    """Poll the started workers until every replica has finished cleanly; on a failure stop the
    others and raise :class:`RunFailed` naming the cause (or the stragglers after ``grace_s``)."""
    first_done: float | None = None
    while True:
        running = []
        for w in workers:
            code = _started(w).poll()
            if code is None:
                running.append(w)
            elif code != 0:
                w, code = _root_cause(workers, w, code)
                others = [o for o in workers if o is not w and _started(o).poll() is None]
                _stop(others)
                stopped = f"; stopped the other {len(others)} {unit}(s)" if others else ""
                raise RunFailed(
                    f"{w.name(unit)} (pid {_started(w).pid}) {describe_exit(code)}{stopped}",
                    rank=w.rank,
                    code=code,
                )
        if not running:
            return
        if all(w.role is not None for w in running):
            # what is left serves the others (tf.distribute.Servers, a parameter server):
            # everything it served finished cleanly, so it is stopped, and the run is done
            _stop(running)
            return
        if len(running) < len(workers):
            first_done = first_done or time.monotonic()
            if time.monotonic() - first_done > grace_s:
                _dump_stacks(running)
                _stop(running)
                names = ", ".join(str(w.rank) for w in running)
                raise RunFailed(
                    f"{unit}(s) {names} did not finish within {grace_s:.0f}s of the "
                    f"others; stopped them"
                )
        time.sleep(poll_s)


def _root_cause(
    workers: list[Worker], failed: Worker, code: int, wait_s: float = 1.0
) -> tuple[Worker, int]:
    """The worker whose failure to report. A worker that exits with an error may only be reacting
    to another one's death (its collective lost that peer: dualtrain.launch.peers); a worker killed
    by a signal is the cause. So after an error exit, wait up to ``wait_s`` for another worker to
    turn out killed, and name that one instead."""
    if code < 0:
        return failed, code
    deadline = time.monotonic() + wait_s
    while True:
        for w in workers:
            other = _started(w).poll() if w is not failed else None
            if other is not None and other < 0:
                return w, other
        if time.monotonic() >= deadline or all(_started(w).poll() is not None for w in workers):
            return failed, code
        time.sleep(0.02)


def _dump_stacks(workers: list[Worker], wait_s: float = 2.0) -> None:
    """Ask stuck workers where they are: each worker registers faulthandler on SIGUSR1
    (dualtrain.runtime.entry.worker_main), which prints every thread's Python stack to its
    stderr."""
    sig = getattr(signal, "SIGUSR1", None)
    if sig is None:
        return
    for w in workers:
        if w.proc is not None and w.proc.poll() is None:
            print(
                f"dualtrain: {w.proc.pid} is stuck; its stacks follow on stderr",
                file=sys.stderr,
                flush=True,
            )
            w.proc.send_signal(sig)
    time.sleep(wait_s)


def _stop(workers: list[Worker], timeout_s: float = 5.0) -> None:
    for w in workers:
        if w.proc is not None and w.proc.poll() is None:
            w.proc.terminate()
    deadline = time.monotonic() + timeout_s
    for w in workers:
        if w.proc is None:
            continue
        try:
            w.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait()

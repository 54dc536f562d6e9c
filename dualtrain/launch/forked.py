"""A worker forked by a warm server (dualtrain.launch.forkserver), seen from its launcher: what
dualtrain.launch.local and the tools' callers use of ``subprocess.Popen``."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import time


class Forked:
    """A worker forked by a server: what dualtrain.launch.local uses of ``subprocess.Popen``."""

    def __init__(self, conn: socket.socket, pid: int, args: list[str], pipes: dict, text: bool):
        self.conn, self.pid, self.args, self.text = conn, pid, args, text
        self.stdout, self.stderr = pipes.get(1), pipes.get(2)
        self.returncode: int | None = None

    def _take(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            self.conn.settimeout(timeout)
            try:
                data = self.conn.recv(64)
            except (BlockingIOError, TimeoutError):
                return None
            except OSError:
                data = b""
            # the server reports the waitpid status; without one it is gone, and so is the worker
            status = json.loads(data)["status"] if data else None
            self.returncode = (
                -signal.SIGKILL if status is None else os.waitstatus_to_exitcode(status)
            )
            self.conn.close()
        return self.returncode

    def poll(self) -> int | None:
        return self._take(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._take(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def communicate(self, timeout: float | None = None) -> tuple:
        """What the worker wrote to its pipes, once it has exited (as ``Popen.communicate``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        streams = [f for f in (self.stdout, self.stderr) if f is not None]
        left = {f.fileno(): f for f in streams}
        got: dict[int, list[bytes]] = {fd: [] for fd in left}
        names = {id(f): fd for fd, f in left.items()}
        while left:
            wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready, _, _ = select.select(list(left), [], [], wait)
            if not ready:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    got[fd].append(chunk)
                else:
                    left.pop(fd).close()
        self.wait(None if deadline is None else max(deadline - time.monotonic(), 0.0))
        out = [
            None if f is None else b"".join(got[names[id(f)]]) for f in (self.stdout, self.stderr)
        ]
        return tuple(b.decode(errors="replace") if self.text and b is not None else b for b in out)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

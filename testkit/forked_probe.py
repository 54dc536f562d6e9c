"""A worker stand-in for the fork server's tests (tests/integration/test_forkserver.py):
``python -m testkit.forked_probe OUT MODE`` writes what it was given (working directory, a variable,
its pid and arguments, whether its LISTEN descriptor is a listening socket) to OUT as JSON, says a
line on stderr, then exits with MODE's code, or sleeps (MODE ``sleep``), or exits with code 5
through an exit handler that says a line (MODE ``teardown``: the interpreter's teardown ran)."""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    out, mode = argv
    listening = None
    fd = os.environ.get("PROBE_LISTEN_FD")
    if fd:
        with socket.socket(fileno=os.dup(int(fd))) as sock:
            listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
    info = {
        "cwd": os.getcwd(),
        "probe": os.environ.get("PROBE"),
        "pid": os.getpid(),
        "argv": sys.argv[1:],
        "listening": listening,
        "name": __name__,
    }
    Path(out).write_text(json.dumps(info))
    print(f"probe {mode}", file=sys.stderr, flush=True)
    if mode == "sleep":
        time.sleep(120)
    if mode == "teardown":
        atexit.register(print, "exit handler ran", file=sys.stderr, flush=True)
        return 5
    return int(mode) if mode.isdigit() else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

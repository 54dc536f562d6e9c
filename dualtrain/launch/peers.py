"""Name the lost peer when a collective fails (framework-free).

A multi-host run that loses one host fails on the others inside a collective, with an error text
only the framework's authors can read ("Connection closed by peer [10.0.0.2]:41235", "Socket closed
... /job:worker/replica:0/task:1"). Every worker publishes who it is when the run starts (rank, host
name, address); when a collective fails, :func:`lost_peer` matches the error against that table and
returns one line that says which rank on which host was lost, after which step, and why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dualtrain.errors import RunFailed


@dataclass(frozen=True)
class Peer:
    rank: int
    host: str
    address: str
    markers: tuple[str, ...] = ()
    """Other strings that identify this peer in a framework's error text (e.g. TF's task name)."""

    def describe(self) -> str:
        host = "" if self.host == self.address else f", host {self.host}"
        return f"rank {self.rank} ({self.address}{host})"


_TIMEOUT = re.compile(r"timed? ?out|deadline exceeded|timeout", re.IGNORECASE)
_COMM = re.compile(
    r"gloo|nccl|connect|socket|timed? ?out|timeout|deadline|peer|store|closed|reset|"
    r"broken pipe|collective|unavailable|recvmsg|sendmsg|grpc",
    re.IGNORECASE,
)
_NOISE = re.compile(
    r"\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*"  # C++ source locations
    r"|\{\{function_node [^}]*\}\}\s*"  # TF's function names
    r"|Got the following error when running the callback: |RuntimeError: "
)


def is_comm_error(text: str) -> bool:
    """Does a framework's error text read as a failed connection, collective or rendezvous (as
    opposed to a bug in the step, which keeps its traceback)?"""
    return bool(_COMM.search(text))


def _reason(text: str, limit: int = 200) -> str:
    """The framework's own words, on one line: its first line without C++ locations and wrappers,
    cut at the end of its first sentence."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = _NOISE.sub("", lines[0] if lines else "no message").strip()
    line = re.split(r"(?<=[a-z0-9\]])\. (?=[A-Z])", line, maxsplit=1)[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."


def mentioned(text: str, peers: list[Peer], me: int) -> list[Peer]:
    """The peers (other than ``me``) that ``text`` names by address (as ``[addr]:port`` or
    ``addr:port``) or by one of their markers."""
    found = []
    for p in peers:
        if p.rank == me:
            continue
        if re.search(rf"(?<![\d.]){re.escape(p.address)}(?![\d])", text) or any(
            m in text for m in p.markers
        ):
            found.append(p)
    return found


def lost_peer(
    backend: str, rank: int, text: str, peers: list[Peer], *, timeout_s: float, step: int | None
) -> RunFailed:
    """One line for a collective that failed on ``rank`` with error ``text``."""
    at = f" after step {step}" if step else " before the first step"
    who = mentioned(text, peers, rank)
    reason = _reason(text)
    if who:
        names = ", ".join(p.describe() for p in who)
        return RunFailed(
            f"{backend} rank {rank} lost its peer {names}{at}: {reason}",
            rank=who[0].rank,
            hard_exit=True,
        )
    if _TIMEOUT.search(text):
        others = [p for p in peers if p.rank != rank]
        whom = f"its peer {others[0].describe()}" if len(others) == 1 else "a peer"
        return RunFailed(
            f"{backend} rank {rank}: {whom} did not answer within "
            f"distribution.timeout_s={timeout_s:g}s{at} (lost host or network): "
            f"{reason}",
            rank=others[0].rank if len(others) == 1 else None,
            hard_exit=True,
        )
    return RunFailed(f"{backend} rank {rank}: a collective failed{at}: {reason}", hard_exit=True)

"""A run dualtrain launches listens on loopback only: the rendezvous store and gloo's pairs bind
127.0.0.1 (distribution.master_addr), never every interface (TCPStore's own default)."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit.cli import ROOT, cli_env, require

require("torch")
pytestmark = pytest.mark.skipif(
    not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc/net"
)


def _listening(pids: list[int]) -> list[str]:
    """host:port of every TCP socket in LISTEN state that one of ``pids`` holds."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] != "0A" or cols[9] not in inodes:  # 0A: LISTEN
                continue
            hexaddr, hexport = cols[1].split(":")
            raw = bytes.fromhex(hexaddr)
            # /proc prints the address as native-endian 32-bit words
            raw = b"".join(
                struct.pack("=I", int.from_bytes(raw[i : i + 4], "big"))
                for i in range(0, len(raw), 4)
            )
            found.append(f"{socket.inet_ntop(family, raw)}:{int(hexport, 16)}")
    return found


def test_a_local_run_listens_on_loopback_only(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dualtrain",
            "run",
            "--backend",
            "torch",
            "--config",
            str(ROOT / "configs/mnist_mlp.yaml"),
            "--world-size",
            "2",
            "--set",
            "train.epochs=3",
            "--set",
            "data.test_limit=500",
            "--out",
            str(out),
        ],
        env=cli_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        listening: list[str] = []
        while time.monotonic() < deadline and proc.poll() is None:
            metrics = out / "metrics.jsonl"
            if (out / "launch.json").is_file() and metrics.is_file() and metrics.stat().st_size:
                pids = [w["pid"] for w in json.loads((out / "launch.json").read_text())["workers"]]
                listening = _listening(pids)  # training is under way: every listener is open
                break
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait()
    assert listening, "found no listening socket of the workers (did the run start?)"
    # rank 0's rendezvous store, and each rank's gloo listener
    assert len(listening) >= 3, listening
    assert all(a.startswith("127.0.0.1:") for a in listening), listening

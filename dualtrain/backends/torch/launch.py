"""Worker planning for the torch backend (framework-free: the CLI process imports it)."""

from __future__ import annotations

import os

from dualtrain.launch import Worker, free_port
from dualtrain.spec import Experiment

ENV_KEYS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
UNIT = "rank"
MODULE = "dualtrain.backends.torch"
STDERR_NOISE = None
"""torch workers' stderr passes through unfiltered (see dualtrain.launch.run_workers)."""


def external() -> dict[str, int] | None:
    """torchrun / a cluster scheduler started us as one rank: its RANK, WORLD_SIZE and LOCAL_RANK."""
    if not all(k in os.environ for k in ENV_KEYS):
        return None
    return {"rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"]),
            "local_rank": int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))}


def workers(spec: Experiment) -> list[Worker]:
    d = spec.distribution
    port = d.master_port or free_port(d.master_addr)
    n = d.world_size
    base = {"WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": d.master_addr,
            "MASTER_PORT": str(port)}
    if d.master_addr.startswith("127.") and os.path.exists("/sys/class/net/lo"):
        base["GLOO_SOCKET_IFNAME"] = "lo"  # loopback run: never let gloo pick an external interface
    return [Worker(rank=r, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(n)]

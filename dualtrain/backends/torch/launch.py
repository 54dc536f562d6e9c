"""Worker planning for the torch backend (framework-free: the CLI process imports it)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from dualtrain.launch import cluster, slurm
from dualtrain.launch.child import require_gpu
from dualtrain.launch.local import Worker, free_ports
from dualtrain.spec import Experiment, Strategy

ENV_KEYS = cluster.TORCH_KEYS
UNIT = "rank"
MODULE = "dualtrain.backends.torch"
STDERR_NOISE = None
"""torch workers' stderr passes through unfiltered (see dualtrain.launch.local.run_workers)."""
PRELOAD = (
    "torch",
    "torch._dynamo",
    "dualtrain.backends.torch.worker",
    "dualtrain.backends.torch.tools",
)
"""What a warm server imports (dualtrain.launch.forkserver): torch, torch._dynamo (DDP's
constructor and the determinism settings import it), the worker's and the tools' modules."""
BASE_PREIMPORT: dict[str, str] = {}
"""Nothing is set before torch's import."""
ROLE_ENV = "DUALTRAIN_ROLE"
"""``parameter_server`` in the server process of distribution.strategy: parameter_server."""
PS_ENV = "DUALTRAIN_PS_INIT"
"""The RPC rendezvous (``tcp://ADDR:PORT``) the replicas and the parameter server meet at."""


def preimport_env(spec: Experiment) -> dict[str, str]:
    """A torch worker sets nothing in its environment before importing torch."""
    del spec
    return {}


def detect(env: Mapping[str, str] | None = None) -> cluster.Launcher | None:
    """Which external launcher started this process as one rank, if any (reads, changes nothing):
    torchrun's variables (torchrun, the Kubeflow PyTorchJob operator, a script) win; else a
    multi-task srun step (dualtrain.launch.cluster maps Slurm's variables to torchrun's); else
    None."""
    env = os.environ if env is None else env
    return cluster.torch_env_launcher(env) or slurm.slurm_launcher("torch", env)


def workers(spec: Experiment) -> list[Worker]:
    """The replicas (ranks 0..W-1); with distribution.strategy: parameter_server, the server too,
    last (rank W in the launcher's messages)."""
    d = spec.distribution
    server = d.strategy is Strategy.PARAMETER_SERVER
    if d.master_port:
        port, ps_port = d.master_port, d.master_port + 1
    else:
        port, ps_port = free_ports(2, d.master_addr)
    n = d.world_size
    base = {
        "WORLD_SIZE": str(n),
        "LOCAL_WORLD_SIZE": str(n),
        "MASTER_ADDR": d.master_addr,
        "MASTER_PORT": str(port),
    }
    if server:
        base[PS_ENV] = f"tcp://{d.master_addr}:{ps_port}"
    if d.master_addr.startswith("127.") and os.path.exists("/sys/class/net/lo"):
        base["GLOO_SOCKET_IFNAME"] = "lo"  # loopback run: never let gloo pick an external interface
    out = [
        Worker(
            rank=r,
            env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
            listen=(d.master_addr, port) if r == 0 else None,  # rank 0 hosts the TCPStore
        )
        for r in range(n)
    ]
    if server:
        out.append(
            Worker(rank=n, env={**base, ROLE_ENV: "parameter_server"}, role="parameter server")
        )
    return out


def check_devices(spec: Experiment) -> None:
    """A gpu run needs a GPU torch sees (dualtrain.launch.child.require_gpu)."""
    require_gpu(
        spec.distribution.device,
        "import torch; print(torch.cuda.device_count())",
        "torch sees no CUDA device",
    )

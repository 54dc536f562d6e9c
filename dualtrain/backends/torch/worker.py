"""One torch rank: read the torchrun environment, set up the process group and the engine, run the
shared TrainLoop. The chief (rank 0) writes the run directory; ``run_dir=None`` is a non-chief rank
started by an external torchrun."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dualtrain.backends.torch import kernels as torch_kernels
from dualtrain.backends.torch import ps
from dualtrain.backends.torch.cluster import leave_together
from dualtrain.backends.torch.distributed import (
    configure_determinism,
    init_distributed,
    select_device,
)
from dualtrain.backends.torch.engine import TorchEngine
from dualtrain.backends.torch.envinfo import backend_facts
from dualtrain.backends.torch.launch import ROLE_ENV
from dualtrain.core import kernels
from dualtrain.errors import UserError
from dualtrain.launch.netif import route_interface
from dualtrain.launch.peers import Peer, is_comm_error, lost_peer
from dualtrain.records.envinfo import cpu_flags
from dualtrain.runtime import clock
from dualtrain.runtime.start import Start, bind_cores, default_threads
from dualtrain.runtime.worker import Begun, Inputs, train_loop, worker_inputs
from dualtrain.spec import Experiment, Strategy


@dataclass(frozen=True)
class DistEnv:
    """This rank in torchrun's terms."""

    rank: int
    world: int
    local_rank: int
    local_world: int


def dist_env() -> DistEnv:
    missing = [
        k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ
    ]
    if missing:
        raise UserError(
            "a torch worker needs torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, "
            f"MASTER_PORT). Received: {', '.join(missing)} unset"
        )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return DistEnv(
        rank=rank,
        world=world,
        local_rank=int(os.environ.get("LOCAL_RANK", rank)),
        local_world=int(os.environ.get("LOCAL_WORLD_SIZE", world)),
    )


def run_worker(
    spec: Experiment,
    run_dir: str | Path | None,
    start: Start = Start(),  # noqa: B008 (Start is a frozen dataclass)
    *,
    destroy: bool = True,
) -> dict[str, Any]:
    """Train this rank from ``start``; return the summary (rank 0) or the same dict computed locally
    (others).

    ``destroy=False``: leave the process group as it is (the worker process exits right after)."""
    begun = Begun()  # the environment as given, before this worker sets anything (docs/env.md)
    if os.environ.get(ROLE_ENV) == "parameter_server":
        return run_parameter_server(spec, run_dir, start)
    server = spec.distribution.strategy is Strategy.PARAMETER_SERVER
    env = dist_env()
    check_world_size(spec, env)
    run_dir = Path(run_dir) if run_dir is not None else None
    threads, device = settings(spec, env)

    # Before the process group: a worker hook that stops a worker (a planted user error) then stops
    # every rank alike, as the checks above do, instead of leaving the others in a collective.
    inputs = worker_inputs(spec, run_dir, start, "torch")
    route = route_interface(os.environ["MASTER_ADDR"])  # (interface, address) towards rank 0's host
    ifname = choose_gloo_interface(device, env.rank, route)
    loop, peers = None, []
    # A process group that exists already is adopted, not created twice: Ray Train's TorchTrainer
    # calls init_process_group in every worker (with its TorchConfig's backend and timeout) before
    # the training function runs; its owner tears it down.
    adopted = dist.is_initialized()
    if adopted:
        check_adopted(device, env)
        destroy = False
    try:
        if not adopted:
            init_distributed(spec, device, env.rank, env.world)
        clock.mark("rendezvous")
        peers = exchange_peers(env.rank, env.world, route[1] if route else None)
        if server:  # the replicas' RPC group with the parameter server
            ps.init(env.rank, env.world, spec.distribution.timeout_s, server=False)
        engine = make_engine(spec, inputs, env, device, server)
        facts = worker_facts(spec, env, threads, device, adopted, ifname, server)
        loop = train_loop(
            spec,
            engine,
            inputs,
            run_dir,
            start,
            begun,
            chief=env.rank == 0,
            facts=facts,
            env={"torch": backend_facts(gpu_details=device.type == "cuda")},
        )
        summary = loop.run()
        # (On an exception there is no teardown: the process exits; a launcher stops the others.)
        leave_together(env.rank, env.world, spec.distribution.timeout_s)
        if server:
            ps.shutdown(f"rank {env.rank}")
    except RuntimeError as exc:  # torch.distributed's DistError is one
        if env.world == 1 or not (isinstance(exc, dist.DistError) or is_comm_error(str(exc))):
            raise
        raise lost_peer(
            "torch",
            env.rank,
            str(exc),
            peers,
            timeout_s=spec.distribution.timeout_s,
            step=loop.step if loop is not None else None,
        ) from None
    if destroy:
        dist.destroy_process_group()
    return summary


def make_engine(
    spec: Experiment, inputs: Inputs, env: DistEnv, device: torch.device, server: bool
) -> TorchEngine:
    """This replica's engine (``server``: its gradients go to the parameter server); a model
    pair's takes its layout (its dropout calls)."""
    return TorchEngine(
        spec,
        inputs.data,
        inputs.weights,
        rank=env.rank,
        world=env.world,
        device=device,
        server=server,
        layout=inputs.layout,
    )


def check_world_size(spec: Experiment, env: DistEnv) -> None:
    """The launcher's WORLD_SIZE must be the spec's distribution.world_size."""
    if env.world != spec.distribution.world_size:
        raise UserError(
            f"distribution.world_size must match WORLD_SIZE={env.world} from the "
            f"launcher. Received: {spec.distribution.world_size}"
        )


def settings(spec: Experiment, env: DistEnv) -> tuple[int, torch.device]:
    """torch set up for this rank (threads, determinism, the seed): (threads, device)."""
    threads = spec.distribution.threads_per_worker or default_threads(env.local_world)
    bind_cores(spec, env.local_rank, env.local_world, threads)  # before torch starts a thread
    torch.set_num_threads(threads)
    configure_determinism(spec.determinism)
    clock.mark("settings")
    torch.manual_seed(spec.seed)
    device = select_device(spec, env.local_rank)
    return threads, device


def worker_facts(
    spec: Experiment,
    env: DistEnv,
    threads: int,
    device: torch.device,
    adopted: bool,
    ifname: str | None,
    server: bool,
) -> dict[str, Any]:
    """This rank's facts for summary.json: threads, the process group, the device, oneDNN, the
    gloo interface, the parameter server, and on rank 0 what its CPU's kernels do in the run's
    precision."""
    facts = {
        "threads_per_worker": threads,
        "cpu_affinity": sorted(os.sched_getaffinity(0)),  # distribution.bind_cores, or taskset's
        "process_group": dist.get_backend(),
        "process_group_adopted": adopted,
        "torch_device": str(device),
        "torch_mkldnn": torch.backends.mkldnn.enabled,
        "gloo_interface": ifname,
        "parameter_server": "torch.distributed.rpc" if server else None,
    }
    if env.rank == 0:  # what this CPU's kernels do in the run's precision (summary.json)
        facts["kernels"] = kernels.for_run(
            spec.precision.dtype.value,
            torch_kernels.static_facts(cpu_flags()),
            torch_kernels.product,
        )
    return facts


def run_parameter_server(
    spec: Experiment, run_dir: str | Path | None, start: Start
) -> dict[str, Any]:
    """The server process of distribution.strategy: parameter_server (dualtrain.backends.torch.ps):
    the module, the optimizer and the loss scale, from the run's initial weights; it serves the
    replicas' steps until all of them have finished."""
    world = spec.distribution.world_size
    torch.set_num_threads(spec.distribution.threads_per_worker or default_threads(world))
    configure_determinism(spec.determinism)
    clock.mark("settings")
    torch.manual_seed(spec.seed)
    run_dir = Path(run_dir) if run_dir is not None else None
    inputs = worker_inputs(spec, run_dir, start, "torch")
    engine = TorchEngine(
        spec,
        inputs.data,
        inputs.weights,
        rank=0,
        world=1,
        device=torch.device("cpu"),
        serve=True,
    )
    ps.serve(engine, world, spec.distribution.timeout_s)
    return {}


def check_adopted(device: torch.device, env: DistEnv) -> None:
    """An existing process group must be this rank's, of the world size and the backend the run
    needs (gloo on CPU, nccl on GPU)."""
    want = "nccl" if device.type == "cuda" else "gloo"
    got = (dist.get_rank(), dist.get_world_size(), dist.get_backend())
    if got != (env.rank, env.world, want):
        raise UserError(
            f"the process group that exists already (rank, world size, backend) must be this "
            f"worker's: ({env.rank}, {env.world}, {want}) from RANK, WORLD_SIZE and the device. "
            f"Received: {got}"
        )
    print(
        f"dualtrain: rank {env.rank} of {env.world}: adopting the existing {want} process group "
        f"(its owner, e.g. Ray Train, created it and tears it down)",
        flush=True,
    )


def choose_gloo_interface(
    device: torch.device, rank: int, route: tuple[str, str] | None
) -> str | None:
    """gloo listens on the interface GLOO_SOCKET_IFNAME names; unset, on the address the host name
    resolves to, which is 127.0.0.1 on many machines (multi-host runs then time out connecting to
    their own loopback). Pick the interface that routes to MASTER_ADDR instead
    (dualtrain.launch.netif)."""
    if device.type != "cpu":
        return None
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return os.environ["GLOO_SOCKET_IFNAME"]
    if route is None:
        return None
    name, address = route
    os.environ["GLOO_SOCKET_IFNAME"] = name
    if not address.startswith("127."):
        print(
            f"[torch] rank {rank}: gloo on interface {name} ({address}), the route to MASTER_ADDR "
            f"{os.environ['MASTER_ADDR']} (set GLOO_SOCKET_IFNAME to choose another)",
            flush=True,
        )
    return name


def exchange_peers(rank: int, world: int, address: str | None) -> list[Peer]:
    """Every rank publishes its host name and its address towards rank 0 on the rendezvous store, so
    that a failed collective can name the peer it lost (dualtrain.launch.peers)."""
    if world == 1:
        return []
    store = dist.distributed_c10d._get_default_store()
    address = address or "unknown address"  # no route found: the host name still names it
    store.set(f"dualtrain/peer/{rank}", f"{socket.gethostname()} {address}")
    peers = []
    for r in range(world):
        host, addr = store.get(f"dualtrain/peer/{r}").decode().split(" ", 1)
        peers.append(Peer(rank=r, host=host, address=addr))
    return peers
